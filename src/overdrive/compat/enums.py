"""Accelerate's remaining enums (``accelerate.utils.dataclasses``, ``accelerate.commands.to_fsdp2``) that
overdrive reports but never acts on; each has the bases of Accelerate's enum of the same name."""

from __future__ import annotations

import enum

from overdrive.config.compile import DynamoBackend
from overdrive.config.enums import BaseEnum, EnumWithContains

__all__ = ["BaseEnum", "ComputeEnvironment", "ConversionStatus", "CustomDtype", "DynamoBackend", "EnumWithContains",
           "FP8BackendType", "SageMakerDistributedType"]


class ComputeEnvironment(str, enum.Enum):
    """Where a launch config runs (overdrive launches the local machine kind)."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class SageMakerDistributedType(str, enum.Enum):
    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class FP8BackendType(str, enum.Enum):
    """The fp8 back ends Accelerate names (``AO``: torchao, what overdrive uses; ``TE``: NVIDIA's)."""

    NO = "NO"
    TE = "TE"
    AO = "AO"


class CustomDtype(enum.Enum):
    """Dtypes torch has no name for, used in big-model memory estimates."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


class ConversionStatus(enum.Enum):
    """What ``to-fsdp2`` does with an FSDP1 key that has no FSDP2 counterpart."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1
