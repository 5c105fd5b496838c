"""Ready-made inputs for one tensor-parallel rank's ``wo_a`` call, in the checkpoint's layout.

Made in two steps, so that another array library can supply the random numbers (the benchmark
harness draws them on the GPU with torch): ``draw_rules`` states the shape and distribution of
every random array, and ``inputs_from_draws`` turns the drawn arrays into the inputs with JAX, on
the device that holds them. ``example_inputs`` does both with numpy's generator.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from ._spec import RopeKind, check_fp8_dtype
from .config import DSV4Config, get_config, local_shapes, rope_cos_sin
from .quant import quantize_blocks
from .rope import _rotate

__all__ = ["Draw", "Draws", "WoAInputs", "attention_output", "draw_rules", "example_inputs",
           "inputs_from_draws"]

#: Attention logits are N(0, LOGIT_STD**2): peaked softmax rows.
LOGIT_STD = 3.0
#: The real weight is N(0, WEIGHT_STD**2), each block tile scaled by 2**s, s in TILE_SPREAD_LOG2.
WEIGHT_STD = 0.02
TILE_SPREAD_LOG2 = (-2, 2)


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


class Draw(NamedTuple):
    """One random array: fp32 N(0, 1) when ``high`` is None, else int32 uniform in
    ``[low, high)``."""

    shape: tuple[int, ...]
    low: int = 0
    high: int | None = None

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """The array drawn with numpy's generator."""
        if self.high is None:
            return rng.standard_normal(self.shape, dtype=np.float32)
        return rng.integers(self.low, self.high, size=self.shape, dtype=np.int32)


class Draws(NamedTuple):
    """The random arrays the inputs are made of: ``Draw`` rules (``draw_rules``) or the arrays
    drawn by them (numpy arrays, or JAX arrays on any device)."""

    positions: Any  # [T] token positions in [0, P)
    key_positions: Any  # [keys] positions of the cached entries, in [0, P)
    values: Any  # [keys, Dh] the cached entries (key and value at once), N(0, 1)
    logits: Any  # [T, H_l, keys] attention logits / LOGIT_STD, N(0, 1)
    weight: Any  # [G_l * N, K] the real weight / WEIGHT_STD, N(0, 1)
    spread: Any  # [G_l * N / B, K / B] log2 of each weight tile's scale, in TILE_SPREAD_LOG2


def _attention_rules(tokens: int, heads: int, head_dim: int, keys: int, rows: int) -> list[Draw]:
    """The draws of ``attention_output``: key positions, values, logits."""
    return [Draw((keys,), 0, rows), Draw((keys, head_dim)), Draw((tokens, heads, keys))]


