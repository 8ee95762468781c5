"""Compat path: the Megatron-LM bridge lives in ``overdrive.strategies.megatron``."""

from overdrive.strategies.megatron import initialize_model_parallel

__all__ = ["initialize_model_parallel"]
