"""The ``wo_a`` benchmark: every provider checked against the ``woa_jax`` oracle, then timed.

Usage (``woa bench`` forwards its arguments to ``main``)::

    python -m benchmarks.bench                      # H200 sweep (or the CPU smoke sweep)
    python -m benchmarks.bench --groups 16 --ms 1,8192 --json out.json --plot out.png
    python -m benchmarks.bench --sustained --ms 8192  # at the clock of a long run (power cap)
    python -m benchmarks.bench --prefill            # 100K-token prefill in 8K chunks, TP1/TP8
    python -m benchmarks.bench --tune               # GEMM / quant / fused-chain launch shapes

Providers (rows of the table):

* ``copy``: device-to-device copy of 1 GiB (bandwidth ceiling, bytes read + written).
* ``quant_triton``: fused inverse RoPE + 1x128 E8M0 quant (bytes: bf16 read, fp8 + scales written).
* ``gemm_triton`` / ``gemm_jax``: the block-scaled FP8 batched GEMM from torch / under ``jax.jit``.
* ``gemm_scaled_mm``: ``torch._scaled_mm`` blockwise, one call per group (fp32 scales, M padded
  to a multiple of 4; scale conversion and padding are outside the timed region).
* ``gemm_bf16``: cuBLAS bf16 ``einsum`` of the same problem (the BF16 chain's GEMM alone).
* ``chain_bf16``: Triton in-place inverse RoPE of the rope tail + cuBLAS bf16 ``einsum``.
* ``chain_fp8_triton``: ``launch.wo_a_fp8``, the fused one-kernel chain where
  ``launch.fused_chosen`` (M = 1 at G = 16, M <= 8 at G = 2), quant + GEMM elsewhere;
  ``chain_fp8_triton_2k``: always the two kernels.
* ``chain_fp8_jax``: ``jax_ops.wo_a_fp8`` under ``jax.jit`` (one fused native launch at M = 1,
  G >= 16; quant + GEMM elsewhere);
  ``chain_fp8_jax_cb``: the ``buffer_callback`` route with its launches recorded in XLA's
  command buffers (CUDA graphs); skipped where the native ``jax_triton`` route runs (it has no
  callback to record; ``WOA_JAX_TRITON=0`` turns it off).

GPU times are medians of CUDA-graph replays over enough input sets to keep inputs out of L2
(JAX rows: wall clock of one jitted call over the same sets). Each timing lasts some tens of
milliseconds after idle time (the burst clock); ``--sustained`` times after 1 s of back-to-back
replays instead, where a power-capped GPU runs slower (an H200 at M = 8192: ~1400 instead of
1980 MHz). CPU runs use the Triton
interpreter and wall clock: they check that the harness works, not speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import hashlib
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
from collections.abc import Callable

from . import shapes
from .timing import median, time_cuda, time_wall

PROVIDERS = ("copy", "quant_triton", "gemm_triton", "gemm_jax", "gemm_scaled_mm", "gemm_bf16",
             "chain_bf16", "chain_fp8_triton", "chain_fp8_triton_2k", "chain_fp8_jax",
             "chain_fp8_jax_cb")
#: The tolerance of GEMM-like outputs against the fp32 oracle (woa_jax.testing.TOLERANCES).
_GEMM_TOL = "gemm_bf16"
_L2_COLD_BYTES = 200e6  # ~3x the H200's 60 MB L2
#: GPU work per timed graph replay (see ``timing.time_cuda``): short sequences repeat.
_FILL_US = 300.0
#: ``--sustained``: GPU work per replay and seconds of replays before timing (see time_cuda).
_SUSTAINED_FILL_US = 20_000.0
_SUSTAINED_WARM_S = 1.0


class Skip(Exception):
    """A provider that cannot run here (the message says why)."""


# ----------------------------------------------------------------------------------------------
# Problem data
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Problem:
    """One input set: ``o [M, H, Dh]`` and a ``[G, N, K]`` weight, with everything derived."""

    o: object
    pos: object
    cos_bf16: object
    sin_bf16: object
    cos32: object
    sin32: object
    w: object  # [G, N, K] fp8
    ws: object  # [G, N/128, K/128] uint8
    w_bf16: object  # [G, N, K] bf16, exact
    x: object = None  # quantized o, [M, G, K] fp8
    xs: object = None
    o_work: object = None  # private copy of o for the in-place BF16 chain
    cache: dict = dataclasses.field(default_factory=dict)


def make_problem(sweep: shapes.Sweep, g: int, m: int, device: str, seed: int) -> Problem:
    import torch

    from torch_bridge.backends.triton import launch

    gen = torch.Generator(device=device).manual_seed(seed)
    h = g * sweep.heads_per_group
    o = (torch.randn((m, h, sweep.head_dim), generator=gen, device=device) / 10).to(torch.bfloat16)
    pos = torch.randint(0, sweep.cache_rows, (m,), generator=gen, device=device)
    ang = torch.rand((sweep.cache_rows, sweep.rope_dim // 2), generator=gen, device=device) * 6.3
    cos32, sin32 = torch.cos(ang), torch.sin(ang)
    k, n = sweep.k, sweep.n
    w = torch.randn((g, n, k), generator=gen, device=device).clamp(-448, 448)
    w = w.to(torch.float8_e4m3fn)
    ws = torch.randint(118, 125, (g, n // 128, k // 128), generator=gen, device=device,
                       dtype=torch.int32).to(torch.uint8)
    scale = (ws.to(torch.int32) << 23).view(torch.float32)
    w_bf16 = (w.float() * scale.repeat_interleave(128, 1).repeat_interleave(128, 2)).to(
        torch.bfloat16)
    p = Problem(o=o, pos=pos, cos_bf16=cos32.to(torch.bfloat16), sin_bf16=sin32.to(torch.bfloat16),
                cos32=cos32, sin32=sin32, w=w, ws=ws, w_bf16=w_bf16)
    p.x, p.xs = launch.inverse_rope_group_quant(o, pos, p.cos_bf16, p.sin_bf16, g, 128)
    p.o_work = o.clone()
    return p


def n_sets(sweep: shapes.Sweep, g: int, m: int, on_gpu: bool) -> int:
    """Input sets to rotate through so that one round exceeds L2 (1 on CPU)."""
    if not on_gpu:
        return 1
    per_set = g * sweep.n * sweep.k * 3 + m * g * sweep.k * 3  # fp8 + bf16 weight, o + x
    return int(min(24, max(1, math.ceil(_L2_COLD_BYTES / per_set))))


# ----------------------------------------------------------------------------------------------
# Oracle
# ----------------------------------------------------------------------------------------------


def _j(t):
    from torch_bridge import interop

    return interop.to_jax(t)


def oracle(p: Problem, what: str, g: int):
    """The ``woa_jax`` result for ``what`` on problem ``p`` (computed once, cached)."""
    if what in p.cache:
        return p.cache[what]
    import jax
    import jax.numpy as jnp

    import woa_jax

    jit = functools.partial(jax.jit, static_argnums=6)
    if what == "quant":
        r = jax.jit(woa_jax.inverse_rope_group_quant, static_argnums=(4, 5))(
            _j(p.o), _j(p.pos), _j(p.cos_bf16), _j(p.sin_bf16), g, 128)
    elif what == "gemm":
        r = jax.jit(woa_jax.batched_gemm_a8w8_mxscale, static_argnames="dtype")(
            _j(p.x), _j(p.w), _j(p.xs), _j(p.ws), dtype=jnp.float32)
    elif what == "chain_fp8":
        # Two jitted steps: one jit of the whole woa_jax.wo_a_fp8 on XLA:GPU measured a 2.7e-2
        # relative difference from the eager chain (as if the fp8 rounding were dropped).
        q, sc = oracle(p, "quant", g)
        r = jax.jit(woa_jax.batched_gemm_a8w8_mxscale, static_argnames="dtype")(
            q, _j(p.w), sc, _j(p.ws), dtype=jnp.float32)
    elif what == "chain_bf16":
        w2, s2 = _j(p.w.flatten(0, 1)), _j(p.ws.flatten(0, 1))
        r = jit(woa_jax.wo_a_bf16)(_j(p.o), _j(p.pos), _j(p.cos32), _j(p.sin32), w2, s2, g)
    else:
        raise ValueError(what)
    p.cache[what] = r
    return r


def _torch(x):
    from torch_bridge import interop

    return interop.to_torch(x)


def _relerr(actual, expected) -> float:
    """Relative Frobenius error in float64 on the arrays' device (inf when any is not finite)."""
    a, e = _torch(actual).double(), _torch(expected).to(_torch(actual).device).double()
    if not bool(a.isfinite().all()):
        return float("inf")
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


