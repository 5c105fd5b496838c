"""The sweep: every provider checked, then timed, at every (G, M); rows with their metrics.

Metrics are kept only where they mean something: on a GPU, TFLOP/s (GEMM and chains) or GB/s
(quant, copy, the weight read), the percentage of the ceiling (the FP8 or BF16 peak, or the
copy bandwidth for memory-bound rows) and ratios between rows of the same run; on CPU (the
Triton interpreter) only the wall time and the check.
"""

from __future__ import annotations

from collections.abc import Callable

from . import problem, timing
from .jax_providers import JaxTimed
from .problem import Skip, Sweep
from .providers import PROVIDERS


def time_calls(timed, *, on_gpu: bool, reps: int, graph: bool = True,
               clock: timing.Clock = "burst") -> dict:
    """Time a provider's calls; returns the row fields ``timer``, ``clock``, ``us`` and more."""
    if isinstance(timed, JaxTimed):
        times = (timed.back_to_back_us(reps) if on_gpu
                 else timed.back_to_back_us(min(reps, 3), calls=len(timed.args)))
        out = {"timer": "jit", "clock": None, "us": timing.median(times), "times_us": times}
        if on_gpu:
            out["device_us"] = timed.device_us()
        return out
    if on_gpu and graph:
        times = timing.time_cuda(timed, reps=reps, clock=clock)
        return {"timer": "graph", "clock": clock, "us": timing.median(times), "times_us": times}
    if on_gpu:
        return _eager_beside_graph(timed, reps=reps, clock=clock)
    times = timing.time_wall(lambda: [f() for f in timed], per_call=len(timed), reps=min(reps, 3))
    return {"timer": "wall", "clock": None, "us": timing.median(times), "times_us": times}


