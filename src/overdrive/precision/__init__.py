"""Precision as a policy: one small value that each strategy translates into its own form."""

from overdrive.precision.policy import PrecisionPolicy, precision_policy

__all__ = ["PrecisionPolicy", "precision_policy"]
