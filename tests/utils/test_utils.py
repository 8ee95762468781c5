"""overdrive.helpers.random, overdrive.helpers.memory and overdrive.helpers.logging, on one process and on gloo."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch

from overdrive.helpers.logging import MultiProcessAdapter, get_logger
from overdrive.helpers.memory import (
    clear_device_cache,
    find_executable_batch_size,
    release_memory,
    should_reduce_batch_size,
)
from overdrive.helpers.random import set_seed, synchronize_rng_state, synchronize_rng_states
from tests.support.distributed import run_distributed

# ---------------------------------------------------------------------------------------------- memory


@pytest.fixture
def clears(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The cache clears find_executable_batch_size makes (their ``garbage_collection`` flags), recorded instead
    of run: each is a full ``gc.collect()``, ~0.5 s of CPU in a test process that has imported transformers,
    once per retry. clear_device_cache itself runs in test_memory_helpers."""
    calls: list[bool] = []
    monkeypatch.setattr("overdrive.helpers.memory.clear_device_cache",
                        lambda garbage_collection=False: calls.append(garbage_collection))
    return calls


def test_find_executable_batch_size_shrinks_by_a_tenth_on_out_of_memory(clears):
    tried = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, scale, offset=0):
        tried.append(batch_size)
        if batch_size > 16:
            if batch_size == 128:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes")
        return batch_size * scale + offset

    assert train(2, offset=1) == 31
    # x0.9 rounded down, as Accelerate (its suite: tests/test_memory_utils.py::MemoryTest::test_memory_implicit)
    expected = [128]
    while expected[-1] > 16:
        expected.append(int(expected[-1] * 0.9))
    assert tried == expected and expected[-1] == 15
    assert clears == [True] * len(expected)  # before the first try and after each failed one, with gc first
    assert train(3) == 45 and tried[-1] == 15  # the size that worked is remembered


def test_find_executable_batch_size_reaches_zero(clears):
    @find_executable_batch_size(starting_batch_size=4)
    def train(batch_size):
        raise RuntimeError("CUDA out of memory.")

    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero."):
        train()
    assert clears == [True] * 5  # 4, 3, 2, 1 failed


def test_find_executable_batch_size_rejects_a_passed_batch_size():
    @find_executable_batch_size(starting_batch_size=8)
    def train(batch_size, model):
        return batch_size

    with pytest.raises(TypeError, match=r"first argument, `batch_size`, is filled in.*train\(model="):
        train(32, "net")
    with pytest.raises(TypeError, match="batch_size"):
        train("net", batch_size=32)
    assert train("net") == 8


def test_find_executable_batch_size_reraises_other_errors_and_uses_custom_reducers(clears):
    calls = []

    @find_executable_batch_size(starting_batch_size=10)
    def broken(batch_size):
        calls.append(batch_size)
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        broken()
    assert calls == [10]

    tried = []

    @find_executable_batch_size(starting_batch_size=10, reduce_batch_size_fn=lambda size: size - 3)
    def one_arg(batch_size):
        tried.append(batch_size)
        if batch_size > 4:
            raise RuntimeError("out of memory")
        return batch_size

    assert one_arg() == 4 and tried == [10, 7, 4]

    sizes = iter([5, 2])
    tried.clear()

    def fits_below_three(batch_size):
        tried.append(batch_size)
        if batch_size >= 3:
            raise RuntimeError("out of memory")
        return batch_size

    no_arg = find_executable_batch_size(fits_below_three, starting_batch_size=9,
                                        reduce_batch_size_fn=lambda: next(sizes))
    assert no_arg() == 2 and tried == [9, 5, 2]


def test_memory_helpers():
    assert should_reduce_batch_size(RuntimeError("CUDNN_STATUS_NOT_SUPPORTED. This error may appear"))
    assert not should_reduce_batch_size(RuntimeError("shape mismatch"))
    assert not should_reduce_batch_size(ValueError("out of memory"))
    a, b = release_memory(torch.ones(3), [1])
    assert a is None and b is None
    assert release_memory() == []
    clear_device_cache(garbage_collection=True)


# ---------------------------------------------------------------------------------------------- random


def _draw() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(2).tolist()


