"""Accelerate's remaining enums (``accelerate.utils.dataclasses``) that overdrive reports but never acts on."""

from __future__ import annotations

from overdrive.config.compile import DynamoBackend
from overdrive.config.enums import _StrEnum

__all__ = ["ComputeEnvironment", "CustomDtype", "DynamoBackend", "SageMakerDistributedType"]


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