def _bytes_equal(actual, expected) -> bool:
    import torch

    a, e = _torch(actual).view(torch.uint8), _torch(expected).view(torch.uint8)
    return bool(torch.equal(a, e.to(a.device)))


# ----------------------------------------------------------------------------------------------
# Providers: each returns (per-set callables, check message) or raises Skip
# ----------------------------------------------------------------------------------------------


def _chain_check(y, p: Problem, g: int, what: str) -> str:
    """Raise unless ``y`` is within the bf16 GEMM tolerance of the oracle's ``what``."""
    from woa_jax.testing import TOLERANCES

    err = _relerr(y, oracle(p, what, g))
    if not err <= TOLERANCES[_GEMM_TOL].rel:
        raise AssertionError(f"relative error {err:.3g} > {TOLERANCES[_GEMM_TOL].rel}")
    return f"relerr {err:.2e}"


def _gemm_check(y, p: Problem, g: int) -> str:
    return _chain_check(y, p, g, "gemm")


def prov_quant_triton(sets, g, on_gpu):
    from torch_bridge.backends.triton import launch

    p0 = sets[0]
    q, s = launch.inverse_rope_group_quant(p0.o, p0.pos, p0.cos_bf16, p0.sin_bf16, g, 128)
    rq, rs = oracle(p0, "quant", g)
    if not (_bytes_equal(q, rq) and _bytes_equal(s, rs)):
        raise AssertionError("fp8 or scale bytes differ from the oracle")
    outs = [(p.x, p.xs) for p in sets]
    fns = [(lambda p=p, o=o: launch.inverse_rope_group_quant(
        p.o, p.pos, p.cos_bf16, p.sin_bf16, g, 128, x_fp8=o[0], x_scale=o[1]))
        for p, o in zip(sets, outs, strict=True)]
    return fns, "bytes exact"


def prov_gemm_triton(sets, g, on_gpu):
    import torch

    from torch_bridge.backends.triton import launch

    p0 = sets[0]
    msg = _gemm_check(launch.batched_gemm_a8w8_mxscale(p0.x, p0.w, p0.xs, p0.ws), p0, g)
    outs = [torch.empty((p.x.shape[0], g, p.w.shape[1]), dtype=torch.bfloat16,
                        device=p.x.device) for p in sets]
    fns = [(lambda p=p, y=y: launch.batched_gemm_a8w8_mxscale(p.x, p.w, p.xs, p.ws, out=y))
           for p, y in zip(sets, outs, strict=True)]
    return fns, msg


