"""Accelerate's ``is_*_available`` helpers, answered truthfully and without importing the packages.

Packages are looked up with ``importlib.util.find_spec``; devices are asked of torch. These are the
functions behind ``accelerate.utils.imports`` (and ``accelerate.utils``) under the alias.
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import importlib.util
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from overdrive.helpers.environment import parse_flag_from_env


def is_package_available(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (False for a ``None`` entry in
    ``sys.modules``, as tests set one to hide a package)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a module with no spec
        return False


def _version_at_least(distribution: str, minimum: str) -> bool:
    # lazy: packaging.version compiles a large regular expression at import; only a version check needs it
    from packaging.version import Version

    try:
        return Version(metadata.version(distribution)) >= Version(minimum)
    except (metadata.PackageNotFoundError, ValueError):
        return False


def _package_check(name: str, *modules: str) -> Callable[..., bool]:
    def check(*args: Any, **kwargs: Any) -> bool:
        return any(is_package_available(module) for module in modules)

    check.__name__ = check.__qualname__ = name
    check.__doc__ = f"Whether {' or '.join(modules)} is installed (found without importing it)."
    return check


# name -> the importable modules any of which makes it True
PACKAGES: dict[str, tuple[str, ...]] = {
    "is_aim_available": ("aim",), "is_amdsmi_available": ("amdsmi",), "is_boto3_available": ("boto3",),
    "is_clearml_available": ("clearml",), "is_comet_ml_available": ("comet_ml",),
    "is_datasets_available": ("datasets",), "is_deepspeed_available": ("deepspeed",),
    "is_dvclive_available": ("dvclive",), "is_import_timer_available": ("import_timer",),
    "is_lomo_available": ("lomo_optim",), "is_matplotlib_available": ("matplotlib",),
    "is_mlflow_available": ("mlflow",), "is_msamp_available": ("msamp",), "is_pandas_available": ("pandas",),
    "is_peft_available": ("peft",), "is_pynvml_available": ("pynvml",), "is_pytest_available": ("pytest",),
"is_sagemaker_available": ("sagemaker",),
    "is_schedulefree_available": ("schedulefree",), "is_swanlab_available": ("swanlab",),
    "is_tensorboard_available": ("tensorboard", "tensorboardX"), "is_timm_available": ("timm",),
    "is_torchao_available": ("torchao",), "is_torchdata_available": ("torchdata",),
    "is_torchvision_available": ("torchvision",), "is_transformer_engine_available": ("transformer_engine",),
    "is_transformers_available": ("transformers",), "is_triton_available": ("triton",),
    "is_wandb_available": ("wandb",), "is_bnb_available": ("bitsandbytes",), "is_tqdm_available": ("tqdm",),
    "is_torch_xla_available": ("torch_xla",), "is_numpy_available": ("numpy",),
}
globals().update({name: _package_check(name, *modules) for name, modules in PACKAGES.items()})

if TYPE_CHECKING:  # the checks made by globals().update above, named for type checkers
    is_aim_available: Callable[..., bool]
    is_amdsmi_available: Callable[..., bool]
    is_boto3_available: Callable[..., bool]
    is_clearml_available: Callable[..., bool]
    is_comet_ml_available: Callable[..., bool]
    is_datasets_available: Callable[..., bool]
    is_deepspeed_available: Callable[..., bool]
    is_dvclive_available: Callable[..., bool]
    is_import_timer_available: Callable[..., bool]
    is_lomo_available: Callable[..., bool]
    is_matplotlib_available: Callable[..., bool]
    is_mlflow_available: Callable[..., bool]
    is_msamp_available: Callable[..., bool]
    is_pandas_available: Callable[..., bool]
    is_peft_available: Callable[..., bool]
    is_pynvml_available: Callable[..., bool]
    is_pytest_available: Callable[..., bool]
    is_sagemaker_available: Callable[..., bool]
    is_schedulefree_available: Callable[..., bool]
    is_swanlab_available: Callable[..., bool]
    is_tensorboard_available: Callable[..., bool]
    is_timm_available: Callable[..., bool]
    is_torchao_available: Callable[..., bool]
    is_torchdata_available: Callable[..., bool]
    is_torchvision_available: Callable[..., bool]
    is_transformer_engine_available: Callable[..., bool]
    is_transformers_available: Callable[..., bool]
    is_triton_available: Callable[..., bool]
    is_wandb_available: Callable[..., bool]
    is_bnb_available: Callable[..., bool]
    is_tqdm_available: Callable[..., bool]
    is_torch_xla_available: Callable[..., bool]
    is_numpy_available: Callable[..., bool]


def is_rich_available() -> bool:
    """Whether rich is installed and its tracebacks are asked for (ACCELERATE_ENABLE_RICH, as in Accelerate)."""
    return is_package_available("rich") and parse_flag_from_env("ACCELERATE_ENABLE_RICH", False)


def is_trackio_available() -> bool:
    """Whether trackio is installed (it needs Python 3.10+)."""
    return sys.version_info >= (3, 10) and is_package_available("trackio")


def is_megatron_lm_available() -> bool:
    """Whether megatron-core is installed."""
    return is_package_available("megatron") and is_package_available("megatron.core")


def is_4bit_bnb_available() -> bool:
    """Whether bitsandbytes 0.39+ (4-bit) is installed."""
    return is_package_available("bitsandbytes") and _version_at_least("bitsandbytes", "0.39.0")


def is_8bit_bnb_available() -> bool:
    """Whether bitsandbytes 0.37.2+ (8-bit) is installed."""
    return is_package_available("bitsandbytes") and _version_at_least("bitsandbytes", "0.37.2")


def is_bitsandbytes_multi_backend_available() -> bool:
    """Whether bitsandbytes 0.44+ (several back ends) is installed."""
    return is_package_available("bitsandbytes") and _version_at_least("bitsandbytes", "0.44.0")


def is_torchdata_stateful_dataloader_available() -> bool:
    """Whether torchdata's ``StatefulDataLoader`` (torchdata 0.8+) is installed."""
    return is_package_available("torchdata") and is_package_available("torchdata.stateful_dataloader")


