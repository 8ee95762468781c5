"""Timing two or more loops interleaved item by item, so that a shared machine's slow spells fall on all alike.

A round starts every loop (``start()`` returns its iterator: a loader's epoch, a training loop's micro-batches),
then takes one item from each in turn, the order reversed after every item, timing each ``start()`` and
``next()`` with ``perf_counter`` (~0.07 us a call here; ``process_time`` costs ~0.7 us, so CPU time is not
taken). Items of different loops are then ~1 ms apart, where timing whole epochs in turn puts them tens of
milliseconds apart: on this project's shared machine one epoch of the tiny MLP varied by +-30% from round to
round at load 1, which pairing at the item level cancels. Used by step_calls.py and loader_overhead.py.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

_END = object()


def round_order(names: list[str], round_index: int) -> list[str]:
    """The order of round ``round_index``: a permutation of ``names`` drawn from the round's number (the same in
    every process). Rotating a fixed order keeps each loop next to the same two others in every round, and with
    more than two loops that biased the ratios: on 2 Dec a second plain loader (an A/A control) timed x1.007 of
    the first, and reordering the same four loaders moved every ratio by up to 1% (bench/loader_overhead.py);
    a fresh permutation each round spreads every loop's neighbours evenly."""
    order = list(names)
    random.Random(round_index).shuffle(order)
    return order


def interleaved_round(starts: dict[str, Callable[[], Iterator]], order: list[str]) -> tuple[dict[str, float], int]:
    """One pass over every loop of ``starts``, interleaved in ``order`` (reversed after each item): the seconds
    each loop took in all, and the number of items each yielded (the loops must yield as many)."""
    clock = time.perf_counter
    spent = dict.fromkeys(starts, 0.0)
    iterators = {}
    for name in order:
        begin = clock()
        iterators[name] = starts[name]()
        spent[name] += clock() - begin
    ended: set[str] = set()
    items = -1  # the pass that finds every loop ended yields nothing
    while not ended:
        for name in order:
            it = iterators[name]
            begin = clock()
            value = next(it, _END)
            spent[name] += clock() - begin
            if value is _END:
                ended.add(name)
        order = order[::-1]
        items += 1
    assert len(ended) == len(starts), f"the loops differ in length: {sorted(ended)} ended first"
    return spent, items
