"""Accelerate's remaining enums (``accelerate.utils.dataclasses``) that overdrive reports but never acts on."""

from __future__ import annotations

import enum


class _StrEnum(str, enum.Enum):
    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [member.value for member in cls]


class ComputeEnvironment(_StrEnum):
    """Where a launch config runs (overdrive launches the local machine kind)."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class SageMakerDistributedType(_StrEnum):
    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class CustomDtype(_StrEnum):
    """Dtypes torch has no name for, used in big-model memory estimates."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


class DynamoBackend(_StrEnum):
    """``torch.compile`` backends by Accelerate's upper-case names (``DynamoBackend.INDUCTOR``)."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
