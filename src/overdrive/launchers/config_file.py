"""The launch config file: Accelerate's ``default_config.yaml`` keys, read, checked and written.

A file written by ``accelerate config`` works as it is. Every problem in a file is reported at once,
each naming the key, the value, the file, and the nearest valid key or value::

    config = load_config("~/.cache/overdrive/default_config.yaml")
    config["num_processes"]   # -> 2

Where the file lives when none is named: ``$OVERDRIVE_CONFIG_FILE``, else
``$HF_HOME/overdrive/default_config.yaml``, else ``~/.cache/overdrive/default_config.yaml``; when
none of those exists, Accelerate's own default file is read (``$HF_HOME/accelerate/default_config.yaml``).
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overdrive import config as plugins
from overdrive.config.choices import nearest
from overdrive.launchers.setting_kinds import Bool
from overdrive.launchers.settings import SECTIONS, Setting, by_yaml_key

CONFIG_FILE_VAR = "OVERDRIVE_CONFIG_FILE"
DEFAULT_NAME = "default_config.yaml"


class ConfigError(ValueError):
    """A config file that cannot be used; ``problems`` lists every reason, ``path`` names the file."""

    def __init__(self, path: str | os.PathLike | None, problems: list[str]) -> None:
        self.path = str(path) if path is not None else None
        self.problems = problems
        where = f"config file {shown_path(self.path)}" if self.path else "config"
        if len(problems) == 1:
            super().__init__(f"{where}: {problems[0]}")
        else:
            super().__init__(f"{where} has {len(problems)} problems:\n  - " + "\n  - ".join(problems))


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as its bytes read: a name that is not UTF-8 shows its bytes as ``\\xe9`` escapes, not as
    Python's internal surrogates (``\\udce9``) nor as replacement characters."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


# -- checking a mapping against the launch-settings schema (launchers/settings.py) ----------------------
#: the keys ``deepspeed_config`` may hold besides the schema's: Accelerate's names and ``DeepSpeedPlugin``'s
#: fields. The plugin is its strategy's, above this layer, so they are written out here;
#: tests/strategies/deepspeed/test_config.py checks they are the plugin's (its ``CONFIG_KEYS`` and fields).
DEEPSPEED_KEYS = (
    "zero_stage", "offload_optimizer_device", "offload_param_device", "offload_optimizer_nvme_path",
    "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping", "zero3_init_flag",
    "zero3_save_16bit_model", "deepspeed_config_file", "deepspeed_moe_layer_cls_names",
    "deepspeed_multinode_launcher", "deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
    "hf_ds_config", "is_train_batch_min", "transformer_moe_cls_names", "enable_msamp", "msamp_opt_level",
    "deepspeed_config", "selected",
)


def _plugin_keys(section: str) -> list[str]:
    """The keys a plugin section may hold besides the schema's: the plugin's fields and Accelerate's names."""
    if section == "deepspeed_config":
        return list(DEEPSPEED_KEYS)
    return [*plugins.FSDP_CONFIG_KEYS, *plugins.field_names(plugins.FullyShardedDataParallelPlugin)]


def _check_section(section: str, value: dict[str, Any], keys: dict[str, Setting], problems: list[str]) -> None:
    known = [k.split(".", 1)[1] for k in keys if k.startswith(section + ".")]
    rule = SECTIONS.get(section, "open")
    others = _plugin_keys(section) if rule == "plugin" else []
    for name, item in list(value.items()):
        setting = keys.get(f"{section}.{name}")
        if setting is not None:
            value[name], problem = setting.check(f"{section}.{name}", item)
            if problem:
                problems.append(problem)
        elif rule != "open" and name not in others:
            problems.append(f"{section}: unknown key {name!r}{nearest(str(name), known + others)}")


#: Keys from older Accelerate versions, read and rewritten as today's keys.
LEGACY_KEYS = ("fp16", "dynamo_backend")


def _upgrade(raw: dict[str, Any]) -> dict[str, Any]:
    config = dict(raw)
    if "fp16" in config:
        fp16 = config.pop("fp16")
        config.setdefault("mixed_precision", "fp16" if Bool().check("fp16", fp16)[0] is True else "no")
    if "dynamo_backend" in config:
        backend = config.pop("dynamo_backend")
        dynamo = dict(config.get("dynamo_config") or {})
        dynamo.setdefault("dynamo_backend", backend)
        config["dynamo_config"] = dynamo
    if config.get("distributed_type") is False:  # an unquoted NO, which YAML 1.1 reads as false
        config["distributed_type"] = "NO"
    return config