def _eager_beside_graph(timed, *, reps: int, clock: timing.Clock) -> dict:
    """Eager time per call, with what says whether the host or the GPU bounds it, from this
    process and these calls: ``vs_graph`` (the eager time over the same calls' graph replay)
    and ``host_us`` (host time per call, back to back, no wait). Across processes a host's
    speed differs too much to compare an eager row with another run's graph row."""
    import torch

    times = timing.time_cuda(timed, reps=reps, graph=False, clock=clock)
    us = timing.median(times)
    graph_us = timing.median(timing.time_cuda(timed, reps=reps, clock=clock))
    rounds = max(1, timing.EAGER_CALLS // len(timed))
    host = timing.host_us(lambda: [f() for f in timed], calls=rounds,
                          sync=torch.cuda.synchronize)
    return {"timer": "eager", "clock": clock, "us": us, "times_us": times,
            "vs_graph": us / graph_us, "host_us": timing.median(host) / len(timed)}


def measure_copy(on_gpu: bool, reps: int) -> dict:
    """Device-to-device copy of 1 GiB (1 MiB on CPU), eager: the bandwidth ceiling."""
    import torch

    nbytes = (1 << 30) if on_gpu else (1 << 20)
    a = torch.randn(nbytes // 4, dtype=torch.float32, device="cuda" if on_gpu else "cpu")
    b = torch.empty_like(a)
    # Eager: a copy captured in a CUDA graph runs as a memcpy node, not as kernels' streams do.
    if on_gpu:
        times = timing.time_cuda([lambda: b.copy_(a)], reps=reps, graph=False)
        timer = "eager"
    else:
        times = timing.time_wall(lambda: b.copy_(a), reps=reps)
        timer = "wall"
    us = timing.median(times)
    return {"mode": "sweep", "kind": "copy", "provider": "copy", "timer": timer,
            "clock": "burst" if on_gpu else None, "us": us, "times_us": times,
            "GB/s": 2 * nbytes / us / 1e3, "check": "-"}


def add_metrics(row: dict, sweep: Sweep, copy_gbps: float | None) -> None:
    """Throughput and % of ceiling of a timed GPU row (``kind``, ``G``, ``M``, ``us``)."""
    g, m, us, k, n = row["G"], row["M"], row["us"], sweep.k, sweep.n
    if row["kind"] in ("quant", "read"):
        moved = (m * g * k * 2 + m * g * k + m * g * k // 128 if row["kind"] == "quant"
                 else g * n * k)
        row["GB/s"] = moved / us / 1e3
        if copy_gbps:
            row["pct_ceiling"] = 100.0 * row["GB/s"] / copy_gbps
        return
    flops = 2.0 * m * g * n * k
    row["TFLOP/s"] = flops / us / 1e6
    bf16 = "bf16" in row["provider"]
    nbytes = g * n * k * (2 if bf16 else 1) + m * g * k * (2 if row["kind"] == "chain" else 1)
    nbytes += m * g * n * 2
    floor_us = flops / (problem.H200_FP8_PEAK_TFLOPS * 1e6) * (2 if bf16 else 1)
    if copy_gbps:
        floor_us = max(floor_us, nbytes / copy_gbps / 1e3)
    row["pct_ceiling"] = 100.0 * floor_us / us


#: The peer row each of our rows is divided by in ``vs_peer``.
PEER_OF = {"quant_triton": "quant_vllm", "chain_fp8": "chain_peer",
           "chain_fp8_triton": "chain_peer", "chain_fp8_deepgemm": "chain_peer"}


def add_ratios(by_provider: dict[str, dict]) -> None:
    """Same-run ratios: ``vs_bf16`` (BF16 time / this, FP8 rows against the shipped fallback
    or cuBLAS bf16), ``vs_ref`` (this / the in-place reference BF16 chain, for the shipped
    fallback rows), ``vs_deepgemm`` (this / DeepGEMM, for the Triton GEMM and the public op
    on the deepgemm backend) and ``vs_peer``
    (this / its ``PEER_OF`` row: vLLM's quant, vLLM's quant + DeepGEMM)."""
    def us(name):
        r = by_provider.get(name)
        return r.get("us") if r else None

    for name, row in by_provider.items():
        if not row.get("us"):
            continue
        if row["kind"] in ("gemm", "chain") and "bf16" not in name:
            base = us("chain_bf16" if row["kind"] == "chain" else "gemm_bf16")
            if base:
                row["vs_bf16"] = base / row["us"]
        if name in ("chain_bf16", "chain_bf16_inplace") and us("chain_bf16_ref"):
            row["vs_ref"] = row["us"] / us("chain_bf16_ref")
        if name in ("gemm_triton", "gemm_deepgemm_op") and us("gemm_deepgemm"):
            row["vs_deepgemm"] = row["us"] / us("gemm_deepgemm")
        if name in PEER_OF and us(PEER_OF[name]):
            row["vs_peer"] = row["us"] / us(PEER_OF[name])


def run_sweep(sweep: Sweep, providers: list[str], *, on_gpu: bool, reps: int, progress,
              copy_gbps: float | None, seed: int, graph: bool = True,
              clock: timing.Clock = "burst",
              on_shape: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Check and time every provider at every (G, M); ``on_shape(new_rows)`` after each shape."""
    import torch

    rows = []
    todo = [(g, m) for g in sweep.groups for m in sweep.ms]
    task = progress.add_task("sweep", total=len(todo) * len(providers))
    for g, m in todo:
        sets = problem.make_sets(sweep, g, m, on_gpu, seed)
        by_provider = {}
        for name in providers:
            progress.update(task, description=f"G={g} M={m} {name}")
            row = {"mode": "sweep", "kind": PROVIDERS[name].kind, "provider": name, "G": g,
                   "M": m, "N": sweep.n, "K": sweep.k, "sets": len(sets)}
            try:
                timed, msg = PROVIDERS[name].fn(sets, on_gpu)
                row.update(time_calls(timed, on_gpu=on_gpu, reps=reps, graph=graph,
                                      clock=clock), check=msg)
                if on_gpu:
                    add_metrics(row, sweep, copy_gbps)
            except Skip as e:
                row.update(us=None, check=f"skipped: {e}")
            except AssertionError as e:
                row.update(us=None, check=f"FAILED: {e}")
            except Exception as e:  # keep sweeping; the row records the error
                row.update(us=None, check=f"FAILED: {type(e).__name__}: {str(e)[:300]}")
            by_provider[name] = row
            progress.advance(task)
        if on_gpu:
            add_ratios(by_provider)
        new = list(by_provider.values())
        rows += new
        del sets
        if on_gpu:
            torch.cuda.empty_cache()
        if on_shape is not None:
            on_shape(new)
    return rows
