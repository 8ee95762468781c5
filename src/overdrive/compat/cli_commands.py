"""Accelerate's other command modules (``accelerate.commands.{env,test,estimate,to_fsdp2,tpu}`` and
``accelerate.commands.config.config_args``) over overdrive's commands: the parser factories and command
functions Accelerate's tests and libraries call, each running the ``overdrive`` command of the same name.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from overdrive.big_model.estimate import MemoryRow, create_empty_model, estimate_memory, format_table
from overdrive.cli import UsageError, test_cmd, tpu_cmd
from overdrive.cli.env_cmd import report
from overdrive.cli.to_fsdp2_cmd import convert
from overdrive.launchers.config_file import decode_text, load_yaml


def _sub_parser(module: str, name: str, subparsers: Any = None) -> argparse.ArgumentParser:
    """``overdrive <name>``'s own parser (registered on ``subparsers`` when given)."""
    if subparsers is not None:
        importlib.import_module(module).add_parser(subparsers)
        return subparsers.choices[name]
    holder = argparse.ArgumentParser(prog="accelerate")
    sub = holder.add_subparsers()
    importlib.import_module(module).add_parser(sub)
    return sub.choices[name]


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's ``env_command_parser``: ``overdrive env``'s flags."""
    return _sub_parser("overdrive.cli.env_cmd", "env", subparsers)


def _module(name: str) -> Any:
    """``accelerate.commands.<name>`` as served (tests patch names there, e.g. ``which``, ``verify_on_hub``)."""
    return importlib.import_module(f"overdrive.commands.{name}")


def env_command(args: argparse.Namespace) -> dict[str, str]:
    """Accelerate's ``env_command``: print the environment report and return it as ``{field: value}``,
    with Accelerate's ``"`accelerate` bash location"`` field (the ``accelerate`` command on PATH)."""
    text = report(getattr(args, "config_file", None))
    print(text)
    info = {"`accelerate` bash location": _module("env").which("accelerate") or "Not found"}
    for line in text.splitlines():
        if line.startswith("- ") and ": " in line:
            key, value = line[2:].split(": ", 1)
            info[key] = value
    return info


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's ``test_command_parser``: ``overdrive test``'s flags."""
    return _sub_parser("overdrive.cli.test_cmd", "test", subparsers)


def test_command(args: argparse.Namespace) -> None:
    """Accelerate's ``test_command``: train the built-in tiny model with the config; ``RuntimeError`` if the
    machine cannot."""
    code = test_cmd.run(args)
    if code:
        raise RuntimeError(f"'overdrive test' failed with exit status {code}: see the errors above")


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's ``estimate_command_parser``: ``overdrive estimate-memory``'s flags."""
    return _sub_parser("overdrive.cli.estimate_cmd", "estimate-memory", subparsers)


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """Accelerate's ``gather_data``: ``[dtype, largest layer bytes, total bytes, Adam training bytes]`` per
    dtype of ``args.dtypes``. A model that cannot be found raises ``OSError``, as Accelerate's does."""
    found = _module("estimate").verify_on_hub(args.model_name, getattr(args, "access_token", None))
    if found == "gated":
        raise OSError(f"Repo for model `{args.model_name}` is gated: accept its terms on the Hub, log in, and make "
                      "sure it is in the local cache (overdrive reads configs offline)")
    try:
        model = create_empty_model(args.model_name, args.library_name, args.trust_remote_code)
    except ValueError as err:
        raise OSError(str(err)) from None
    return [[row.dtype, row.largest_layer, row.total_size, row.training_adam]
            for row in estimate_memory(model, args.dtypes)]


def estimate_command(args: argparse.Namespace) -> list[list[Any]]:
    """Accelerate's ``estimate_command``: print the memory table and return its rows (``gather_data``)."""
    rows = gather_data(args)
    print(format_table(args.model_name, [MemoryRow(d, largest, total, train, []) for d, largest, total, train in rows]))
    return rows


def verify_on_hub(repo: str, token: str | None = None) -> str | bool:
    """Whether ``repo`` can be read: True for a local folder or file, else ``"repo"`` or ``"gated"`` as
    Accelerate answers (overdrive looks in the local Hugging Face cache only: it never downloads)."""
    if Path(repo).exists():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache  # lazy: optional dependency

        return True if isinstance(try_to_load_from_cache(repo, "config.json"), str) else "repo"
    except (ImportError, ValueError):
        return "repo"


