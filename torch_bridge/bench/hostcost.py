"""``--host-cost``: host time per eager call, calls back to back with no wait in between.

Each public op (also given its output buffers) and the layer object (FP8 chain and BF16
fallback) beside what a torch user compares them with: one ``torch._scaled_mm`` (sm_90),
``torch.bmm`` and a bare Triton launch.
The first call (validation, plans, compilation) is not timed; later calls with the same shapes
are. On a GPU the device work queues behind the host, so the figure is the host's alone while
the host is slower than the device; on CPU the Triton rows run the interpreter.
"""

from __future__ import annotations

from . import problem, timing
from .problem import Skip
from .providers import projection

REFERENCE = "torch._scaled_mm"


def _triton_noop():
    import triton
    import triton.language as tl

    @triton.jit
    def store_one(ptr):
        tl.store(ptr, 1)

    return store_one


def _calls(p: problem.Problem, on_gpu: bool) -> dict:
    """``{name: zero-argument call}`` in the order of the table."""
    import torch

    import torch_bridge as tb
    from torch_bridge.backends.torch_ref import e8m0_decode

    w2, ws2 = p.w.flatten(0, 1), p.ws.flatten(0, 1)
    fp8_layer, bf16_layer = projection(p, "auto"), projection(p, "bf16")
    flag = torch.zeros(1, dtype=torch.int32, device=p.o.device)
    noop = _triton_noop()
    xb = p.x.float().to(torch.bfloat16).transpose(0, 1).contiguous()  # [G, M, K]
    wb = p.w_bf16.transpose(1, 2)  # [G, K, N]

    def scaled_mm():
        if not on_gpu or torch.cuda.get_device_capability() != (9, 0):
            raise Skip("blockwise torch._scaled_mm runs on sm_90 only")
        m = -(-p.m // 4) * 4
        xg = torch.zeros((m, p.x.shape[2]), dtype=p.x.dtype, device=p.x.device)
        xg[:p.m] = p.x[:, 0]
        sa = torch.ones((m, p.x.shape[2] // 128), dtype=torch.float32, device=p.x.device)
        sa = sa.t().contiguous().t()
        sb = e8m0_decode(p.ws[0]).contiguous().t()
        return lambda: torch._scaled_mm(xg, p.w[0].t(), scale_a=sa, scale_b=sb,
                                        out_dtype=torch.bfloat16)

    q, sc, y = torch.empty_like(p.x), torch.empty_like(p.xs), torch.empty(
        (p.m, p.g, p.w.shape[1]), dtype=torch.bfloat16, device=p.x.device)
    return {
        "inverse_rope_group_quant": lambda: lambda: tb.inverse_rope_group_quant(
            p.o, p.pos, p.cos_bf16, p.sin_bf16, p.g, 128),
        "inverse_rope_group_quant, buffers": lambda: lambda: tb.inverse_rope_group_quant(
            p.o, p.pos, p.cos_bf16, p.sin_bf16, p.g, 128, x_fp8=q, x_scale=sc),
        "batched_gemm_a8w8_mxscale": lambda: lambda: tb.batched_gemm_a8w8_mxscale(
            p.x, p.w, p.xs, p.ws),
        "batched_gemm_a8w8_mxscale, out": lambda: lambda: tb.batched_gemm_a8w8_mxscale(
            p.x, p.w, p.xs, p.ws, out=y),
        "wo_a_fp8": lambda: lambda: tb.wo_a_fp8(p.o, p.pos, p.cos32, p.sin32, w2, ws2, p.g),
        "wo_a_bf16": lambda: lambda: tb.wo_a_bf16(p.o, p.pos, p.cos32, p.sin32, w2, ws2, p.g),
        "WoAProjection FP8": lambda: lambda: fp8_layer(p.o, p.pos),
        "WoAProjection BF16": lambda: lambda: bf16_layer(p.o, p.pos),
        REFERENCE: scaled_mm,
        "torch.bmm": lambda: lambda: torch.bmm(xb, wb),
        "bare Triton launch": lambda: lambda: noop[(1,)](flag),
    }


def run_host_cost(sweep: problem.Sweep, *, on_gpu: bool, reps: int, seed: int,
                  progress) -> list[dict]:
    """One row per call and (G, M): ``us`` is the host time per call (median of ``reps``).

    The repetitions go round the calls in turn (one timing of each per round), so drift of the
    host's speed during the run reaches every call alike instead of the ones timed first.
    """
    import torch

    sync = torch.cuda.synchronize if on_gpu else None
    calls = 200 if on_gpu else 3
    rounds = reps if on_gpu else 3
    rows = []
    todo = [(g, m) for g in sweep.groups for m in sweep.ms]
    task = progress.add_task("host cost", total=len(todo))
    for g, m in todo:
        progress.update(task, description=f"host cost G={g} M={m}")
        p = problem.make_problem(sweep, g, m, "cuda" if on_gpu else "cpu", seed)
        builders = _calls(p, on_gpu)
        fns, skipped = {}, {}
        for name, build in builders.items():
            try:
                fns[name] = build()
            except Skip as e:
                skipped[name] = e
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name] += timing.host_us(fn, calls=calls, reps=1, sync=sync)
        new = []
        for name in builders:
            row = {"mode": "host_cost", "kind": "host", "provider": name, "G": g, "M": m,
                   "N": sweep.n, "K": sweep.k, "timer": "host", "clock": None,
                   "calls": calls}
            if name in skipped:
                row.update(us=None, check=f"skipped: {skipped[name]}")
            else:
                row.update(us=timing.median(times[name]), times_us=times[name], check="-")
            new.append(row)
        ref = next((r["us"] for r in new if r["provider"] == REFERENCE and r["us"]), None)
        for r in new:
            if ref and r["us"] and r["provider"] != REFERENCE:
                r["vs_scaled_mm"] = r["us"] / ref
        rows += new
        progress.advance(task)
    return rows
