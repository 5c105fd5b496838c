"""Ready-made inputs for one tensor-parallel rank's ``wo_a`` call, in the checkpoint's layout."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from ._spec import RopeKind
from .config import DSV4Config, get_config, local_shapes, rope_cos_sin
from .quant import quantize_weight_blocks
from .rope import forward_rope

__all__ = ["WoAInputs", "example_inputs"]


class WoAInputs(NamedTuple):
    """The positional arguments of ``wo_a_fp8`` / ``wo_a_bf16``, in their order.

    Attributes:
      o: ``[T, H_l, Dh]`` bf16 attention output, rope tail rotated by each token's position.
      positions: ``[T]`` int32 token positions.
      cos_cache, sin_cache: ``[P, rope_dim / 2]`` rope tables (the first P rows of the model's).
      weight: ``[G_l * N, K]`` fp8 checkpoint weight of this rank.
      weight_scale: ``[G_l * N / B, K / B]`` float8_e8m0fnu block scales.
      num_groups: G_l, the rank's output groups.
    """

    o: np.ndarray
    positions: np.ndarray
    cos_cache: np.ndarray
    sin_cache: np.ndarray
    weight: np.ndarray
    weight_scale: np.ndarray
    num_groups: int


def attention_output(rng: np.random.Generator, positions: np.ndarray, heads: int,
                     head_dim: int, cos32, sin32, keys: int) -> np.ndarray:
    """``o [T, heads, Dh]`` fp32 as attention makes it: causal softmax sums of cached values.

    DeepSeek V4 attends with one KV head whose entries are key and value at once, so each
    entry's rope tail carries the forward rotation of its own position; query ``t`` attends to
    the ``keys`` cached entries at positions ``<= positions[t]`` with peaked softmax rows.

    Args:
      rng: the numpy generator that draws keys, values and logits.
      positions: ``[T]`` integer query positions.
      heads, head_dim: H and Dh of ``o``.
      cos32, sin32: ``[P, rd / 2]`` fp32 rope tables (numpy or JAX), ``P > positions.max()``.
      keys: cached entries to attend over.
    """
    key_pos = np.sort(rng.integers(0, int(positions.max()) + 1, size=keys))
    key_pos[0] = 0
    kv = rng.standard_normal((keys, 1, head_dim), dtype=np.float32)
    kv = forward_rope(kv, np.arange(keys, dtype=np.int32), cos32[key_pos], sin32[key_pos])
    kv = np.asarray(kv)[:, 0, :]
    logits = rng.standard_normal((len(positions), heads, keys), dtype=np.float32) * np.float32(3)
    logits = np.where(key_pos[None, None, :] > positions[:, None, None], -np.inf, logits)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("thl,ld->thd", p, kv).astype(np.float32)


def _group_weight(seed: int, group: int, n: int, k: int, block: int) -> np.ndarray:
    """One output group's real weight ``[N, K]``: ``N(0, 0.02)``, tiles spread by ``2**[-2, 2]``.

    Seeded per global group, so a rank's slice is the same whatever ``tp_size`` splits it.
    """
    rng = np.random.default_rng([seed, group])
    w = rng.standard_normal((n, k), dtype=np.float32) * np.float32(0.02)
    spread = np.exp2(rng.integers(-2, 3, size=(-(-n // block), -(-k // block)))).astype(np.float32)
    return w * spread.repeat(block, 0).repeat(block, 1)[:n, :k]


def example_inputs(*, config: str | DSV4Config = "v4-flash", tokens: int = 4, tp_size: int = 8,
                   tp_rank: int = 0, seed: int = 0, layer_kind: RopeKind | str = "compress",
                   max_position: int = 4096, rope_dtype=jnp.bfloat16,
                   fp8_dtype=ml_dtypes.float8_e4m3fn, keys: int = 64) -> WoAInputs:
    """Seeded inputs for one rank's ``wo_a`` call: ``woa_jax.wo_a_fp8(*example_inputs())`` runs.

    The weight is a real ``N(0, 0.02)`` weight quantized by ``quantize_weight_blocks``; ``o`` is
    an attention output over ``keys`` cached entries with positions below ``max_position``; the
    rope table is the model's own (``rope_cos_sin``), cut to ``max_position`` rows to stay cheap.

    Args:
      config: a name in ``DSV4_CONFIGS`` (or a ``DSV4Config``).
      tokens: T, the number of tokens.
      tp_size: tensor-parallel ranks; must divide the config's groups and heads.
      tp_rank: the rank whose heads and weight rows are returned, ``0 <= tp_rank < tp_size``.
      seed: seeds every array; the full weight and ``o`` do not depend on ``tp_size``.
      layer_kind: ``"compress"`` (YaRN table) or ``"window"``.
      max_position: P, rows of the rope table; positions are drawn from ``[0, P)``.
      rope_dtype: dtype of the tables: bf16 as AITER's op takes them, or fp32 as vLLM's.
      fp8_dtype: the weight's fp8 dtype.
      keys: cached entries that ``o`` averages over.

    Returns:
      ``WoAInputs`` of numpy arrays (ml_dtypes bf16, fp8 and E8M0 dtypes).

    Raises:
      ValueError: a count is not positive, ``tp_rank`` is outside ``[0, tp_size)``, or
        ``tp_size`` does not split the config's groups and heads.
    """
    cfg = get_config(config)
    shapes = local_shapes(cfg, tp_size)
    for what, v in (("tokens", tokens), ("max_position", max_position), ("keys", keys)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be a positive integer, got {v!r}")
    if not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, {tp_size}), got {tp_rank!r}")
    cos32, sin32 = (np.asarray(t) for t in rope_cos_sin(cfg, layer_kind, max_position))
    rng = np.random.default_rng(seed)
    positions = np.sort(rng.integers(0, max_position, size=tokens)).astype(np.int32)
    o_full = attention_output(rng, positions, cfg.num_heads, cfg.head_dim, cos32, sin32, keys)
    heads = slice(tp_rank * shapes.num_heads, (tp_rank + 1) * shapes.num_heads)
    o = o_full[:, heads].astype(ml_dtypes.bfloat16)
    g_l, n, k, b = (shapes.num_groups, shapes.group_out_features, shapes.group_in_features,
                    shapes.block_size)
    w = np.concatenate([_group_weight(seed, tp_rank * g_l + j, n, k, b) for j in range(g_l)])
    weight, weight_scale = quantize_weight_blocks(w, block=b, fp8_dtype=fp8_dtype)
    cos, sin = (t.astype(np.dtype(rope_dtype)) for t in (cos32, sin32))
    return WoAInputs(o, positions, cos, sin, weight, weight_scale, g_l)