def draw_rules(config: str | DSV4Config = "v4-flash", *, tokens: int = 4, tp_size: int = 8,
               max_position: int = 4096, keys: int = 64) -> Draws:
    """The ``Draw`` of every random array of one rank's inputs (arguments as ``example_inputs``).

    Raises:
      ValueError: a count is not positive, or ``tp_size`` does not split the config's groups
        and heads.
    """
    cfg = get_config(config)
    shapes = local_shapes(cfg, tp_size)
    for what, v in (("tokens", tokens), ("max_position", max_position), ("keys", keys)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be a positive integer, got {v!r}")
    lo, hi = TILE_SPREAD_LOG2
    return Draws(Draw((tokens,), 0, max_position),
                 *_attention_rules(tokens, shapes.num_heads, cfg.head_dim, keys, max_position),
                 Draw(shapes.weight_shape), Draw(shapes.scale_shape, lo, hi + 1))


@jax.jit
def _attend(logits, positions, key_positions, values, cos32, sin32):
    """fp32 ``o [T, H, Dh]``: each token's causal softmax average of the cached values."""
    key_pos = key_positions.at[0].set(0)  # an entry at position 0 keeps every row non-empty
    kv = _rotate(values[:, None, :], key_pos, cos32, sin32, sign=+1)[:, 0, :]
    z = jnp.where(key_pos[None, None, :] > positions[:, None, None], -jnp.inf,
                  logits * jnp.float32(LOGIT_STD))
    p = jax.nn.softmax(z, axis=-1)
    return jnp.einsum("thl,ld->thd", p, kv, precision=jax.lax.Precision.HIGHEST)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _weight(normal, spread, block: int, fp8_dtype):
    """The real weight of the draws, quantized into ``block`` tiles as checkpoints are."""
    rows, k = normal.shape
    scale = jax.lax.bitcast_convert_type((spread.astype(jnp.int32) + 127) << 23, jnp.float32)
    scale = jnp.repeat(jnp.repeat(scale, block, 0), block, 1)[:rows, :k]
    return quantize_blocks(normal * jnp.float32(WEIGHT_STD) * scale, block, fp8_dtype)


def inputs_from_draws(draws: Draws, cos32, sin32, num_groups: int, *, block: int = 128,
                      fp8_dtype=ml_dtypes.float8_e4m3fn, rope_dtype=jnp.bfloat16) -> WoAInputs:
    """The inputs made of ``draws`` (arrays drawn by ``draw_rules``), as JAX arrays.

    Positions are sorted; ``o`` is the bf16 attention output of each token over the cached
    entries at or before its position (entry 0 moved to position 0); the weight is quantized by
    ``quantize_weight_blocks``' rule. Runs where the draws live.

    Args:
      draws: the drawn arrays, fp32 normals and int32 integers.
      cos32, sin32: ``[P, rope_dim / 2]`` fp32 rope tables (``rope_cos_sin``).
      num_groups: G_l, the rank's output groups.
      block: the weight's tile edge (the config's ``block_size``).
      fp8_dtype: the weight's fp8 dtype.
      rope_dtype: dtype of the returned tables.
    """
    fp8 = check_fp8_dtype(fp8_dtype)
    positions = jnp.sort(jnp.asarray(draws.positions, jnp.int32))
    o = _attend(draws.logits, positions, draws.key_positions, draws.values, cos32, sin32)
    weight, byte = _weight(draws.weight, draws.spread, block, fp8)
    cos, sin = (jnp.asarray(t).astype(rope_dtype) for t in (cos32, sin32))
    return WoAInputs(o.astype(jnp.bfloat16), positions, cos, sin, weight,
                     jax.lax.bitcast_convert_type(byte, jnp.float8_e8m0fnu), num_groups)


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
      cos32, sin32: ``[P, rd / 2]`` fp32 rope tables (numpy or JAX); entries sit below P.
      keys: cached entries to attend over.
    """
    rules = _attention_rules(len(positions), heads, head_dim, keys, int(cos32.shape[0]))
    key_positions, values, logits = (r.sample(rng) for r in rules)
    pos = jnp.asarray(np.asarray(positions), jnp.int32)
    return np.asarray(_attend(logits, pos, key_positions, values, cos32, sin32))


def _numpy_draws(rules: Draws, seed: int, tp_size: int, tp_rank: int, groups: int) -> Draws:
    """The draws of ``example_inputs``: ``o`` and each global group's weight tiles are the same
    whatever ``tp_size`` splits them."""
    rng = np.random.default_rng(seed)
    positions, key_positions, values = (r.sample(rng) for r in rules[:3])
    t, h, keys = rules.logits.shape
    logits = Draw((t, h * tp_size, keys)).sample(rng)[:, tp_rank * h:(tp_rank + 1) * h]

    def per_group(rule: Draw) -> Draw:  # one group's rows of a [G_l * rows, cols] rule
        return rule._replace(shape=(rule.shape[0] // groups, *rule.shape[1:]))

    parts = []
    for j in range(groups):  # seeded per global group
        g_rng = np.random.default_rng([seed, tp_rank * groups + j])
        parts.append((per_group(rules.weight).sample(g_rng), per_group(rules.spread).sample(g_rng)))
    weight, spread = (np.concatenate(p) for p in zip(*parts, strict=True))
    return Draws(positions, key_positions, values, np.ascontiguousarray(logits), weight, spread)


def example_inputs(*, config: str | DSV4Config = "v4-flash", tokens: int = 4, tp_size: int = 8,
                   tp_rank: int = 0, seed: int = 0, layer_kind: RopeKind | str = "compress",
                   max_position: int = 4096, rope_dtype=jnp.bfloat16,
                   fp8_dtype=ml_dtypes.float8_e4m3fn, keys: int = 64) -> WoAInputs:
    """Seeded inputs for one rank's ``wo_a`` call: ``woa_jax.wo_a_fp8(*example_inputs())`` runs.

    The weight is a real ``N(0, 0.02)`` weight, its tiles spread by ``2**[-2, 2]``, quantized by
    ``quantize_weight_blocks``' rule; ``o`` is an attention output over ``keys`` cached entries
    with positions below ``max_position``; the rope table is the model's own (``rope_cos_sin``),
    cut to ``max_position`` rows to stay cheap. ``draw_rules`` and ``inputs_from_draws`` state
    these rules.

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
    rules = draw_rules(cfg, tokens=tokens, tp_size=tp_size, max_position=max_position, keys=keys)
    if not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, {tp_size}), got {tp_rank!r}")
    cos32, sin32 = rope_cos_sin(cfg, layer_kind, max_position)
    groups = cfg.o_groups // tp_size
    draws = _numpy_draws(rules, seed, tp_size, tp_rank, groups)
    out = inputs_from_draws(draws, cos32, sin32, groups, block=cfg.block_size,
                            fp8_dtype=fp8_dtype, rope_dtype=rope_dtype)
    return WoAInputs(*(np.asarray(a) for a in out[:-1]), groups)
