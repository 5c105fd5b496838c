"""Timers: CUDA-graph replay with device events (GPU), wall clock (CPU, JAX)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence


def time_cuda(fns: Sequence[Callable[[], object]], *, reps: int = 20, warmup: int = 3,
              graph: bool = True, fill_us: float = 0.0, warm_s: float = 0.0) -> list[float]:
    """Microseconds per call of each replay of ``fns`` (one call per input set, run in order).

    The calls are captured once in a CUDA graph (no launch gaps, as a serving loop replays them)
    and the graph is replayed ``reps`` times between two events. Rotating through several input
    sets keeps each call's inputs out of L2 when the sets together exceed it.

    ``fill_us``: capture the sequence repeatedly, so that one replay holds at least about this
    much GPU work. The event pair around a replay also times the graph's launch, which would
    otherwise be charged to each call of a short sequence.

    ``warm_s``: after the ``warmup`` replays, keep replaying for this many seconds before
    timing, so that the GPU runs at the clock it holds under sustained load (a power-capped
    GPU slows down within a fraction of a second of large GEMMs; benchmarks/RESULTS.md).
    """
    import torch

    for f in fns:  # compile / autotune / allocate outside the timed region
        f()
    torch.cuda.synchronize()
    copies = 1
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for f in fns:
                f()
        torch.cuda.current_stream().wait_stream(side)

        def capture(n: int):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(n):
                    for f in fns:
                        f()
            return g

        g = capture(1)
        if fill_us > 0:
            g.replay()
            one = _event_us(g.replay)
            copies = min(64, max(1, math.ceil(fill_us / one)))
            if copies > 1:
                g = capture(copies)
        run = g.replay
    else:
        def run():
            for f in fns:
                f()
    for _ in range(warmup):
        run()
    if warm_s > 0:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warm_s:
            _event_us(run)  # one replay at a time, as the timed ones run
    return [_event_us(run) / (len(fns) * copies) for _ in range(reps)]


def _event_us(run: Callable[[], object]) -> float:
    import torch

    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    run()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3


def time_wall(fn: Callable[[], object], *, per_call: int = 1, reps: int = 5,
              warmup: int = 1, sync: Callable[[object], object] | None = None) -> list[float]:
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


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))