def validate_config(raw: Mapping[str, Any], path: str | os.PathLike | None = None,
                    settings: Sequence[Setting] | None = None) -> dict[str, Any]:
    """Check every key and value of a config mapping against the launch settings (``settings``); return it
    normalised or raise ``ConfigError`` listing every problem."""
    config = _upgrade(dict(raw))
    keys = by_yaml_key(settings)
    problems: list[str] = []
    for key in sorted(config, key=str):
        setting = keys.get(str(key))
        if setting is None:
            problems.append(f"unknown key {key!r}{nearest(str(key), [k for k in keys if '.' not in k])}")
            continue
        config[key], problem = setting.check(str(key), config[key])
        if problem:
            problems.append(problem)
        elif str(key) in SECTIONS:
            _check_section(str(key), config[key], keys, problems)
    if problems:
        raise ConfigError(path, problems)
    return config


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML (or JSON) config file and check it (see ``validate_config``)."""
    path = Path(path).expanduser()
    try:
        if path.is_dir():
            raise ConfigError(path, ["is a folder, not a config file"])
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(path, [f"is {path.stat().st_size:,} bytes; a config file is a few hundred (is it the "
                                     "right file?)"])
        text = decode_text(path.read_bytes(), path)
    except FileNotFoundError:
        raise ConfigError(path, ["the file does not exist"]) from None
    except OSError as exc:
        raise ConfigError(path, [f"cannot be read ({exc.strerror})"]) from None
    repeated: list[str] = []
    try:
        if path.suffix == ".json":
            hook = functools.partial(_last_json_key_wins, repeated=repeated)
            raw = json.loads(text, object_pairs_hook=hook) if text.strip() else {}
        else:
            raw = load_yaml(text, repeated)
    except ConfigError:
        raise
    except ValueError as exc:  # json.JSONDecodeError
        raise ConfigError(path, [f"is not valid JSON: {exc}"]) from None
    except Exception as exc:  # yaml.YAMLError: says where
        raise ConfigError(path, [f"is not valid YAML: {exc}"]) from None
    for problem in repeated:  # Accelerate reads such files, the last value winning: so does overdrive, saying so
        warnings.warn(f"config file {path}: {problem}; the last value is used, as Accelerate does: keep one",
                      stacklevel=2)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(path, [f"should hold a mapping of keys to values, not {type(raw).__name__}"])
    return validate_config(raw, path)


def save_config(config: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``config`` (checked first) as YAML, or JSON when the name ends in ``.json``."""
    path = Path(path).expanduser()
    data = validate_config(config, path)
    if path.suffix == ".json":
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    else:
        import yaml  # lazy: PyYAML loads only when a YAML file is read or written

        text = yaml.safe_dump(data, sort_keys=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        hint = " (it is a folder)" if path.is_dir() else ""
        raise ConfigError(path, [f"cannot be written: {why}{hint}; choose a path you can write with --config_file"]) \
            from None
    return path


# -- reading text safely ---------------------------------------------------------------------------------
MAX_CONFIG_BYTES = 1 << 20
#: A YAML document may share nodes through aliases; expanded, a few lines can stand for billions of values
#: (an "alias bomb"). Real configs have a few hundred values: more than this is refused before building it.
MAX_YAML_VALUES = 100_000
_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
         (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def decode_text(data: bytes, path: Path) -> str:
    """The text of a config file: UTF-8, or UTF-16/32 with a byte-order mark (as YAML allows); else a
    ``ConfigError`` that says where the first bad byte is."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError:
                break
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, [f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start} cannot be "
                                 "decoded): a config file must be YAML or JSON saved as UTF-8"]) from None


def _last_json_key_wins(pairs: list[tuple[str, Any]], repeated: list[str]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            repeated.append(f"the key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def load_yaml(text: str, repeated: list[str] | None = None) -> Any:
    """``yaml.safe_load`` (a key given twice in one mapping keeps its last value, as in PyYAML), refusing
    documents whose aliases expand to more than ``MAX_YAML_VALUES`` values (checked on the node graph,
    before anything is built). Each repeated key is described in ``repeated``, with its lines."""
    import yaml  # lazy: PyYAML loads only when a YAML file is read or written

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, repeated if repeated is not None else [])
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_nodes(root: Any, repeated: list[str]) -> None:
    import yaml  # lazy: as in _load (already loaded by then)

    sizes: dict[int, int] = {}

    def size(node: Any) -> int:  # values the node stands for once aliases are expanded (memoized: linear)
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in seen:
                        repeated.append(f"the key {key.value!r} appears twice in one mapping (lines "
                                        f"{seen[key.value] + 1} and {key.start_mark.line + 1})")
                    seen[key.value] = key.start_mark.line
                total += size(key) + size(value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        total = min(total, MAX_YAML_VALUES + 1)
        sizes[id(node)] = total
        return total

    if size(root) > MAX_YAML_VALUES:
        raise yaml.YAMLError(f"its aliases expand to more than {MAX_YAML_VALUES:,} values (a YAML alias bomb?); a "
                             "config file needs no more than a few hundred")


# -- where the file lives --------------------------------------------------------------------------------
def _hf_home() -> Path:
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(cache, "huggingface").expanduser()


def default_config_path() -> Path:
    """Where ``overdrive config`` writes and ``overdrive launch`` looks when no file is named."""
    if os.environ.get(CONFIG_FILE_VAR):
        return Path(os.environ[CONFIG_FILE_VAR]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"], "overdrive", DEFAULT_NAME).expanduser()
    return Path("~", ".cache", "overdrive", DEFAULT_NAME).expanduser()


def accelerate_config_path() -> Path:
    """Accelerate's own default file, read when overdrive has none of its own."""
    return _hf_home() / "accelerate" / DEFAULT_NAME


@dataclass(frozen=True)
class ConfigSource:
    """The file a command reads (``path`` None when there is none) and how it was chosen."""

    path: Path | None
    reason: str

    def describe(self) -> str:
        """Where the config came from, for messages."""
        return f"{shown_path(self.path)} ({self.reason})" if self.path else self.reason


def find_config(explicit: str | os.PathLike | None = None) -> ConfigSource:
    """The config file to read: the one named, else the default one, else Accelerate's, else none."""
    if explicit:
        return ConfigSource(Path(explicit).expanduser(), "--config_file")
    default = default_config_path()
    if default.is_file():
        reason = f"${CONFIG_FILE_VAR}" if os.environ.get(CONFIG_FILE_VAR) else "default location"
        return ConfigSource(default, reason)
    accelerate = accelerate_config_path()
    if accelerate.is_file() and not os.environ.get(CONFIG_FILE_VAR):
        return ConfigSource(accelerate, "Accelerate's default location")
    return ConfigSource(None, f"no config file (none at {default})")


def basic_config(mixed_precision: str = "no", num_processes: int | None = None, cpu: bool | None = None,
                 device_count: int = 0, device_type: str = "cpu") -> dict[str, Any]:
    """The file ``overdrive config default`` writes: one machine, every local device (Accelerate's keys)."""
    use_cpu = device_count == 0 if cpu is None else cpu
    if num_processes is None:
        num_processes = 1 if use_cpu else max(device_count, 1)
    if num_processes <= 1:
        distributed_type = "NO"
    elif use_cpu:
        distributed_type = "MULTI_CPU"
    else:
        distributed_type = "MULTI_GPU" if device_type == "cuda" else f"MULTI_{device_type.upper()}"
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": distributed_type,
        "downcast_bf16": False,
        "enable_cpu_affinity": False,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mixed_precision,
        "num_machines": 1,
        "num_processes": num_processes,
        "rdzv_backend": "static",
        "same_network": False,
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": use_cpu,
    }
    if not use_cpu:
        config["gpu_ids"] = "all"
    return config


def updated_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """An existing config with legacy keys rewritten and every current key present (its values kept)."""
    current = validate_config(config)
    use_cpu = bool(current.get("use_cpu", False))
    template = basic_config(current.get("mixed_precision", "no"), cpu=use_cpu, device_count=0 if use_cpu else 1)
    template.pop("gpu_ids", None)
    return {**template, **current}