def is_cuda_available() -> bool:
    """Whether a CUDA device is present."""
    return torch.cuda.is_available()


def is_rocm_available() -> bool:
    """Whether this is a ROCm build of torch with a device present."""
    return torch.version.hip is not None and torch.cuda.is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    """Whether Apple's MPS device is present."""
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def is_xpu_available(check_device: bool = False) -> bool:
    """Whether an Intel XPU device is present."""
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def _plugin_device(module: str, attribute: str) -> Callable[..., bool]:
    def check(*args: Any, **kwargs: Any) -> bool:
        if not is_package_available(module):
            return False
        device = getattr(torch, attribute, None)
        return bool(device is not None and device.is_available())

    check.__name__ = check.__qualname__ = f"is_{attribute}_available"
    check.__doc__ = f"Whether the {attribute} device (package {module}) is installed and present."
    return check


is_npu_available = _plugin_device("torch_npu", "npu")
is_mlu_available = _plugin_device("torch_mlu", "mlu")
is_musa_available = _plugin_device("torch_musa", "musa")
is_sdaa_available = _plugin_device("torch_sdaa", "sdaa")
is_hpu_available = _plugin_device("habana_frameworks", "hpu")
is_neuron_available = _plugin_device("torch_neuronx", "neuron")


def is_habana_gaudi1() -> bool:
    """Whether this is a first-generation Gaudi (False unless a Gaudi device is present)."""
    if not is_hpu_available():
        return False
    # lazy: optional dependency
    import habana_frameworks.torch.utils.experimental as htexp  # pyright: ignore[reportMissingImports]  # optional, not in the test extra

    return bool(htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi)


def is_xccl_available() -> bool:
    """Whether torch has the XCCL back end (Intel GPUs)."""
    check = getattr(getattr(dist, "distributed_c10d", None), "is_xccl_available", None)
    return bool(check and check())


def is_torch_distributed_available() -> bool:
    """Whether torch.distributed is built in."""
    return dist.is_available()


def is_pippy_available() -> bool:
    """Whether ``torch.distributed.pipelining`` (PyTorch's pipeline parallelism) is present."""
    return is_package_available("torch.distributed.pipelining")


def is_weights_only_available() -> bool:
    """Whether ``torch.load(weights_only=True)`` exists (always, on the PyTorch overdrive needs)."""
    return True


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bf16 compute is available here (CUDA: the device supports it; a CPU always does)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return True


def is_fp16_available() -> bool:
    """Whether fp16 mixed precision can run here (overdrive runs it on every device, CPU included)."""
    return True


