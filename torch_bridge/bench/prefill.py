"""The prefill scenario: one long prompt in fixed-size chunks, total ``wo_a`` time per chain.

Chunks run eagerly and back to back (as a serving engine's prefill loop runs them), timed with
device events around all chunks (wall clock on CPU); the weight stays the same throughout.
"""

from __future__ import annotations

import time

from . import problem, timing
from .providers import projection

#: The shipped layers as users call them (``WoAProjection``, BF16 fallback and FP8), and the
#: reference BF16 chain.
CHAINS = ("chain_bf16", "chain_bf16_ref", "chain_fp8")


def run_prefill(sweep: problem.Sweep, cfg: problem.Prefill, *, on_gpu: bool, progress,
                seed: int) -> list[dict]:
    """Rows of ``cfg.runs`` runs per chain and G: ``total_ms`` (median) and ``runs_ms``."""
    from torch_bridge.backends.triton import launch

    device = "cuda" if on_gpu else "cpu"
    chunks = [cfg.chunk] * (cfg.tokens // cfg.chunk)
    if cfg.tokens % cfg.chunk:
        chunks.append(cfg.tokens % cfg.chunk)
    rows = []
    task = progress.add_task("prefill", total=len(cfg.groups) * cfg.runs * len(CHAINS))
    for g in cfg.groups:
        totals: dict[str, list[float]] = {name: [] for name in CHAINS}
        for run in range(cfg.runs):
            p = problem.make_problem(sweep, g, cfg.chunk, device, seed + 100 * run)
            layer, fp8_layer = projection(p, "bf16"), projection(p, "auto")

            def fp8(s, p=p, fp8_layer=fp8_layer):
                fp8_layer(p.o[:s], p.pos[:s])

            def ref(s, p=p, g=g):
                launch.wo_a_bf16(p.o_work[:s], p.pos[:s], p.cos32, p.sin32, p.w_bf16, g,
                                 overwrite_o=True)

            def bf16(s, p=p, layer=layer):
                layer(p.o[:s], p.pos[:s])

            for name, fn in zip(CHAINS, (bf16, ref, fp8), strict=True):
                progress.update(task, description=f"prefill G={g} run {run + 1} {name}")
                for s in sorted(set(chunks)):  # compile and warm every chunk size
                    fn(s)
                totals[name].append(_total_ms(fn, chunks, on_gpu))
                progress.advance(task)
            del p, layer, fp8_layer
        for name, ms in totals.items():
            rows.append({"mode": "prefill", "kind": "chain", "provider": name, "G": g,
                         "M": cfg.tokens, "N": sweep.n, "K": sweep.k, "chunk": cfg.chunk,
                         "timer": "eager" if on_gpu else "wall", "clock": None,
                         "us": timing.median(ms) * 1e3, "runs_ms": ms, "check": "-"})
        if on_gpu:
            base = rows[-len(CHAINS)]["us"]
            for r in rows[-len(CHAINS) + 1:]:
                r["vs_bf16"] = base / r["us"]
    return rows


def _total_ms(fn, chunks: list[int], on_gpu: bool) -> float:
    import torch

    if not on_gpu:
        t0 = time.perf_counter()
        for s in chunks:
            fn(s)
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for s in chunks:
        fn(s)
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1)
