"""Benchmark shapes: DeepSeek V4 ``wo_a`` on a GPU, and tiny stand-ins for CPU smoke tests."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One sweep: groups, token counts and the per-group GEMM size."""

    groups: tuple[int, ...]
    ms: tuple[int, ...]
    heads_per_group: int  # K = heads_per_group * head_dim
    n: int
    head_dim: int = 512
    rope_dim: int = 64
    cache_rows: int = 65536  # rows of the cos/sin table (positions drawn below it)

    @property
    def k(self) -> int:
        return self.heads_per_group * self.head_dim


#: The issue's H200 sweep: K = 4096, N = 1024 (DeepSeek V4 Pro at TP1 is G = 16, TP8 is G = 2).
GPU = Sweep(groups=(2, 8, 16), ms=(1, 16, 64, 128, 512, 1024, 2048, 4096, 8192),
            heads_per_group=8, n=1024)

#: CPU smoke test under TRITON_INTERPRET=1: K = 512, N = 128, about 1e6 FLOP per call.
CPU = Sweep(groups=(2,), ms=(1, 5), heads_per_group=1, n=128, cache_rows=64)


@dataclasses.dataclass(frozen=True)
class Prefill:
    """The AITER measurement: one long prefill processed in fixed-size chunks."""

    tokens: int
    chunk: int
    groups: tuple[int, ...]
    runs: int = 3


GPU_PREFILL = Prefill(tokens=100_000, chunk=8192, groups=(16, 2))
CPU_PREFILL = Prefill(tokens=40, chunk=16, groups=(2,), runs=3)

#: H200 SXM dense FP8 peak (datasheet), used for "% of ceiling" of compute-bound rows.
H200_FP8_PEAK_TFLOPS = 1979.0
