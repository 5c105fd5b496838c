"""``--tune``: time candidate Triton launch shapes (GEMM, quant, fused decode chain) per (G, M),
and ``--tuned``: run the sweep with the fastest shapes of a tuning run instead of the built-in
choice (``configs.gemm_config``, ``configs.wo_a_fp8_config``, ``configs.quant_config``, which the
launchers look up on every plan they build)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math

from . import problem
from .providers import chain_fp8_triton, chain_fp8_triton_2k, gemm_triton, quant_triton
from .sweep import time_calls

KINDS = ("gemm", "quant", "chain", "gemm-split", "chain-wgmma")
#: What ``--tune`` times unless told: "gemm-split" (the few-tile K splits alone, a short run)
#: is a subset of "gemm", "chain-wgmma" (the fused wgmma kernel's shapes beside the rule's and
#: the two-kernel chain) one of "chain".
DEFAULT_KINDS = KINDS[:3]


def gemm_candidates(m: int, g: int | None = None, n: int = 1024) -> list:
    """GEMM launch shapes worth timing at ``m`` tokens (``GemmConfig.label()`` names each),
    each once. Given ``g`` (and ``n``), K splits only where unsplit 64 x 128 tiles make at most
    one wave: a grid that fills the GPU gains nothing from splitting, and its splits are the
    slowest candidates to time."""
    from torch_bridge.backends.triton import configs

    out = {c.label(): c for c in _gemm_candidates(m) + wgmma_split_candidates(m)
           + narrow_candidates(m) + wave_candidates()}
    fills = g is not None and configs.programs(
        configs.GemmConfig(64, 128), m, g, n) > configs.ONE_WAVE_TILES
    return [c for c in out.values() if not (fills and c.split_k > 1)]


def narrow_candidates(m: int) -> list:
    """Unsplit tiles narrow on N (16 or 32 weight rows), so that G = 2 to 4 make a wave of
    programs without splitting K: the wgmma kernel's 64- and 128-token tiles, and up to 16
    tokens the pointer kernel's swapped tile (the wgmma kernel's swapped tile takes 64 rows or
    more)."""
    from torch_bridge.backends.triton.launch import GemmConfig as C

    out = [C(bm, bn, num_warps=bm // 16, num_stages=8, wgmma=True)
           for bm in (64, 128) if bm <= max(64, m) for bn in (16, 32)]
    if m <= 16:
        out += [C(16, bn, 1, True, 4, st) for bn in (16, 32) for st in (4, 6)]
    return out


def wave_candidates() -> list:
    """The persistent warp-specialized 64-token tiles ``configs.wave_tile`` picks from."""
    from torch_bridge.backends.triton import configs

    return [configs.GemmConfig(64, bn, num_warps=4, num_stages=st, wgmma=True,
                               programs_per_sm=1) for bn, st in configs.WAVE_TILES]


def wgmma_split_candidates(m: int) -> list:
    """The wgmma kernel with K split 1, 2, 4 and 8 ways (few tiles, G = 2 to 4): 64 x 64 and
    64 x 128 tiles, above 64 tokens 128-token tiles (8 warps, up to 4 parts: each reads the
    weight once per 128 tokens), and up to 32 tokens the swapped token tile."""
    from torch_bridge.backends.triton.launch import GemmConfig as C

    out = [C(64, bn, sk, num_warps=4, num_stages=8, wgmma=True) for bn in (64, 128)
           for sk in (1, 2, 4, 8)]
    if m > 64:
        out += [C(128, bn, sk, num_warps=8, num_stages=8, wgmma=True) for bn in (64, 128)
                for sk in (1, 2, 4)]
    if m <= 32:
        tokens = max(8, 1 << (m - 1).bit_length())
        out += [C(tokens, 64, sk, swap_ab=True, num_warps=4, num_stages=8, wgmma=True)
                for sk in (1, 2, 4, 8)]
    return out


def split_candidates(m: int, g: int, sweep: problem.Sweep) -> list:
    """The wgmma kernel's K splits, its narrow and its persistent 64-token tiles beside the
    pointer kernel's own rule for the shape (what ``gemm_config`` gives where the wgmma kernel
    cannot run), so one run ranks them."""
    from torch_bridge.backends.triton import configs

    pointer = configs.gemm_config(m, g, sweep.n, sweep.k, 128)  # V4 scale block
    return [pointer] + [c for c in wgmma_split_candidates(m) + narrow_candidates(m)
                        + wave_candidates() if c.label() != pointer.label()]


def _gemm_candidates(m: int) -> list:
    from torch_bridge.backends.triton.launch import GemmConfig as C

    if m <= 64:
        t = max(16, 1 << (m - 1).bit_length())
        out = [C(t, bn, sk, True, 4, st) for bn in (64, 128) for sk in (1, 2, 4, 8)
               for st in (4, 5)]
        out += [C(t, bn, 1, True, 4, st, tma=True) for bn in (64, 128) for st in (4, 6, 8)]
        if t == 16:
            out += [C(16, 64, 1, False, 4, 4), C(16, 64, 1, False, 4, 4, tma=True)]
        else:  # unswapped 64 x 64 pointer tiles
            out += [C(64, 64, 1, False, 4, st) for st in (4, 6)]
        out += [C(64, 128, num_warps=4, num_stages=st, wgmma=True) for st in (4, 6, 8)]
        tokens = max(8, 1 << (m - 1).bit_length())  # the swapped Hopper tile (spills at 64)
        if tokens <= 32:
            out += [C(tokens, bn, swap_ab=True, num_warps=4, num_stages=st, wgmma=True)
                    for bn in (64, 128) for st in (6, 8)]
        return out
    hopper = [C(bm, 128, num_warps=bm // 16, num_stages=st, wgmma=True, programs_per_sm=pps)
              for bm, st, pps in ((128, 4, 0), (128, 4, 1), (128, 5, 1), (64, 3, 2),
                                  (64, 4, 0), (64, 4, 2), (64, 6, 0))]
    # Few tiles (G = 2 to 4): pointer tiles with K split.
    split = [C(64, bn, sk, sw, 4, 4) for bn in (64, 128) for sk in (2, 4, 8)
             for sw in (False, True)]
    return hopper + split + [C(64, 128, 1, False, 4, 4), C(64, 128, 1, False, 4, 4, tma=True),
                     C(64, 128, 1, False, 4, 4, tma=True, programs_per_sm=2),
                     C(128, 128, 1, False, 8, 4, tma=True),
                     C(128, 128, 1, False, 8, 4, tma=True, programs_per_sm=1)]


def wo_a_fp8_candidates(m: int, g: int, n: int) -> list:
    """Launch shapes of the fused decode chain worth timing (swapped pointer-load tiles)."""
    from torch_bridge.backends.triton.launch import GemmConfig as C

    t = max(16, 1 << (m - 1).bit_length())
    splits = (1, 2) if -(-m // t) * (n // 64) * g > 64 else (4, 8)
    narrow = [C(t, bn, 1, True, nw, st) for bn in (16, 32) for nw in (4, 8) for st in (4, 6)]
    return [C(t, bn, sk, True, nw, st) for bn in (64, 128) for sk in splits for nw in (4, 8)
            for st in (4, 5)] + narrow


def wo_a_fp8_wgmma_candidates(m: int, g: int, n: int, k: int, block: int = 128) -> list:
    """Launch shapes of the fused chain on the wgmma kernel's swapped tile: the narrowest token
    tile that holds ``m`` (8 to 32; 64 spills), 64 or 128 weight rows, K split 1 to 8 ways
    while the grid stays within two waves, and the one-wave split launched as a programmatic
    dependent. A 32 x 128 tile takes eight warps: over four, Triton 3.6 spills it."""
    from torch_bridge.backends.triton import configs

    tokens = max(8, 1 << max(0, m - 1).bit_length())
    if tokens > 32:
        return []
    out = []
    for block_n in (64, 128):
        warps = 8 if tokens * block_n >= 32 * 128 else 4
        tile = configs.GemmConfig(tokens, block_n, swap_ab=True, num_warps=warps, num_stages=8,
                                  wgmma=True)
        tiles = configs.programs(tile, m, g, n)
        out += [dataclasses.replace(tile, split_k=sk) for sk in (1, 2, 4, 8)
                if tiles * sk <= 2 * configs.ONE_WAVE_TILES]
        if block_n == 64:
            sk = configs.k_split(tile, m, g, n, k // block, most=configs.ONE_WAVE_TILES)
            out.append(dataclasses.replace(tile, split_k=sk, pdl=True))
    return out


def quant_candidates() -> list:
    """Quant launch shapes worth timing; ``r1w1h1`` is one warp per (token, head), the most
    programs a decode batch can have, ``W`` whole head rows."""
    from torch_bridge.backends.triton.launch import QuantConfig as Q

    return [Q(32, 4), Q(8, 4), Q(4, 1, 1), Q(8, 1, 1), Q(16, 1, 1), Q(8, 2, 1), Q(16, 2, 1),
            Q(4, 4, 1), Q(16, 4, 1), Q(8, 4, 4), Q(2, 4, 8), Q(4, 1, 2), Q(4, 2, 2), Q(2, 1, 1),
            Q(1, 1, 1), *(Q(t, 1, 1, whole_head=True) for t in (1, 2, 4))]


def run_tune(sweep: problem.Sweep, *, on_gpu: bool, reps: int, progress, seed: int,
             kinds: tuple[str, ...] = DEFAULT_KINDS, clock="burst", graph: bool = True,
             on_shape=lambda rows: None) -> list[dict]:
    """One row per candidate of ``kinds`` at every (G, M) (the fused chain up to M = 64); a
    candidate that fails to compile or to match the oracle is a row too. "gemm-split" rows are
    GEMM rows (``--tuned`` reads them as such). ``on_shape(rows)`` gets each (G, M)'s rows as
    soon as they are timed, so a run cut short keeps the shapes it finished."""
    rows = []
    todo = [(g, m) for g in sweep.groups for m in sweep.ms]
    task = progress.add_task("tune", total=len(todo))
    for g, m in todo:
        progress.update(task, description=f"tune G={g} M={m}")
        sets = problem.make_sets(sweep, g, m, on_gpu, seed)
        shape_rows = []
        jobs = []  # (kind, label, config, provider(sets, on_gpu, config=))
        if "gemm" in kinds:
            jobs += [("gemm", c.label(), c, gemm_triton)
                     for c in gemm_candidates(m, g, sweep.n)]
        elif "gemm-split" in kinds:
            jobs += [("gemm", c.label(), c, gemm_triton) for c in split_candidates(m, g, sweep)]
        if "quant" in kinds:
            jobs += [("quant", c.label(), c, quant_triton) for c in quant_candidates()]
        if ("chain" in kinds and m <= 64) or ("chain-wgmma" in kinds and m <= 32):
            from torch_bridge.backends.triton import configs, gemm

            fused = functools.partial(chain_fp8_triton, single_kernel=True)
            shapes = ([configs.wo_a_fp8_config(m, g, sweep.n, sweep.k, 128)]
                      if "chain" not in kinds else wo_a_fp8_candidates(m, g, sweep.n))
            if on_gpu and gemm.wgmma_available(None)[0]:
                shapes += wo_a_fp8_wgmma_candidates(m, g, sweep.n, sweep.k)
            jobs += [("chain", f"fused {c.label()}", c, fused) for c in shapes]
            jobs.append(("chain", "quant+gemm", None, chain_fp8_triton_2k))
        for kind, label, cfg, provider in jobs:
            row = {"mode": "tune", "kind": kind, "provider": label, "G": g, "M": m,
                   "N": sweep.n, "K": sweep.k,
                   "config": json.dumps(dataclasses.asdict(cfg)) if cfg else None}
            try:
                calls, msg = provider(sets, on_gpu, config=cfg)
                row.update(time_calls(calls, on_gpu=on_gpu, reps=reps, graph=graph,
                                      clock=clock), check=msg)
            except Exception as e:  # a shape that fails to compile (shared memory) is data too
                row.update(us=None, check=f"FAILED: {type(e).__name__}: {str(e)[:200]}")
            shape_rows.append(row)
            us = "-" if row["us"] is None else f"{row['us']:.1f}"
            progress.console.print(f"tune {kind} G={g} M={m} {label}: {us} us  "
                                   f"{row['check'][:100]}")
        rows += shape_rows
        on_shape(shape_rows)
        progress.advance(task)
        del sets
    return rows


def use_tuned(rows: list[dict]) -> None:
    """Launch with the fastest shapes of the newest tuning run in ``rows`` (results rows).

    GEMM and the fused chain: per (G, M) the best timed shape; another M takes the nearest tuned
    M (log scale) of the same G, else of any G. Quant: the best shape at the largest tuned M.
    """
    from torch_bridge.backends.triton import configs

    tuned = [r for r in rows if r.get("mode") == "tune" and r.get("us") and r.get("config")]
    if not tuned:
        raise ValueError("no timed tuning rows with a launch shape")
    newest = max(r.get("run", "") for r in tuned)
    best: dict[tuple[str, int, int], dict] = {}
    for r in tuned:
        key = (r["kind"], int(r["G"]), int(r["M"]))
        if r.get("run", "") == newest and (key not in best or
                                            float(r["us"]) < float(best[key]["us"])):
            best[key] = r

    def config(r):
        c = r["config"]
        return json.loads(c) if isinstance(c, str) else c

    def nearest(table: dict):
        def lookup(m, g, n, k, block, **_):  # the tuned row already names its kernel
            keys = [key for key in table if key[0] == g] or list(table)
            key = min(keys, key=lambda kk: abs(math.log2(kk[1]) - math.log2(max(m, 1))))
            return configs.GemmConfig(**config(table[key]))
        return lookup

    gemm = {(g, m): r for (kind, g, m), r in best.items() if kind == "gemm"}
    fused = {(g, m): r for (kind, g, m), r in best.items() if kind == "chain"}
    quant = sorted(((m, -float(r["us"]), r) for (kind, _, m), r in best.items()
                    if kind == "quant"), key=lambda t: t[:2])
    if gemm:
        configs.gemm_config = nearest(gemm)
    if fused:
        configs.wo_a_fp8_config = nearest(fused)
    if quant:
        chosen = configs.QuantConfig(**config(quant[-1][2]))
        rule = configs.quant_config
        configs.quant_config = lambda s, *, heads=0, dependent=False: dataclasses.replace(
            chosen, pdl=rule(s, heads=heads, dependent=dependent).pdl)