def test_set_seed_is_reproducible_and_deterministic_flag():
    set_seed(1234)
    first = _draw()
    set_seed(1234)
    assert _draw() == first
    set_seed(1235)
    assert _draw() != first
    assert not torch.are_deterministic_algorithms_enabled()
    try:
        set_seed(0, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_synchronize_rng_errors_and_single_process():
    with pytest.raises(ValueError, match=r"rng_type='tpu'.*torch, cuda, xla, npu, mlu, musa, hpu, xpu, generator"):
        synchronize_rng_state("tpu")
    with pytest.raises(ValueError, match="generator="):
        synchronize_rng_states(["generator"])
    state = torch.get_rng_state()
    synchronize_rng_states(["torch"])
    assert torch.equal(torch.get_rng_state(), state)


# --------------------------------------------------------------------------------------------- logging


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_get_logger_levels_and_warning_once(monkeypatch):
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "debug")
    monkeypatch.delenv("OVERDRIVE_LOG_LEVEL", raising=False)
    logger = get_logger("overdrive.test.single")
    assert isinstance(logger, MultiProcessAdapter) and logger.logger.level == logging.DEBUG
    monkeypatch.setenv("OVERDRIVE_LOG_LEVEL", "ERROR")
    assert get_logger("overdrive.test.single2").logger.level == logging.ERROR
    assert get_logger("overdrive.test.single3", log_level=logging.WARNING).logger.level == logging.WARNING

    handler = _Collect()
    logger.logger.addHandler(handler)
    try:
        logger.debug("debug %d", 1)
        logger.info("everyone", main_process_only=False, in_order=True)
        logger.warning_once("careful %s", "x")
        logger.warning_once("careful %s", "x")
        logger.warning_once("careful %s", "y")
    finally:
        logger.logger.removeHandler(handler)
    assert handler.messages == ["debug 1", "everyone", "careful x", "careful y"]


def _utils_checks(log_path: str) -> dict:
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    out: dict = {}

    set_seed(100 + 7 * rank)
    out["before_sync"] = torch.rand(3).tolist()
    from overdrive.config import RNGType

    synchronize_rng_states([RNGType.TORCH])
    out["after_sync"] = torch.rand(3).tolist()
    generator = torch.Generator().manual_seed(rank)
    synchronize_rng_state("generator", generator=generator)
    out["generator"] = torch.rand(3, generator=generator).tolist()
    set_seed(5, device_specific=True)
    out["device_specific"] = torch.rand(3).tolist()

    logger = get_logger("overdrive.test.multi", log_level="INFO")
    logger.logger.propagate = False
    handler = _Collect()
    ordered = logging.FileHandler(log_path)
    ordered.setFormatter(logging.Formatter("%(message)s"))
    logger.logger.addHandler(handler)
    logger.info("main only")
    logger.info("every rank %d", rank, main_process_only=False)
    logger.warning_once("once per process", main_process_only=False)
    logger.warning_once("once per process", main_process_only=False)
    logger.logger.addHandler(ordered)
    for _ in range(2):
        logger.info("in order %d", rank, main_process_only=False, in_order=True)
    ordered.close()
    out["records"] = handler.messages
    return out


@pytest.mark.timeout(120)
def test_random_and_logging_on_gloo(tmp_path):
    world = 3
    log_path = tmp_path / "ordered.log"
    results = run_distributed(_utils_checks, world, str(log_path))
    assert results[0]["before_sync"] != results[1]["before_sync"]
    assert all(out["after_sync"] == results[0]["after_sync"] for out in results)
    assert all(out["generator"] == results[0]["generator"] for out in results)
    for rank, out in enumerate(results):
        torch.manual_seed(5 + rank)
        assert out["device_specific"] == torch.rand(3).tolist()
    assert len({tuple(out["device_specific"]) for out in results}) == world
    assert results[0]["records"][0] == "main only"
    for rank, out in enumerate(results):
        expected = (["main only"] if rank == 0 else []) + [f"every rank {rank}", "once per process"]
        expected += [f"in order {rank}"] * 2
        assert out["records"] == expected
    lines = log_path.read_text().splitlines()
    assert lines == [f"in order {r}" for r in range(world)] * 2
