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

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the one list of backend names (and modes); re-exported here for the CLI, which checks flags against them
from overdrive.config.choices import invalid_choice, nearest
from overdrive.config.compile import DYNAMO_BACKENDS, DYNAMO_MODES

CONFIG_FILE_VAR = "OVERDRIVE_CONFIG_FILE"
DEFAULT_NAME = "default_config.yaml"

MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")
DISTRIBUTED_TYPES = (
    "NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
    "MULTI_HPU", "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM", "TPU",
)
COMPUTE_ENVIRONMENTS = ("LOCAL_MACHINE", "AMAZON_SAGEMAKER")
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")



class ConfigError(ValueError):
    """A config file that cannot be used; ``problems`` lists every reason, ``path`` names the file."""

    def __init__(self, path: str | os.PathLike | None, problems: list[str]) -> None:
        self.path = str(path) if path is not None else None
        self.problems = problems
        where = f"config file {self.path}" if self.path else "config"
        if len(problems) == 1:
            super().__init__(f"{where}: {problems[0]}")
        else:
            super().__init__(f"{where} has {len(problems)} problems:\n  - " + "\n  - ".join(problems))


# -- the schema: one checker per key ---------------------------------------------------------------------
Checker = Callable[[str, Any], tuple[Any, str | None]]


def _bool(key: str, value: Any) -> tuple[Any, str | None]:
    if isinstance(value, bool):
        return value, None
    text = str(value).strip().lower()
    if text in ("yes", "true", "1"):
        return True, None
    if text in ("no", "false", "0"):
        return False, None
    return value, f"{key}: {value!r} is not a boolean; use true or false"


def _int(minimum: int | None = None, allow: tuple[Any, ...] = ()) -> Checker:
    def check(key: str, value: Any) -> tuple[Any, str | None]:
        if value in allow:
            return value, None
        try:
            number = int(str(value).strip()) if not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None:
            return value, f"{key}: {value!r} is not an integer"
        if minimum is not None and number < minimum:
            return value, f"{key}: {number} must be {minimum} or more"
        return number, None
    return check


def _float(key: str, value: Any) -> tuple[Any, str | None]:
    try:
        return float(value), None
    except (TypeError, ValueError):
        return value, f"{key}: {value!r} is not a number"


def _choice(choices: tuple[str, ...], upper: bool = False) -> Checker:
    def check(key: str, value: Any) -> tuple[Any, str | None]:
        text = str(value).strip()
        text = text.upper() if upper else text.lower()
        if text in choices:
            return text, None
        return value, invalid_choice(f"{key}: {value!r}", value, choices)
    return check


def _text(key: str, value: Any) -> tuple[Any, str | None]:
    if value is None or isinstance(value, (str, int, float)):
        return (None if value is None else str(value)), None
    return value, f"{key}: {value!r} should be a string"


def _gpu_ids(key: str, value: Any) -> tuple[Any, str | None]:
    text = str(value).strip().replace(" ", "")
    if text.lower() == "all" or all(part.isdigit() for part in text.split(",")):
        return text.lower() if text.lower() == "all" else text, None
    return value, f"{key}: {value!r} is not valid; give 'all' or a comma-separated list of device ids like '0,1'"


def _anything(key: str, value: Any) -> tuple[Any, str | None]:
    return value, None


def _mapping(key: str, value: Any) -> tuple[Any, str | None]:
    if value is None:
        return {}, None
    if isinstance(value, Mapping):
        return dict(value), None
    return value, f"{key}: {value!r} should be a mapping of keys to values"


def _list(key: str, value: Any) -> tuple[Any, str | None]:
    if value is None or isinstance(value, list):
        return value, None
    return value, f"{key}: {value!r} should be a list"


DYNAMO_KEYS: dict[str, Checker] = {
    "dynamo_backend": _choice(tuple(b.upper() for b in DYNAMO_BACKENDS), upper=True),
    "dynamo_mode": _choice(DYNAMO_MODES),
    "dynamo_use_fullgraph": _bool,
    "dynamo_use_dynamic": _bool,
    "dynamo_use_regional_compilation": _bool,
}


def _dynamo(key: str, value: Any) -> tuple[Any, str | None]:
    value, problem = _mapping(key, value)
    if problem:
        return value, problem
    problems = []
    for name, item in list(value.items()):
        checker = DYNAMO_KEYS.get(name)
        if checker is None:
            problems.append(f"{key}: unknown key {name!r}{nearest(name, list(DYNAMO_KEYS))}")
            continue
        value[name], problem = checker(f"{key}.{name}", item)
        if problem:
            problems.append(problem)
    return value, "; ".join(problems) or None


