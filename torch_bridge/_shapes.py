"""A model config (or a group count) against the ``wo_a`` weight it is meant to describe.

A config or ``num_groups`` that does not tile the stored weight builds a layer of the wrong shape
that fails, or answers with wrong shapes, only at call time (V4-Pro's 16 groups on a V4-Flash
weight give N = 512). These checks run once, where a layer is built or read, and name what was
stored and what was asked; the call path never sees them.
"""

from __future__ import annotations

import woa_jax


def released_n(k: int) -> int | None:
    """N of the released DeepSeek V4 configs whose group width is ``k`` (1024 for K = 4096), or
    ``None`` for a K no released config has (scaled-down layers take any N)."""
    ns = {cfg.o_lora_rank for cfg in woa_jax.DSV4_CONFIGS.values() if cfg.group_in_features == k}
    return ns.pop() if len(ns) == 1 else None


def matching_config(rows: int, k: int, block: int | None) -> woa_jax.DSV4Config | None:
    """The released config whose whole (TP1) ``wo_a`` weight is ``[rows, k]`` in ``block``-wide
    scale blocks (any block for an unquantized weight), else ``None``."""
    for cfg in woa_jax.DSV4_CONFIGS.values():
        if (cfg.o_groups * cfg.o_lora_rank, cfg.group_in_features) == (rows, k) and block in (
                None, cfg.block_size):
            return cfg
    return None


def infer_config(rows: int, k: int, block: int | None) -> woa_jax.DSV4Config:
    """``matching_config``, else a ``ValueError`` saying what to pass instead."""
    cfg = matching_config(rows, k, block)
    if cfg is None:
        raise ValueError(f"no released DeepSeek V4 config has a {_stored(rows, k, block)} wo_a "
                         "weight; pass config= (a woa_jax.DSV4Config) or cos_cache/sin_cache")
    return cfg


def _stored(rows: int, k: int, block: int | None) -> str:
    blocks = f" in {block}x{block} scale blocks" if block else ""
    return f"[{rows}, {k}]{blocks}"


def check_wo_a(rows: int, k: int, block: int | None, num_groups: int, config, *,
               what: str) -> None:
    """Raise ``ValueError`` unless ``num_groups`` groups tile the ``[rows, k]`` weight ``what``.

    With ``config`` (a ``woa_jax.DSV4Config`` or name): the weight must be ``num_groups`` groups
    of its ``[N, K]`` in its block size, and ``num_groups`` must divide its ``o_groups`` (a
    tensor-parallel slice holds some of them). Without one, a K that the released configs have
    (4096) holds groups of their N (1024): a wrong ``num_groups`` would otherwise pass as
    another N. ``block`` is the scale's block edge, ``None`` for an unquantized weight.
    """
    if config is None:
        n = released_n(k)
        if n is not None and rows != num_groups * n:
            held = f"{rows // n} group(s)" if rows % n == 0 else f"no whole groups of N={n}"
            raise ValueError(
                f"{what} is {_stored(rows, k, block)}: num_groups={num_groups} would make "
                f"N={rows / num_groups:g}, but every released DeepSeek V4 config with K={k} has "
                f"N={n}, so it holds {held}; pass that num_groups, or config= for other shapes")
        return
    cfg = woa_jax.get_config(config)
    n, kc, b = cfg.o_lora_rank, cfg.group_in_features, cfg.block_size
    fits = (rows, k) == (num_groups * n, kc) and block in (None, b) and (
        cfg.o_groups % num_groups == 0)
    if fits:
        return
    other = matching_config(rows, k, block)
    hint = f" (that is {other.name}'s shape)" if other is not None and other != cfg else ""
    split = "" if num_groups == cfg.o_groups else f" of its {cfg.o_groups}"
    fix = "pass the checkpoint's config"
    held = rows // n if rows % n == 0 else 0
    if other is None and (k, block) in ((kc, b), (kc, None)) and held and not cfg.o_groups % held:
        fix += f", or num_groups={held} for one rank's slice of {held} group(s)"
    raise ValueError(
        f"{what} is {_stored(rows, k, block)}{hint}, but config {cfg.name} with "
        f"num_groups={num_groups}{split} expects {_stored(num_groups * n, kc, b)} "
        f"({num_groups} group(s) of N={n}, K={kc}); {fix}")