def is_fp8_available() -> bool:
    """Whether an fp8 backend overdrive can use (torchao, Transformer Engine or MS-AMP) is installed."""
    return is_package_available("torchao") or is_package_available("transformer_engine") or is_package_available("msamp")


def is_transformer_engine_mxfp8_available() -> bool:
    """Whether Transformer Engine with MXFP8 support is installed and usable."""
    if not is_package_available("transformer_engine"):
        return False
    # lazy: optional dependency
    import transformer_engine.pytorch as te  # pyright: ignore[reportMissingImports]  # optional, not in the test extra

    return bool(getattr(te, "fp8", None) and te.fp8.check_mxfp8_support()[0])


def _required(check: Callable[[], bool], package: str) -> Callable[[Callable], Callable]:
    def decorator(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not check():
                raise ImportError(f"{function.__name__} needs {package}: pip install {package}")
            return function(*args, **kwargs)

        return wrapper

    return decorator


def deepspeed_required(function: Callable) -> Callable:
    """Decorator: the function raises ``ImportError`` naming the package when DeepSpeed is missing."""
    return _required(lambda: is_package_available("deepspeed"), "deepspeed")(function)


def torchao_required(function: Callable) -> Callable:
    """Decorator: the function raises ``ImportError`` naming the package when torchao is missing."""
    return _required(lambda: is_package_available("torchao"), "torchao")(function)


#: the collective back end of each accelerator type that has its own (CPU and MPS use gloo)
TORCH_DISTRIBUTED_BACKENDS = {"cuda": "nccl", "mlu": "cncl", "sdaa": "tccl", "musa": "mccl", "npu": "hccl",
                              "hpu": "hccl", "xpu": "xccl", "neuron": "neuron"}
#: the variable that restricts the visible devices of each accelerator type
DEVICE_VISIBLE_DEVICES_ENV_VARS = {"cuda": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK",
                                   "mlu": "MLU_VISIBLE_DEVICES", "sdaa": "SDAA_VISIBLE_DEVICES",
                                   "musa": "MUSA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES",
                                   "hpu": "HABANA_VISIBLE_MODULES", "neuron": "NEURON_RT_VISIBLE_CORES"}
# device types whose own torch module (torch.cuda, torch.xpu, ...) answers, rather than torch.accelerator
_NATIVE_DEVICE_MODULES = ("cuda", "mps", "mlu", "sdaa", "musa", "npu", "hpu", "xpu", "neuron")


def _current_accelerator() -> torch.device | None:
    try:
        return torch.accelerator.current_accelerator()
    except RuntimeError as error:  # some torch builds raise instead of answering None on a CPU-only machine
        if "none is available" not in str(error):
            raise
        return None


def get_torch_accelerator_backend(check_available: bool = True) -> tuple[str | None, Any]:
    """The accelerator type and the torch module that drives it (``("cuda", torch.cuda)``), or
    ``(None, None)`` on a machine without one. ``check_available=False`` names the type torch was built for
    without probing the device (safe before forking)."""
    device = _current_accelerator()
    if device is not None:
        checks: dict[str, Callable[[], bool]] = {
            "cuda": is_cuda_available, "mps": is_mps_available, "mlu": is_mlu_available, "sdaa": is_sdaa_available,
            "musa": is_musa_available, "npu": is_npu_available, "hpu": is_hpu_available, "xpu": is_xpu_available,
            "neuron": is_neuron_available}
        if not check_available or checks.get(device.type, torch.accelerator.is_available)():
            if device.type in _NATIVE_DEVICE_MODULES:
                return device.type, torch.get_device_module(device.type)
            return device.type, torch.accelerator
    # these register themselves with torch only once their own package is imported
    for kind, check in (("hpu", is_hpu_available), ("neuron", is_neuron_available)):
        if check():
            return kind, getattr(torch, kind)
    return None, None


def get_distributed_backend(device_type: str | None) -> str | None:
    """The default collective back end of ``device_type`` (``"cuda"`` -> ``"nccl"``), or None when the type has
    none of its own (CPU, MPS: gloo is used) or, for XPU, when torch lacks XCCL."""
    if device_type == "xpu" and not is_xccl_available():
        return None
    return TORCH_DISTRIBUTED_BACKENDS.get(device_type) if device_type is not None else None
