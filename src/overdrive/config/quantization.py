"""``BnbQuantizationConfig``: Accelerate's bitsandbytes settings, checked as Accelerate checks them.

overdrive does not quantise through bitsandbytes itself (``load_and_quantize_model`` is refused and points
to transformers' ``BitsAndBytesConfig``), but the settings object is a plain value that libraries build and
validate, so it is kept with Accelerate's fields, defaults and checks.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from overdrive.config.choices import invalid_choice

QUANT_TYPES = ("fp4", "nf4")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _dtype(field: str, value: Any, default: torch.dtype | None) -> torch.dtype | None:
    if value is None:
        return default
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise ValueError(invalid_choice(f"{field}={value!r}", value, [*DTYPES, "a torch.dtype"]))


@dataclass
class BnbQuantizationConfig:
    """bitsandbytes 8-bit or 4-bit quantisation settings (exactly one of ``load_in_8bit`` / ``load_in_4bit``).

    ``BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16")``: strings "fp32", "fp16" and
    "bf16" become torch dtypes; ``target_dtype`` is ``torch.int8`` for 8-bit and ``"int4"`` for 4-bit. Building
    it is supported; quantising with it (``load_and_quantize_model``) is refused.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None

    def __post_init__(self) -> None:
        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.load_in_8bit == self.load_in_4bit:
            state = "both True" if self.load_in_8bit else "both False"
            raise ValueError(f"load_in_8bit and load_in_4bit are {state}: set exactly one of them to True")
        if isinstance(self.llm_int8_threshold, bool) or not isinstance(self.llm_int8_threshold, (int, float)):
            raise ValueError(f"llm_int8_threshold={self.llm_int8_threshold!r} must be a number")
        if self.bnb_4bit_quant_type not in QUANT_TYPES:
            raise ValueError(invalid_choice(f"bnb_4bit_quant_type={self.bnb_4bit_quant_type!r}",
                                            self.bnb_4bit_quant_type, QUANT_TYPES))
        for name in ("skip_modules", "keep_in_fp32_modules"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), list):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a list of module names")
        self.bnb_4bit_compute_dtype = _dtype("bnb_4bit_compute_dtype", self.bnb_4bit_compute_dtype, None)
        if self.load_in_4bit and self.llm_int8_threshold != 6.0:
            warnings.warn("llm_int8_threshold only applies to 8-bit loading (load_in_8bit=True)", stacklevel=2)
        # the dtype of the layers left unquantised: Accelerate's defaults (fp16 for 8-bit, the compute dtype for 4-bit)
        default = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        self.torch_dtype = _dtype("torch_dtype", self.torch_dtype, default)
        self.target_dtype: Any = torch.int8 if self.load_in_8bit else "int4"  # CustomDtype.INT4's value