def prov_gemm_bf16(sets, g, on_gpu):
    import torch

    xb = [p.x.float().to(torch.bfloat16) for p in sets]  # any bf16 activations of the shape
    fns = [(lambda x=x, p=p: torch.einsum("mgk,gnk->mgn", x, p.w_bf16))
           for x, p in zip(xb, sets, strict=True)]
    return fns, "cuBLAS (not checked: timing only)"


def prov_gemm_scaled_mm(sets, g, on_gpu):
    import torch

    if not on_gpu or torch.cuda.get_device_capability() != (9, 0):
        raise Skip("blockwise torch._scaled_mm runs on sm_90 only")
    prepared = []
    for p in sets:
        m, _, k = p.x.shape
        mp = -(-m // 4) * 4
        xg = torch.zeros((g, mp, k), dtype=p.x.dtype, device=p.x.device)
        xg[:, :m] = p.x.transpose(0, 1)
        xs = torch.ones((g, mp, k // 128), dtype=torch.float32, device=p.x.device)
        xs[:, :m] = (p.xs.to(torch.int32) << 23).view(torch.float32).transpose(0, 1)
        ws = (p.ws.to(torch.int32) << 23).view(torch.float32)  # [G, N/128, K/128]
        sa = [xs[i].t().contiguous().t() for i in range(g)]
        sb = [ws[i].contiguous().t() for i in range(g)]
        prepared.append((xg, sa, sb, p))

    def run(xg, sa, sb, p):
        return [torch._scaled_mm(xg[i], p.w[i].t(), scale_a=sa[i], scale_b=sb[i],
                                 out_dtype=torch.bfloat16) for i in range(g)]

    y = run(*prepared[0])
    m = sets[0].x.shape[0]
    msg = _gemm_check(torch.stack(y, 1)[:m], sets[0], g)
    return [(lambda a=a: run(*a)) for a in prepared], msg


def prov_chain_bf16(sets, g, on_gpu):
    from torch_bridge.backends.triton import launch

    p0 = sets[0]
    y = launch.wo_a_bf16(p0.o, p0.pos, p0.cos32, p0.sin32, p0.w_bf16, g)  # copies o
    msg = _chain_check(y, p0, g, "chain_bf16")
    fns = [(lambda p=p: launch.wo_a_bf16(p.o_work, p.pos, p.cos32, p.sin32, p.w_bf16, g,
                                         inplace=True)) for p in sets]
    return fns, msg


def prov_chain_fp8_triton(sets, g, on_gpu, fused=None, config=None):
    import torch

    from torch_bridge.backends.triton import launch

    outs = [torch.empty((p.x.shape[0], g, p.w.shape[1]), dtype=torch.bfloat16,
                        device=p.x.device) for p in sets]

    def chain(p, y):
        return launch.wo_a_fp8(p.o, p.pos, p.cos_bf16, p.sin_bf16, p.w, p.ws, g, out=y,
                               fused=fused, config=config)

    msg = _chain_check(chain(sets[0], outs[0]), sets[0], g, "chain_fp8")
    return [(lambda p=p, y=y: chain(p, y)) for p, y in zip(sets, outs, strict=True)], msg


def prov_chain_fp8_triton_2k(sets, g, on_gpu):
    return prov_chain_fp8_triton(sets, g, on_gpu, fused=False)


def _jax_sets(sets, fields):
    return [tuple(_j(getattr(p, f)) for f in fields) for p in sets]


def prov_gemm_jax(sets, g, on_gpu):
    import jax

    from torch_bridge import jax_ops

    backend = None if on_gpu else "triton"
    args = _jax_sets(sets, ("x", "w", "xs", "ws"))
    one = jax.jit(lambda a: jax_ops.batched_gemm_a8w8_mxscale(*a, backend=backend))
    msg = _gemm_check(one(args[0]), sets[0], g)
    return _jax_timer(jax.jit(lambda a_all: [jax_ops.batched_gemm_a8w8_mxscale(
        *a, backend=backend) for a in a_all]), args), msg


def prov_chain_fp8_jax(sets, g, on_gpu, command_buffer=False):
    import jax

    from torch_bridge import jax_ops

    backend = None if on_gpu else "triton"
    args = _jax_sets(sets, ("o", "pos", "cos_bf16", "sin_bf16", "w", "ws"))

    def chain(a):
        return jax_ops.wo_a_fp8(*a, g, backend=backend, command_buffer=command_buffer)

    one = jax.jit(chain)
    msg = _chain_check(one(args[0]), sets[0], g, "chain_fp8")
    if len(args) > 1:  # a second input set through the same executable (command-buffer replay)
        msg += f"; set 2 {_chain_check(one(args[1]), sets[1], g, 'chain_fp8')}"
    return _jax_timer(jax.jit(lambda a_all: [chain(a) for a in a_all]), args), msg


def prov_chain_fp8_jax_cb(sets, g, on_gpu):
    from torch_bridge import jax_ops

    if not on_gpu:
        raise Skip("command buffers exist on GPUs only")
    if jax_ops.native_route_reason("triton") is None:
        raise Skip("the native jax_triton route ignores command_buffer (same as chain_fp8_jax); "
                   "WOA_JAX_TRITON=0 measures the callback route")
    return prov_chain_fp8_jax(sets, g, on_gpu, command_buffer=True)


@dataclasses.dataclass
class _JaxTimed:
    """Marker for providers timed by wall clock over one jitted call of all sets."""

    fn: Callable
    args: list


def _jax_timer(fn, args):
    return _JaxTimed(fn, args)


PROVIDER_FNS = {
    "quant_triton": prov_quant_triton,
    "gemm_triton": prov_gemm_triton,
    "gemm_jax": prov_gemm_jax,
    "gemm_scaled_mm": prov_gemm_scaled_mm,
    "gemm_bf16": prov_gemm_bf16,
    "chain_bf16": prov_chain_bf16,
    "chain_fp8_triton": prov_chain_fp8_triton,
    "chain_fp8_triton_2k": prov_chain_fp8_triton_2k,
    "chain_fp8_jax": prov_chain_fp8_jax,
    "chain_fp8_jax_cb": prov_chain_fp8_jax_cb,
}


def _time(timed, on_gpu: bool, reps: int, sustained: bool = False) -> list[float]:
    if isinstance(timed, _JaxTimed):
        import jax

        per = len(timed.args)
        return time_wall(lambda: timed.fn(timed.args), per_call=per, reps=reps, warmup=2,
                         sync=jax.block_until_ready)
    if on_gpu:
        if sustained:
            return time_cuda(timed, reps=reps, fill_us=_SUSTAINED_FILL_US,
                             warm_s=_SUSTAINED_WARM_S)
        return time_cuda(timed, reps=reps, fill_us=_FILL_US)
    return time_wall(lambda: [f() for f in timed], per_call=len(timed), reps=min(reps, 3))


# ----------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------


def _row_metrics(row: dict, sweep: shapes.Sweep, copy_gbps: float | None) -> None:
    """Add throughput, % of ceiling to a row with ``kind``, ``G``, ``M`` and ``us``."""
    g, m, us = row["G"], row["M"], row["us"]
    k, n = sweep.k, sweep.n
    flops = 2.0 * m * g * n * k
    if row["kind"] == "quant":
        nbytes = m * g * k * 2 + m * g * k + m * g * k // 128
        row["GB/s"] = nbytes / us / 1e3
        if copy_gbps:
            row["pct_ceiling"] = 100.0 * row["GB/s"] / copy_gbps
        return
    row["TFLOP/s"] = flops / us / 1e6
    wbytes = g * n * k * (2 if "bf16" in row["provider"] else 1)
    abytes = m * g * k * 2 if row["kind"] == "chain" else m * g * k
    nbytes = wbytes + abytes + m * g * n * 2
    floor_us = flops / (shapes.H200_FP8_PEAK_TFLOPS * 1e6)
    if "bf16" in row["provider"]:
        floor_us *= 2  # dense bf16 peak is half of fp8
    if copy_gbps:
        floor_us = max(floor_us, nbytes / copy_gbps / 1e3)
    row["floor_us"] = floor_us
    row["pct_ceiling"] = 100.0 * floor_us / us


def _kind(provider: str) -> str:
    return provider.split("_", 1)[0]


def measure_copy(on_gpu: bool, reps: int) -> dict:
    import torch

    nbytes = (1 << 30) if on_gpu else (1 << 20)
    device = "cuda" if on_gpu else "cpu"
    a = torch.randn(nbytes // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    # Eager: captured in a CUDA graph the same copy ran at 2.75 TB/s against 4.27 TB/s eager on
    # the H200 (likely a memcpy node on the copy engines), not a ceiling for kernels' streams.
    times = time_cuda([lambda: b.copy_(a)], reps=reps, graph=False) if on_gpu else \
        time_wall(lambda: b.copy_(a), reps=reps)
    us = median(times)
    return {"kind": "copy", "provider": "copy", "G": 0, "M": 0, "us": us, "times_us": times,
            "GB/s": 2 * nbytes / us / 1e3, "check": "-"}


def run_sweep(sweep: shapes.Sweep, providers: list[str], *, on_gpu: bool, reps: int,
              progress, copy_gbps: float | None, seed: int,
              on_shape: Callable[[list[dict]], None] | None = None,
              sustained: bool = False) -> list[dict]:
    """Check and time every provider at every (G, M); ``on_shape(rows)`` after each shape;
    ``sustained``: GPU providers timed at the clock of a long back-to-back run."""
    import torch

    device = "cuda" if on_gpu else "cpu"
    rows = []
    todo = [(g, m) for g in sweep.groups for m in sweep.ms]
    task = progress.add_task("sweep", total=len(todo) * len(providers))
    for g, m in todo:
        sets = [make_problem(sweep, g, m, device, seed + i)
                for i in range(n_sets(sweep, g, m, on_gpu))]
        by_provider = {}
        for name in providers:
            progress.update(task, description=f"G={g} M={m} {name}")
            row = {"kind": _kind(name), "provider": name, "G": g, "M": m,
                   "N": sweep.n, "K": sweep.k, "sets": len(sets)}
            try:
                timed, msg = PROVIDER_FNS[name](sets, g, on_gpu)
                times = _time(timed, on_gpu, reps, sustained)
                row.update(us=median(times), times_us=times, check=msg)
                _row_metrics(row, sweep, copy_gbps)
            except Skip as e:
                row.update(us=None, check=f"skipped: {e}")
            except AssertionError as e:
                row.update(us=None, check=f"FAILED: {e}")
            except Exception as e:  # keep sweeping; the row records the error
                row.update(us=None, check=f"FAILED: {type(e).__name__}: {str(e)[:300]}")
            rows.append(row)
            by_provider[name] = row
            progress.advance(task)
        for row in by_provider.values():
            if row["kind"] not in ("gemm", "chain"):
                continue
            base = by_provider.get("chain_bf16" if row["kind"] == "chain" else "gemm_bf16")
            if base and base.get("us") and row.get("us") and base is not row:
                row["speedup_vs_bf16"] = base["us"] / row["us"]
        del sets
        if on_gpu:
            torch.cuda.empty_cache()
        if on_shape is not None:
            on_shape(rows)
    return rows


# ----------------------------------------------------------------------------------------------
# Prefill scenario (the upstream AITER measurement)
# ----------------------------------------------------------------------------------------------


def run_prefill(sweep: shapes.Sweep, cfg: shapes.Prefill, *, on_gpu: bool, progress,
                seed: int) -> list[dict]:
    """Total ``wo_a`` time of one ``cfg.tokens`` prefill in ``cfg.chunk`` chunks, per chain."""
    import time

    import torch

    from torch_bridge.backends.triton import launch

    device = "cuda" if on_gpu else "cpu"
    chunks = [cfg.chunk] * (cfg.tokens // cfg.chunk)
    if cfg.tokens % cfg.chunk:
        chunks.append(cfg.tokens % cfg.chunk)
    rows = []
    task = progress.add_task("prefill", total=len(cfg.groups) * cfg.runs * 2)
    for g in cfg.groups:
        totals: dict[str, list[float]] = {"chain_bf16": [], "chain_fp8_triton": []}
        for run in range(cfg.runs):
            p = make_problem(sweep, g, cfg.chunk, device, seed + 100 * run)
            xq, xs = torch.empty_like(p.x), torch.empty_like(p.xs)
            y = torch.empty((cfg.chunk, g, sweep.n), dtype=torch.bfloat16, device=device)

            def fp8(s, p=p, xq=xq, xs=xs, y=y, g=g):
                launch.inverse_rope_group_quant(p.o[:s], p.pos[:s], p.cos_bf16, p.sin_bf16, g,
                                                128, x_fp8=xq[:s], x_scale=xs[:s])
                launch.batched_gemm_a8w8_mxscale(xq[:s], p.w, xs[:s], p.ws, out=y[:s])

            def bf16(s, p=p, g=g):
                launch.wo_a_bf16(p.o_work[:s], p.pos[:s], p.cos32, p.sin32, p.w_bf16, g,
                                 inplace=True)

            for name, fn in (("chain_bf16", bf16), ("chain_fp8_triton", fp8)):
                progress.update(task, description=f"prefill G={g} run {run + 1} {name}")
                for s in sorted(set(chunks)):  # compile and warm every chunk size
                    fn(s)
                if on_gpu:
                    torch.cuda.synchronize()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                        enable_timing=True)
                    e0.record()
                    for s in chunks:
                        fn(s)
                    e1.record()
                    e1.synchronize()
                    totals[name].append(e0.elapsed_time(e1))
                else:
                    t0 = time.perf_counter()
                    for s in chunks:
                        fn(s)
                    totals[name].append((time.perf_counter() - t0) * 1e3)
                progress.advance(task)
            del p
        for name, ms in totals.items():
            rows.append({"kind": "prefill", "provider": name, "G": g, "tokens": cfg.tokens,
                         "chunk": cfg.chunk, "total_ms": median(ms), "runs_ms": ms})
        rows[-1]["speedup_vs_bf16"] = rows[-2]["total_ms"] / rows[-1]["total_ms"]
    return rows


# ----------------------------------------------------------------------------------------------
# Tuning sweep of the Triton launch shapes
# ----------------------------------------------------------------------------------------------


def gemm_candidates(m: int) -> list:
    """Launch shapes worth timing for one M (``label()``: m, n, split-K, s=swap, warps, stages,
    T = TMA tiles [programs per SM], W = the Gluon wgmma kernel [programs per SM], Hopper only)."""
    from torch_bridge.backends.triton.launch import GemmConfig as C

    if m <= 64:
        t = max(16, 1 << (m - 1).bit_length())
        out = [C(t, bn, sk, True, 4, st) for bn in (64, 128) for sk in (1, 2, 4, 8)
               for st in (4, 5)]
        out += [C(t, bn, 1, True, 4, st, tma=True) for bn in (64, 128) for st in (4, 6, 8)]
        if t == 16:
            out += [C(16, 64, 1, False, 4, 4), C(16, 64, 1, False, 4, 4, tma=True)]
        else:  # the default without Gluon from 17 tokens: unswapped 64 x 64 pointer tiles
            out += [C(64, 64, 1, False, 4, st) for st in (4, 6)]
        out += [C(64, 128, num_warps=4, num_stages=st, wgmma=True) for st in (4, 6, 8)]
        tokens = max(8, 1 << (m - 1).bit_length())  # the swapped Gluon tile (spills at 64)
        if tokens <= 32:
            out += [C(tokens, bn, swap_ab=True, num_warps=4, num_stages=st, wgmma=True)
                    for bn in (64, 128) for st in (6, 8)]
        return out
    wgmma = [C(bm, 128, num_warps=bm // 16, num_stages=st, wgmma=True, programs_per_sm=pps)
             for bm, st, pps in ((128, 4, 0), (128, 4, 1), (128, 5, 1), (64, 3, 2),
                                 (64, 4, 0), (64, 4, 2), (64, 6, 0))]
    return wgmma + [C(64, 128, 1, False, 4, 4), C(64, 128, 1, False, 4, 4, tma=True),
            C(64, 128, 1, False, 4, 4, tma=True, programs_per_sm=2),
            C(128, 128, 1, False, 8, 4, tma=True),
            C(128, 128, 1, False, 8, 4, tma=True, programs_per_sm=1)]


def fused_candidates(m: int, g: int, n: int) -> list:
    """Launch shapes of the fused decode chain worth timing (swapped pointer-load tiles)."""
    from torch_bridge.backends.triton.launch import GemmConfig as C

    t = max(16, 1 << (m - 1).bit_length())
    splits = (1, 2) if -(-m // t) * (n // 64) * g > 64 else (4, 8)
    return [C(t, bn, sk, True, nw, st) for bn in (64, 128) for sk in splits for nw in (4, 8)
            for st in (4, 5)]


def quant_candidates() -> list:
    from torch_bridge.backends.triton.launch import QuantConfig as Q

    return [Q(32, 4), Q(8, 4), Q(4, 1, 1), Q(8, 1, 1), Q(16, 1, 1), Q(8, 2, 1), Q(16, 2, 1),
            Q(4, 4, 1), Q(16, 4, 1), Q(8, 4, 4), Q(2, 4, 8), Q(4, 1, 2), Q(4, 2, 2), Q(2, 1, 1)]


TUNE_KINDS = ("gemm", "quant", "chain")


def run_tune(sweep: shapes.Sweep, *, on_gpu: bool, reps: int, progress, seed: int,
             kinds: tuple[str, ...] = TUNE_KINDS, sustained: bool = False) -> list[dict]:
    """Time every candidate launch shape of ``kinds`` (GEMM, quant, fused chain up to M = 64)
    at every (G, M) of ``sweep``; ``sustained`` as in ``run_sweep``."""
    import torch

    from torch_bridge.backends.triton import launch

    device = "cuda" if on_gpu else "cpu"
    rows = []
    todo = [(g, m) for g in sweep.groups for m in sweep.ms]
    task = progress.add_task("tune", total=len(todo))
    for g, m in todo:
        progress.update(task, description=f"tune G={g} M={m}")
        sets = [make_problem(sweep, g, m, device, seed + i)
                for i in range(n_sets(sweep, g, m, on_gpu))]
        n_before = len(rows)
        for cfg in gemm_candidates(m) if "gemm" in kinds else ():
            row = {"kind": "tune_gemm", "provider": cfg.label(), "G": g, "M": m,
                   "N": sweep.n, "K": sweep.k, "config": dataclasses.asdict(cfg)}
            try:
                p0 = sets[0]
                row["check"] = _gemm_check(launch.batched_gemm_a8w8_mxscale(
                    p0.x, p0.w, p0.xs, p0.ws, config=cfg), p0, g)
                outs = [torch.empty((m, g, sweep.n), dtype=torch.bfloat16, device=device)
                        for _ in sets]
                fns = [(lambda p=p, y=y, cfg=cfg: launch.batched_gemm_a8w8_mxscale(
                    p.x, p.w, p.xs, p.ws, out=y, config=cfg))
                    for p, y in zip(sets, outs, strict=True)]
                times = _time(fns, on_gpu, reps, sustained)
                row.update(us=median(times), times_us=times,
                           **{"TFLOP/s": 2.0 * m * g * sweep.n * sweep.k / median(times) / 1e6})
            except Exception as e:  # a shape that fails to compile (shared memory) is data too
                row.update(us=None, check=f"FAILED: {type(e).__name__}: {str(e)[:200]}")
            rows.append(row)
        for qc in quant_candidates() if "quant" in kinds else ():
            row = {"kind": "tune_quant", "provider": qc.label(), "G": g, "M": m,
                   "config": dataclasses.asdict(qc)}
            p0 = sets[0]
            q, sc = launch.inverse_rope_group_quant(p0.o, p0.pos, p0.cos_bf16, p0.sin_bf16, g,
                                                    128, config=qc)
            rq, rs = oracle(p0, "quant", g)
            if not (_bytes_equal(q, rq) and _bytes_equal(sc, rs)):
                row.update(us=None, check="FAILED: bytes differ from the oracle")
                rows.append(row)
                continue
            fns = [(lambda p=p, qc=qc, g=g: launch.inverse_rope_group_quant(
                p.o, p.pos, p.cos_bf16, p.sin_bf16, g, 128, x_fp8=p.x, x_scale=p.xs,
                config=qc)) for p in sets]
            times = _time(fns, on_gpu, reps, sustained)
            nbytes = m * g * sweep.k * 3 + m * g * sweep.k // 128
            row.update(us=median(times), check="bytes exact",
                       **{"GB/s": nbytes / median(times) / 1e3})
            rows.append(row)
        if m <= 64 and "chain" in kinds:
            for cfg in [*fused_candidates(m, g, sweep.n), None]:
                row = {"kind": "tune_chain", "provider": f"fused {cfg.label()}" if cfg else
                       "quant+gemm", "G": g, "M": m, "N": sweep.n, "K": sweep.k,
                       "config": dataclasses.asdict(cfg) if cfg else None}
                try:
                    timed, msg = prov_chain_fp8_triton(sets, g, on_gpu, fused=cfg is not None,
                                                       config=cfg)
                    times = _time(timed, on_gpu, reps, sustained)
                    row.update(us=median(times), times_us=times, check=msg)
                except Exception as e:  # a shape that fails to compile is data too
                    row.update(us=None, check=f"FAILED: {type(e).__name__}: {str(e)[:200]}")
                rows.append(row)
        for r in rows[n_before:]:
            progress.console.print(f"{r['kind']} G={g} M={m} {r['provider']}: "
                                   f"{_fmt(r.get('us'), 1)} us  {r['check'][:120]}")
        progress.advance(task)
        del sets
    return rows


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------


def metadata(on_gpu: bool, sustained: bool = False) -> dict:
    import jax
    import torch
    import triton

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "torch": torch.__version__,
        "triton": triton.__version__, "jax": jax.__version__, "host": platform.node(),
        "device": torch.cuda.get_device_name() if on_gpu else "cpu (TRITON_INTERPRET=1)",
        "commit": os.environ.get("WOA_COMMIT") or _git_commit(),
        "source": source_digest(),
        "timing": _timing_label(sustained) if on_gpu else "wall clock",
    }
    if on_gpu:
        props = torch.cuda.get_device_properties(0)
        meta.update(sms=props.multi_processor_count, cuda=torch.version.cuda,
                    capability=".".join(map(str, torch.cuda.get_device_capability())))
    return meta


def _timing_label(sustained: bool) -> str:
    if sustained:
        return (f"CUDA-graph replays of ~{_SUSTAINED_FILL_US:.0f} us of back-to-back calls, "
                f"timed after {_SUSTAINED_WARM_S:g} s of them (sustained clock)")
    return f"CUDA-graph replays, short sequences captured to ~{_FILL_US:.0f} us per replay"


#: The code a benchmark row measures: a copied tree (the device machine's) may have no git
#: history, or a stale one, so rows also carry a digest of these sources.
_SOURCE_DIRS = ("woa_jax", "torch_bridge", "benchmarks")


def source_digest(root: str | os.PathLike | None = None) -> str:
    """sha256 (12 hex digits) of the ``.py`` files under ``_SOURCE_DIRS``, by relative path;
    ``python -m benchmarks.bench --source-digest`` prints it for the tree at hand."""
    base = pathlib.Path(root) if root is not None else pathlib.Path(__file__).parent.parent
    h = hashlib.sha256()
    for path in sorted(p for d in _SOURCE_DIRS for p in (base / d).rglob("*.py")):
        h.update(path.relative_to(base).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def print_table(rows: list[dict], console) -> None:
    from rich.table import Table

    sweep_rows = [r for r in rows if r["kind"] in ("copy", "quant", "gemm", "chain")]
    if sweep_rows:
        t = Table(title="wo_a providers (median us)")
        for c in ("provider", "G", "M", "us", "TFLOP/s | GB/s", "% ceiling", "vs BF16", "check"):
            t.add_column(c, justify="left" if c in ("provider", "check") else "right")
        for r in sweep_rows:
            thr = r.get("TFLOP/s", r.get("GB/s"))
            t.add_row(r["provider"], str(r["G"]), str(r["M"]), _fmt(r.get("us"), 1),
                      _fmt(thr, 0), _fmt(r.get("pct_ceiling"), 0),
                      _fmt(r.get("speedup_vs_bf16"), 2, "x"), r.get("check", ""))
        console.print(t)
    pre = [r for r in rows if r["kind"] == "prefill"]
    if pre:
        t = Table(title="prefill: total wo_a time")
        for c in ("chain", "G", "tokens / chunk", "median ms", "runs ms", "vs BF16"):
            t.add_column(c)
        for r in pre:
            t.add_row(r["provider"], str(r["G"]), f"{r['tokens']} / {r['chunk']}",
                      _fmt(r["total_ms"], 2), ", ".join(f"{v:.2f}" for v in r["runs_ms"]),
                      _fmt(r.get("speedup_vs_bf16"), 3, "x"))
        console.print(t)
    tune = [r for r in rows if r["kind"].startswith("tune")]
    if tune:
        best: dict[tuple, dict] = {}
        for r in tune:
            key = (r["kind"], r["G"], r["M"])
            if r.get("us") and (key not in best or r["us"] < best[key]["us"]):
                best[key] = r
        t = Table(title="tuning: best launch shape per (G, M)")
        for c in ("kind", "G", "M", "best", "us", "TFLOP/s | GB/s"):
            t.add_column(c)
        for (kind, g, m), r in sorted(best.items()):
            t.add_row(kind, str(g), str(m), r["provider"], _fmt(r["us"], 1),
                      _fmt(r.get("TFLOP/s", r.get("GB/s")), 0))
        console.print(t)


def use_tuned(path: str) -> None:
    """Use the fastest launch shapes of a ``--tune`` JSON instead of the built-in choice.

    GEMM and the fused chain: for each (G, M) the best timed shape; other M take the nearest
    tuned M (log scale) of the same G, else of any G. Quant: the best shape at the largest tuned
    M. For trying tuned shapes before they go into ``launch.gemm_config``,
    ``launch.fused_config`` and ``launch.quant_config``.
    """
    from torch_bridge.backends.triton import launch

    with open(path) as f:
        rows = [r for r in json.load(f)["rows"] if r.get("us") and r.get("config")]
    best: dict[tuple[str, int, int], dict] = {}
    for r in rows:
        key = (r["kind"], r["G"], r["M"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    gemm = {(g, m): r for (kind, g, m), r in best.items() if kind == "tune_gemm"}
    quant = sorted(((m, r["us"], r) for (kind, _, m), r in best.items() if kind == "tune_quant"),
                   key=lambda t: (t[0], -t[1]))
    def nearest(tuned):
        def lookup(m, g, n, k, block, *, wgmma=False):  # the tuned row already says which kernel
            keys = [key for key in tuned if key[0] == g] or list(tuned)
            key = min(keys, key=lambda kk: abs(math.log2(kk[1]) - math.log2(max(m, 1))))
            return launch.GemmConfig(**tuned[key]["config"])
        return lookup

    if gemm:
        launch.gemm_config = nearest(gemm)
    fused = {(g, m): r for (kind, g, m), r in best.items() if kind == "tune_chain"}
    if fused:
        launch.fused_config = nearest(fused)
    if quant:
        tuned = launch.QuantConfig(**quant[-1][2]["config"])
        launch.quant_config = lambda s: tuned


def _fmt(v, digits: int, suffix: str = "") -> str:
    return "-" if v is None else f"{v:.{digits}f}{suffix}"


def plot(rows: list[dict], path: str) -> None:
    """Throughput (TFLOP/s of the GEMM work) against M, one panel per G, one line per provider."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [r for r in rows if r["kind"] in ("gemm", "chain") and r.get("us")]
    groups = sorted({r["G"] for r in data})
    if not groups:
        raise ValueError("nothing to plot: no timed gemm/chain rows")
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, g in zip(axes[0], groups, strict=True):
        for prov in sorted({r["provider"] for r in data if r["G"] == g}):
            pts = sorted((r["M"], r["TFLOP/s"]) for r in data if r["G"] == g
                         and r["provider"] == prov)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=prov)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"G = {g}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def _ints(s: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in s.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return vals


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="woa bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=_ints, help="G values (default: 2,8,16 on GPU, 2 on CPU)")
    p.add_argument("--ms", type=_ints, help="M values (default: 1..8192 on GPU, 1,5 on CPU)")
    p.add_argument("--providers", default=",".join(PROVIDERS),
                   help=f"comma-separated subset of {','.join(PROVIDERS)}")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per row (median)")
    p.add_argument("--prefill", action="store_true",
                   help="run the 100K-token prefill scenario instead of the sweep")
    p.add_argument("--tune", action="store_true", help="sweep Triton launch shapes instead")
    p.add_argument("--sustained", action="store_true",
                   help="sweep and --tune: time at the clock the GPU holds under sustained "
                        "load (~20 ms replays after 1 s of them; a power-capped H200 slows "
                        "down under long runs of large GEMMs); GPU only, CPU runs time wall "
                        "clock either way")
    p.add_argument("--tune-kinds", default=",".join(TUNE_KINDS),
                   help=f"with --tune: comma-separated subset of {','.join(TUNE_KINDS)}")
    p.add_argument("--json", metavar="FILE", help="write rows and metadata as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw TFLOP/s against M per provider")
    p.add_argument("--tuned", metavar="FILE",
                   help="use the fastest launch shapes of a --tune JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--source-digest", action="store_true",
                   help="print the digest of this tree's sources (JSON meta 'source') and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0, or 1 if any provider failed its oracle check."""
    args = parser().parse_args(argv)
    if args.source_digest:
        print(source_digest())
        return 0
    providers = [v.strip() for v in args.providers.split(",") if v.strip()]
    unknown = sorted(set(providers) - set(PROVIDERS))
    if unknown:
        raise SystemExit(f"unknown providers {unknown}; expected a subset of {list(PROVIDERS)}")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if os.environ["TRITON_INTERPRET"] in ("", "0"):
            raise SystemExit("no GPU: set TRITON_INTERPRET=1 to run the Triton kernels on CPU")
    from rich.console import Console
    from rich.progress import Progress

    tune_kinds = tuple(k for k in args.tune_kinds.split(",") if k)
    if set(tune_kinds) - set(TUNE_KINDS):
        raise SystemExit(f"unknown --tune-kinds {sorted(set(tune_kinds) - set(TUNE_KINDS))}; "
                         f"expected a subset of {list(TUNE_KINDS)}")
    if args.sustained and args.prefill:
        raise SystemExit("--sustained applies to the sweep and --tune, not to --prefill (the "
                         "prefill runs its chunks back to back already)")
    if args.tuned:
        use_tuned(args.tuned)
    base = shapes.GPU if on_gpu else shapes.CPU
    sweep = dataclasses.replace(base, groups=args.groups or base.groups, ms=args.ms or base.ms)
    console = Console(width=max(Console().width, 150))
    meta = metadata(on_gpu, args.sustained)
    console.print(f"[bold]woa bench[/] on {meta['device']}: torch {meta['torch']}, triton "
                  f"{meta['triton']}, jax {meta['jax']}, commit {meta['commit']}")
    rows: list[dict] = []

    def save(new_rows: list[dict]) -> None:
        if args.json:  # rewritten after every shape so that a killed run keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "sweep": dataclasses.asdict(sweep),
                           "rows": rows + new_rows}, f, indent=1)

    with Progress(console=console, disable=args.no_progress, transient=True) as progress:
        copy = measure_copy(on_gpu, args.reps) if "copy" in providers or not args.tune else None
        if copy:
            rows.append(copy)
        copy_gbps = copy["GB/s"] if copy and on_gpu else None
        if args.tune:
            rows += run_tune(sweep, on_gpu=on_gpu, reps=args.reps, progress=progress,
                             seed=args.seed, kinds=tune_kinds, sustained=args.sustained)
        elif args.prefill:
            cfg = shapes.GPU_PREFILL if on_gpu else shapes.CPU_PREFILL
            if args.groups:
                cfg = dataclasses.replace(cfg, groups=args.groups)
            rows += run_prefill(sweep, cfg, on_gpu=on_gpu, progress=progress, seed=args.seed)
        else:
            rows += run_sweep(sweep, [p for p in providers if p != "copy"], on_gpu=on_gpu,
                              reps=args.reps, progress=progress, copy_gbps=copy_gbps,
                              seed=args.seed, on_shape=save, sustained=args.sustained)
    print_table(rows, console)
    save([])
    if args.plot:
        plot(rows, args.plot)
    failed = [r for r in rows if str(r.get("check", "")).startswith("FAILED")
              and r["kind"] not in ("tune_gemm", "tune_chain")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