def add_timm_hub_prefix(model_name: str) -> str:
    """A hub repo id (``org/name``) as timm reads it (``hf-hub:org/name``); registry names and names with a
    source prefix unchanged."""
    return f"hf-hub:{model_name}" if "/" in model_name and ":" not in model_name else model_name


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's ``to_fsdp2_command_parser``: ``overdrive to-fsdp2``'s flags."""
    return _sub_parser("overdrive.cli.to_fsdp2_cmd", "to-fsdp2", subparsers)


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """Accelerate's ``convert_config_to_fsdp2``: ``config`` with its ``fsdp_config`` in FSDP2 form (FSDP1-only
    keys dropped, the sharding strategy as ``fsdp_reshard_after_forward``, ``fsdp_version: 2``)."""
    return convert(config)[0]


def load_config(config_file: str) -> dict[str, Any]:
    """Accelerate's ``to_fsdp2.load_config``: the config file as a mapping (a key given twice keeps its last
    value, with a warning); an empty file is ``ValueError``."""
    path = Path(config_file)
    repeated: list[str] = []
    config = load_yaml(decode_text(path.read_bytes(), path), repeated)
    for problem in repeated:
        warnings.warn(f"config file {path}: {problem}; the last value is used", stacklevel=2)
    if not config:
        raise ValueError("Config file is empty")
    return config


def to_fsdp2_command(args: argparse.Namespace) -> None:
    """Accelerate's ``to_fsdp2_command``: rewrite the config file. A missing file is ``FileNotFoundError``, a
    missing ``--output_file`` without ``--overwrite`` ``ValueError``, an existing output ``FileExistsError``.
    The file is read through ``accelerate.commands.to_fsdp2.load_config`` (tests patch it there); what the
    conversion drops or changes is logged as warnings, as Accelerate's does."""

    if not Path(args.config_file).exists():
        raise FileNotFoundError(f"Config file `{args.config_file}` not found")
    output = getattr(args, "output_file", None)
    if not getattr(args, "overwrite", False):
        if output is None:
            raise ValueError("If --overwrite is not set, --output_file must be provided")
        if Path(output).exists():
            raise FileExistsError(f"Output file `{output}` already exists and --overwrite is not set")
    config = _module("to_fsdp2").load_config(args.config_file)
    converted, notes = convert(config)
    log = logging.getLogger("accelerate.commands.to_fsdp2")
    for note in notes:
        if note.startswith("fsdp_config already says fsdp_version: 2"):
            log.warning("Config already specifies FSDP2, skipping conversion... (%s)", note)
        elif note.startswith("the file has no fsdp_config"):
            log.info(note)
        else:
            log.warning(note)
    Path(output or args.config_file).write_text(yaml.safe_dump(converted, sort_keys=True))


def tpu_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's ``tpu_command_parser``: ``overdrive tpu-config``'s flags."""
    return _sub_parser("overdrive.cli.tpu_cmd", "tpu-config", subparsers)


def tpu_command_launcher(args: argparse.Namespace) -> None:
    """Accelerate's ``tpu_command_launcher``: print the ``gcloud`` command that sets up the pod (``Running ...``,
    Accelerate's ``--debug`` line); it is not run. Missing commands or a bad version raise ``ValueError``."""
    try:
        tpu_cmd.run(args)
    except UsageError as err:
        raise ValueError(str(err)) from None


@dataclass
class BaseConfig:
    """Accelerate's launch-config record (``accelerate.commands.config.config_args.BaseConfig``): the keys every
    config file has. ``to_dict`` / ``to_yaml_file`` write it as the YAML ``overdrive launch`` reads."""

    compute_environment: str
    distributed_type: str
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def to_dict(self) -> dict[str, Any]:
        """The fields as a config-file mapping (enums as their values)."""
        return {k: getattr(v, "value", v) for k, v in vars(self).items()}

    def to_yaml_file(self, yaml_file: str) -> None:
        """Write the config as YAML."""
        Path(yaml_file).write_text(yaml.safe_dump(self.to_dict()))


@dataclass
class ClusterConfig(BaseConfig):
    """Accelerate's local-machine config record (processes, machines, plugin sections)."""

    num_processes: int = -1
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict = field(default_factory=dict)
    deepspeed_config: dict = field(default_factory=dict)
    fsdp_config: dict = field(default_factory=dict)
    parallelism_config: dict = field(default_factory=dict)
    megatron_lm_config: dict = field(default_factory=dict)
    ipex_config: dict = field(default_factory=dict)
    mpirun_config: dict = field(default_factory=dict)
    downcast_bf16: bool = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict = field(default_factory=dict)


@dataclass
class SageMakerConfig(BaseConfig):
    """Accelerate's SageMaker config record (kept for reading such files; SageMaker launches are refused)."""

    ec2_instance_type: str = ""
    iam_role_name: str = ""
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = ""
    transformers_version: str = ""
    py_version: str = ""
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict | None = None
    dynamo_config: dict | None = None
    enable_cpu_affinity: bool = False


def config_record(data: dict[str, Any]) -> BaseConfig:
    """A checked launch config (``launchers.config_file.load_config``) as Accelerate's record: ``SageMakerConfig``
    for ``compute_environment: AMAZON_SAGEMAKER``, else ``ClusterConfig``. Keys of overdrive's schema that the
    record has no field for are kept as attributes."""
    values = dict(data)
    sagemaker = str(values.get("compute_environment") or "LOCAL_MACHINE").upper() == "AMAZON_SAGEMAKER"
    kind: type[BaseConfig] = SageMakerConfig if sagemaker else ClusterConfig
    values.setdefault("compute_environment", "LOCAL_MACHINE")
    values.setdefault("distributed_type", "NO")
    if values["distributed_type"] == "NO":
        values.setdefault("num_processes", 1)
    values.setdefault("mixed_precision", None)
    values.setdefault("use_cpu", False)
    values.setdefault("debug", False)
    names = {f.name for f in dataclasses.fields(kind)}
    record = kind(**{k: v for k, v in values.items() if k in names})
    for key, value in values.items():
        if key not in names:
            setattr(record, key, value)
    return record
