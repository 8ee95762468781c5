"""Every use of torch's private API in overdrive, each with why, and the public API it falls back on.

Private names move between torch releases without notice: keeping them here leaves one module to check when
torch changes. An entry whose private name is missing in the installed torch uses the public fallback named
beside it; "no public form" marks the few that have none (the caller then does without, as its docstring says).
This module imports only torch's always-loaded modules; each entry in a subsystem (DCP, pipelining, context
parallel, dynamo) is imported when first called, as its callers are.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

try:  # the public pytree module, where the installed torch has one
    from torch.utils import pytree as _pytree  # pyright: ignore[reportAttributeAccessIssue]
except ImportError:  # why: torch's tree helpers (flatten, map over nested args) are private before it
    from torch.utils import _pytree

tree_flatten: Callable[..., Any] = _pytree.tree_flatten
tree_leaves: Callable[..., Any] = _pytree.tree_leaves
tree_map: Callable[..., Any] = _pytree.tree_map

#: why: the logger of DTensor's redistribution, to quiet a warning the user cannot act on; a name, not an import
REDISTRIBUTE_LOGGER = "torch.distributed.tensor._redistribute"


def autocast_hooks(device_type: str, dtype: torch.dtype, cache_enabled: bool | None, switch: Any,
                   finish: Callable[[Any], Any]) -> tuple[Callable[..., None], Callable[..., Any]]:
    """A forward pre-hook and a forward hook (register it with ``always_call=True``) that run a module's forward
    in an autocast region while ``switch.active`` is true; the forward hook returns ``finish(output)``
    (a plain tensor in fp16 / bf16 is cast to fp32 without calling it).

    The region is opened and closed with ``torch.autocast.__enter__`` / ``__exit__``'s own steps, as public C
    calls, rather than by entering a ``torch.autocast`` object, for two reasons. Under ``torch.compile`` of the
    prepared model dynamo traces these hooks, and an autocast object entered in one hook and left in the other
    fails at its exit (``tests/precision/test_amp_hooks.py``). And bench/step_calls.py's bf16 loop counts 4
    more Python calls a forward with the object (its ``__enter__`` / ``__exit__`` and their ``is_scripting``),
    over the target of +10 calls a micro-batch. Why private: ``_enabled`` / ``_cache_enabled`` are the settings
    torch settled for the region (support checks), and under a torch-function mode (``torch.export``) the
    region must be an object, which ``torch._C._is_torch_function_mode_enabled`` tells. Public fallback, where
    these names are missing: the settings as asked, and no export branch."""
    mode_enabled: Callable[[], bool] = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)
    kwargs: dict[str, Any] = {"device_type": device_type, "dtype": dtype}
    if cache_enabled is not None:
        kwargs["cache_enabled"] = cache_enabled
    region = torch.autocast(**kwargs)  # torch settles the region's settings (support checks, warnings)
    device = region.device
    enabled: bool = getattr(region, "_enabled", True)
    cache: bool = getattr(region, "_cache_enabled",
                          torch.is_autocast_cache_enabled() if cache_enabled is None else cache_enabled)
    stack: list[Any] = []  # per open forward: None (no region), a tuple (the state to restore) or a region
    low = (torch.float16, torch.bfloat16)

    def enter(module: nn.Module, args: Any) -> None:
        if not switch.active:
            stack.append(None)
        elif mode_enabled():
            opened = torch.autocast(**kwargs)
            opened.__enter__()
            stack.append(opened)
        else:
            stack.append((torch.is_autocast_cache_enabled(), torch.is_autocast_enabled(device),
                          torch.get_autocast_dtype(device)))
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
            torch.autocast_increment_nesting()
            torch.set_autocast_cache_enabled(cache)

    def leave(module: nn.Module, args: Any, output: Any) -> Any:
        opened = stack.pop()
        if opened is None:
            return output
        if type(opened) is tuple:  # torch.autocast.__exit__'s steps
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
            torch.set_autocast_enabled(device, opened[1])
            torch.set_autocast_dtype(device, opened[2])
            torch.set_autocast_cache_enabled(opened[0])
        else:
            opened.__exit__(None, None, None)
        if type(output) is torch.Tensor:  # the common case, without walking a structure
            return output.float() if output.dtype in low else output
        return finish(output)

    return enter, leave


def compiled_in_place(module: nn.Module) -> bool:
    """Whether ``module.compile()`` compiled this module in place.

    Why private: ``nn.Module.compile`` keeps the compiled call in ``_compiled_call_impl``, with no public
    reader. Fallback: False (a torch without it has no in-place compilation)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def compiled_wrapper_inner(model: object) -> nn.Module | None:
    """The module inside the wrapper ``torch.compile(module)`` returns; None when ``model`` is not one.

    Why private: the wrapper's class (``OptimizedModule``) and its ``_orig_mod`` have no public names. Reads
    dynamo only if it is loaded (nothing was compiled otherwise), so this loads nothing. No public form."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None or not isinstance(model, eval_frame.OptimizedModule):
        return None
    return model._orig_mod  # pyright: ignore[reportAttributeAccessIssue]


def checkpoint_module(module: nn.Module) -> None:
    """Checkpoint ``module``'s activations in place (non-reentrant), keeping its name and class.

    Why private: the composable ``checkpoint`` is the only form that leaves state-dict keys unchanged (the
    public ``torch.utils.checkpoint`` needs a wrapper module or a replaced ``forward``). No public form."""
    from torch.distributed._composable import checkpoint  # lazy: loads torch.distributed's composables

    checkpoint(module)


def set_context_parallel_rotate_method(method: str) -> None:
    """How context parallel passes the key/value shards between ranks ("allgather" or "alltoall").

    Why private: the setter lives in an experimental private module. No public form: without it torch's
    default ("allgather") stays."""
    try:
        from torch.distributed.tensor.experimental._attention import (
            set_rotate_method,  # lazy: context parallel
        )
    except ImportError:
        return
    set_rotate_method(method)


def pipeline_replicate() -> Any:
    """The chunk spec that hands the same value to every micro-batch of a pipeline schedule.

    Why private: ``torch.distributed.pipelining`` builds its own with ``_Replicate``. No public form."""
    from torch.distributed.pipelining.microbatch import _Replicate  # lazy: loads the pipelining package

    return _Replicate()


def pipeline_computation_type(kind: str) -> Any:
    """The schedule action type named ``kind`` (e.g. "BACKWARD_INPUT"), to register a custom function for it.

    Why private: ``register_custom_function`` takes members of ``_ComputationType``. No public form."""
    from torch.distributed.pipelining.schedules import _ComputationType  # lazy: loads the pipelining package

    return getattr(_ComputationType, kind)


def set_state_dict_element(state: dict, path: Any, value: Any) -> None:
    """Set ``value`` at ``path`` (a DCP object path) in a nested ``state`` dict, creating what is missing.

    Why private: DCP's own path walker, so paths mean exactly what they mean to DCP. No public form."""
    from torch.distributed.checkpoint._traverse import set_element  # lazy: loads DCP

    set_element(state, path, value)


