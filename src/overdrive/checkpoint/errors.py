"""The one error type of checkpointing."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read: the message names the folder or file and the problem.

    Raised on every process alike when the problem was found on one of them.
    """
