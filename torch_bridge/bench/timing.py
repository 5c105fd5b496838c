"""Timers: CUDA-graph or eager replays between device events (GPU), wall clock (CPU, JAX, host).

Burst clock: each timing lasts some tens of milliseconds after idle time. Sustained clock: the
timing starts after ``SUSTAINED_WARM_S`` of back-to-back replays, at the clock a power-capped GPU
holds under a long run of large GEMMs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Literal

#: GPU work per timed graph replay: a short sequence is captured several times over, so that the
#: graph's own launch is not charged to each call.
BURST_FILL_US = 300.0
#: The sustained clock: GPU work per replay, and seconds of replays before timing.
SUSTAINED_FILL_US = 20_000.0
SUSTAINED_WARM_S = 1.0
#: Eager calls per timed repetition (over the input sets in turn): enough that the first call's
#: launch latency and the final wait, which a steady loop hides, weigh little.
EAGER_CALLS = 20

Clock = Literal["burst", "sustained"]


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def time_cuda(fns: Sequence[Callable[[], object]], *, reps: int = 20, warmup: int = 3,
              graph: bool = True, clock: Clock = "burst") -> list[float]:
    """Microseconds per call of each replay of ``fns`` (one call per input set, in order).

    ``graph``: the calls are captured in a CUDA graph (no launch gaps, as a serving loop replays
    them) and replayed ``reps`` times between two events; else ``EAGER_CALLS`` calls (over the
    sets in turn) are launched eagerly between the events. Rotating through several input sets
    keeps each call's inputs out of L2 when the sets together exceed it.
    """
    import torch

    for f in fns:  # compile / autotune / allocate outside the timed region
        f()
    torch.cuda.synchronize()
    fill = SUSTAINED_FILL_US if clock == "sustained" else BURST_FILL_US
    copies, calls = 1, len(fns)
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for f in fns:
                f()
        torch.cuda.current_stream().wait_stream(side)

        def capture(n: int):
            g = torch.cuda.CUDAGraph()
            # Thread-local: the oracle's JAX runtime threads call the driver at any time, and a
            # global-mode capture fails when one of them does.
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                for _ in range(n):
                    for f in fns:
                        f()
            return g

        g = capture(1)
        g.replay()
        copies = min(64, max(1, math.ceil(fill / _event_us(g.replay))))
        if copies > 1:
            g = capture(copies)
        run = g.replay
    else:
        order = [fns[i % len(fns)] for i in range(max(EAGER_CALLS, len(fns)))]
        calls = len(order)

        def run():
            for f in order:
                f()
    for _ in range(warmup):
        run()
    if clock == "sustained":
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < SUSTAINED_WARM_S:
            _event_us(run)
    return [_event_us(run) / (calls * copies) for _ in range(reps)]


def _event_us(run: Callable[[], object]) -> float:
    import torch

    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    run()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3


def time_wall(fn: Callable[[], object], *, per_call: int = 1, reps: int = 5, warmup: int = 1,
              sync: Callable[[object], object] | None = None) -> list[float]:
    """Microseconds per call of ``fn`` by wall clock; ``sync(result)`` waits for the result."""
    for _ in range(warmup):
        r = fn()
        if sync is not None:
            sync(r)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        r = fn()
        if sync is not None:
            sync(r)
        out.append((time.perf_counter() - t0) * 1e6 / per_call)
    return out


def host_us(fn: Callable[[], object], *, calls: int, reps: int = 5,
            sync: Callable[[], object] | None = None) -> list[float]:
    """Host microseconds per call of ``calls`` back-to-back calls, with no wait in between.

    The device work queues behind the host; ``sync`` drains it between repetitions, outside
    the timed region.
    """
    fn()
    if sync is not None:
        sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) * 1e6 / calls)
        if sync is not None:
            sync()
    return out