def _section(name: str) -> Checker:
    """A plugin section (``deepspeed_config`` / ``fsdp_config``): a mapping of Accelerate's keys."""
    def check(key: str, value: Any) -> tuple[Any, str | None]:
        value, problem = _mapping(key, value)
        if problem:
            return value, problem
        from overdrive import config as plugins

        if name == "deepspeed_config":
            from overdrive.config.deepspeed_json import CONFIG_KEYS

            known = [*CONFIG_KEYS, *plugins.field_names(plugins.DeepSpeedPlugin)]
        else:
            known = [*plugins.FSDP_CONFIG_KEYS, *plugins.field_names(plugins.FullyShardedDataParallelPlugin)]
        unknown = [f"{key}: unknown key {k!r}{nearest(str(k), list(known))}" for k in value if k not in known]
        return value, "; ".join(unknown) or None
    return check


#: Every key Accelerate writes (local machine, TPU, SageMaker, plugin sections) and its checker.
KEYS: dict[str, Checker] = {
    "compute_environment": _choice(COMPUTE_ENVIRONMENTS, upper=True),
    "distributed_type": _choice(DISTRIBUTED_TYPES, upper=True),
    "mixed_precision": _choice(MIXED_PRECISION),
    "use_cpu": _bool,
    "debug": _bool,
    "num_processes": _int(minimum=1, allow=(-1,)),
    "num_machines": _int(minimum=1),
    "machine_rank": _int(minimum=0),
    "gpu_ids": _gpu_ids,
    "main_process_ip": _text,
    "main_process_port": _int(minimum=0, allow=(None,)),
    "rdzv_backend": _choice(RDZV_BACKENDS),
    "same_network": _bool,
    "main_training_function": _text,
    "enable_cpu_affinity": _bool,
    "downcast_bf16": _bool,
    "dynamo_config": _dynamo,
    "deepspeed_config": _section("deepspeed_config"),
    "fsdp_config": _section("fsdp_config"),
    "megatron_lm_config": _mapping,
    "ipex_config": _mapping,
    "mpirun_config": _mapping,
    "fp8_config": _mapping,
    "parallelism_config": _mapping,
    "tpu_name": _text,
    "tpu_zone": _text,
    "tpu_use_cluster": _bool,
    "tpu_use_sudo": _bool,
    "tpu_vm": _list,
    "tpu_env": _list,
    "command_file": _text,
    "commands": _list,
    "ec2_instance_type": _text,
    "iam_role_name": _text,
    "image_uri": _text,
    "profile": _text,
    "region": _text,
    "base_job_name": _text,
    "pytorch_version": _text,
    "transformers_version": _text,
    "py_version": _text,
    "sagemaker_inputs_file": _text,
    "sagemaker_metrics_file": _text,
    "additional_args": _anything,
    # overdrive's own keys: launch flags a file may also set
    "gradient_accumulation_steps": _int(minimum=1),
    "num_cpu_threads_per_process": _int(minimum=1),
    "max_restarts": _int(minimum=0),
    "rdzv_conf": _text,
}

#: Keys from older Accelerate versions, read and rewritten as today's keys.
LEGACY_KEYS = ("fp16", "dynamo_backend")


def _upgrade(raw: dict[str, Any]) -> dict[str, Any]:
    config = dict(raw)
    if "fp16" in config:
        fp16 = config.pop("fp16")
        config.setdefault("mixed_precision", "fp16" if _bool("fp16", fp16)[0] is True else "no")
    if "dynamo_backend" in config:
        backend = config.pop("dynamo_backend")
        dynamo = dict(config.get("dynamo_config") or {})
        dynamo.setdefault("dynamo_backend", backend)
        config["dynamo_config"] = dynamo
    return config


def validate_config(raw: Mapping[str, Any], path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Check every key and value of a config mapping; return it normalised or raise ``ConfigError``."""
    config = _upgrade(dict(raw))
    problems = []
    for key in sorted(config, key=str):
        checker = KEYS.get(str(key))
        if checker is None:
            problems.append(f"unknown key {key!r}{nearest(str(key), list(KEYS))}")
            continue
        config[key], problem = checker(str(key), config[key])
        if problem:
            problems.append(problem)
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
    try:
        if path.suffix == ".json":
            raw = json.loads(text, object_pairs_hook=_unique_json_keys) if text.strip() else {}
        else:
            raw = load_yaml(text)
    except ConfigError:
        raise
    except ValueError as exc:  # json.JSONDecodeError, or a key given twice
        raise ConfigError(path, [f"is not valid JSON: {exc}"]) from None
    except Exception as exc:  # yaml.YAMLError: says where
        raise ConfigError(path, [f"is not valid YAML: {exc}"]) from None
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
        import yaml

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


def _unique_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice in one object; keep one")
        seen[key] = value
    return seen


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, refusing a key given twice in one mapping and documents whose aliases expand
    to more than ``MAX_YAML_VALUES`` values (both checked on the node graph, before anything is built)."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_nodes(root: Any) -> None:
    import yaml

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
                        raise yaml.YAMLError(f"the key {key.value!r} appears twice in one mapping (lines "
                                             f"{seen[key.value] + 1} and {key.start_mark.line + 1}); keep one")
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
        return f"{self.path} ({self.reason})" if self.path else self.reason


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