def staged_cpu_copy(value: Any) -> Any:
    """A CPU copy of ``value`` (tensors in a nested structure) made as DCP's asynchronous save stages one.

    Why private: DCP's staging helpers allocate and copy in one pass. Public fallback: detached CPU clones."""
    try:
        from torch.distributed.checkpoint.staging import (  # lazy: loads DCP
            _copy_state_dict,
            _create_cpu_state_dict,
        )
    except ImportError:
        return tree_map(lambda t: t.detach().to("cpu", copy=True) if isinstance(t, torch.Tensor) else t, value)
    box = {"v": value}
    staged = _create_cpu_state_dict(box)
    _copy_state_dict(box, staged)
    return staged["v"]


def storage_info(relative_path: str, offset: int, length: int) -> Any:
    """DCP's record of where one item lies in a file its ``FileSystemWriter`` wrote.

    Why private: a writer that lays out its own files returns these so DCP's reader finds them. No public form."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo  # lazy: loads DCP

    return _StorageInfo(relative_path, offset, length)


def weights_only_unpickler(stream: Any) -> Any:
    """``torch.load``'s weights-only unpickler over ``stream`` (set its ``persistent_load`` before ``load()``).

    Why private: it reads one record of a checkpoint archive without loading the archive. No public form."""
    from torch import _weights_only_unpickler  # lazy: needed by the fast checkpoint reader only

    return _weights_only_unpickler.Unpickler(stream, encoding="utf-8")


def save_without_crc(tensor: torch.Tensor, stream: Any) -> None:
    """``torch.save(tensor, stream)`` without the zip records' CRC-32.

    Why private: torch.save's own zip writer with the CRC switched off for this archive only
    (``torch.serialization.set_crc32_options`` would change every thread's saves). Public fallback:
    ``torch.save``, CRCs kept."""
    serialization: Any = torch.serialization
    writer_class: Any = getattr(torch._C, "PyTorchFileWriter", None)
    try:
        archive = writer_class(stream, False, serialization._get_storage_alignment())
    except (AttributeError, TypeError):  # a torch without the switch
        torch.save(tensor, stream)
        return
    try:
        serialization._save(tensor, archive, pickle, serialization.DEFAULT_PROTOCOL, False)
    finally:  # as torch.save does: an unfinished archive would write its end from its destructor, and abort
        archive.write_end_of_file()


def flight_recorder_dump() -> bytes | None:
    """The pickled entries of torch's flight recorder on this rank; None when it is off or missing.

    Why private: the recorder has no public reader. Looked up by name: it is in torch's stubs only since 2.15."""
    dump = getattr(importlib.import_module("torch._C._distributed_c10d"), "_dump_fr_trace", None)
    return None if dump is None else dump()


def default_store_address() -> tuple[str, int] | None:
    """The host and port of the TCP store behind the default process group, as its ranks reach it; None when
    that store is of another kind (a file, a hash store) or torch has no getter.

    Why private: torch has no public getter for the default group's store. Public fallback: None, and the
    caller makes a store of its own and announces it over the group."""
    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    if getter is None:
        return None
    try:
        store = getter()
    except (RuntimeError, ValueError):  # no default group
        return None
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return (store.host, store.port) if isinstance(store, dist.TCPStore) else None


def group_timeout(group: Any, device: torch.device) -> timedelta | None:
    """The timeout of ``group``'s backend on ``device``: how long a collective waits before it fails; None
    where torch does not say.

    Why private: the timeout is only in the backend's options (``_timeout``), reached through
    ``_get_backend``. Public fallback: None, and the caller uses the timeout it was given."""
    try:
        timeout = group._get_backend(device).options._timeout
    except (AttributeError, RuntimeError, ValueError):
        return None
    return timeout if isinstance(timeout, timedelta) else None
