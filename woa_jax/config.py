"""DeepSeek V4 model shapes, tensor-parallel splits and RoPE tables (docs/NUMERICS.md 1, 2)."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from ._spec import RopeKind, as_enum


@dataclasses.dataclass(frozen=True)
class DSV4Config:
    """The fields of a DeepSeek V4 ``config.json`` that the ``wo_a`` path depends on."""

    name: str
    hidden_size: int
    num_heads: int
    o_groups: int
    num_layers: int
    q_lora_rank: int
    head_dim: int = 512
    rope_dim: int = 64
    o_lora_rank: int = 1024
    #: Weight quant block edge: 128 (128x128 blocks) or 32 (V4.1, 32x32 blocks).
    block_size: int = 128
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    original_max_position_embeddings: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    max_position_embeddings: int = 1048576

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.o_groups

    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope_dim

    @property
    def group_in_features(self) -> int:
        """K: one group's input width, ``heads_per_group * head_dim`` (4096)."""
        return self.heads_per_group * self.head_dim

    @property
    def wo_b_in_features(self) -> int:
        return self.o_groups * self.o_lora_rank


DSV4_CONFIGS: dict[str, DSV4Config] = {
    "v4-flash": DSV4Config(
        name="v4-flash", hidden_size=4096, num_heads=64, o_groups=8, num_layers=43,
        q_lora_rank=1024,
    ),
    "v4-pro": DSV4Config(
        name="v4-pro", hidden_size=7168, num_heads=128, o_groups=16, num_layers=61,
        q_lora_rank=1536,
    ),
    "v4.1-flash": DSV4Config(
        name="v4.1-flash", hidden_size=5120, num_heads=64, o_groups=8, num_layers=40,
        q_lora_rank=1280, block_size=32,
    ),
}


def get_config(name: str | DSV4Config) -> DSV4Config:
    if isinstance(name, DSV4Config):
        return name
    try:
        return DSV4_CONFIGS[name]
    except KeyError:
        raise ValueError(
            f"unknown config {name!r}; expected one of {', '.join(DSV4_CONFIGS)}"
        ) from None


@dataclasses.dataclass(frozen=True)
class LocalShapes:
    """Per-rank shapes of the ``wo_a`` projection under tensor parallelism."""

    tp: int
    num_heads: int  # H_l
    num_groups: int  # G_l
    group_in_features: int  # K
    group_out_features: int  # N
    block_size: int
    #: 2-D checkpoint weight slice ``[G_l * N, K]``.
    weight_shape: tuple[int, int]
    #: Weight scale slice ``[G_l * N / B, K / B]``.
    scale_shape: tuple[int, int]
    #: Activation ``o [T, H_l, head_dim]`` per token.
    o_shape_per_token: tuple[int, int]


def local_shapes(config: DSV4Config | str, tp: int) -> LocalShapes:
    """Shapes one tensor-parallel rank holds. Raises when the split would drop groups or heads.

    Upstream computes ``o_groups // tp`` without a check, so ``tp=3`` on V4-Flash silently keeps
    2 of 8/3 groups per rank; here that is a ``ValueError``.
    """
    cfg = get_config(config)
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    if cfg.o_groups % tp != 0:
        raise ValueError(
            f"{cfg.name}: o_groups={cfg.o_groups} is not divisible by tp={tp}; tensor parallelism "
            f"splits whole groups, so tp must divide {cfg.o_groups}"
        )
    if cfg.num_heads % tp != 0:
        raise ValueError(f"{cfg.name}: num_heads={cfg.num_heads} is not divisible by tp={tp}")
    g_l = cfg.o_groups // tp
    k = cfg.group_in_features
    n = cfg.o_lora_rank
    b = cfg.block_size
    return LocalShapes(
        tp=tp,
        num_heads=cfg.num_heads // tp,
        num_groups=g_l,
        group_in_features=k,
        group_out_features=n,
        block_size=b,
        weight_shape=(g_l * n, k),
        scale_shape=(g_l * n // b, k // b),
        o_shape_per_token=(cfg.num_heads // tp, cfg.head_dim),
    )


def _yarn_inv_freq(rope_dim: int, base: float, factor: float, original: int,
                   beta_fast: float, beta_slow: float) -> np.ndarray:
    half = rope_dim // 2
    j = np.arange(half, dtype=np.float32)
    pos_freqs = np.power(np.float32(base), (np.float32(2) * j) / np.float32(rope_dim))
    extrap = (np.float32(1) / pos_freqs).astype(np.float32)
    interp = (np.float32(1) / (np.float32(factor) * pos_freqs)).astype(np.float32)

    def corr(rotations: float) -> float:  # float64, as upstream's Python math
        return rope_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((j - np.float32(low)) / np.float32(high - low), 0, 1).astype(np.float32)
    return (interp * ramp + extrap * (np.float32(1) - ramp)).astype(np.float32)


def rope_inv_freq(config: DSV4Config | str, layer_kind: RopeKind | str) -> np.ndarray:
    """The ``[rope_dim / 2]`` fp32 inverse frequencies of one layer kind."""
    cfg = get_config(config)
    kind = as_enum(RopeKind, layer_kind, "layer_kind")
    if kind is RopeKind.COMPRESS:
        return _yarn_inv_freq(cfg.rope_dim, cfg.compress_rope_theta, cfg.rope_factor,
                              cfg.original_max_position_embeddings, cfg.beta_fast, cfg.beta_slow)
    # factor 1: interp == extrap, the ramp drops out and this is plain RoPE.
    return _yarn_inv_freq(cfg.rope_dim, cfg.rope_theta, 1.0, cfg.max_position_embeddings,
                          cfg.beta_fast, cfg.beta_slow)


def rope_table_rows(config: DSV4Config | str, layer_kind: RopeKind | str) -> int:
    """P: rows of the cos/sin cache (1,048,576 for both kinds in every released config)."""
    cfg = get_config(config)
    kind = as_enum(RopeKind, layer_kind, "layer_kind")
    if kind is RopeKind.COMPRESS:
        return int(cfg.original_max_position_embeddings * cfg.rope_factor)
    return cfg.max_position_embeddings


def rope_cos_sin(config: DSV4Config | str, layer_kind: RopeKind | str,
                 max_positions: int | None = None, dtype=jnp.float32):
    """Cos/sin tables as upstream builds them, as two ``[P, rope_dim / 2]`` arrays.

    Args:
      config: a ``DSV4Config`` or a name in ``DSV4_CONFIGS``.
      layer_kind: ``"window"`` (theta 10000) or ``"compress"`` (theta 160000, YaRN factor 16,
        original 65536, beta 32/1). mscale is 1 for both.
      max_positions: keep only the first rows (default: all P = 1,048,576).
      dtype: output dtype; AITER's op wants ``o``'s dtype (bf16), vLLM's paths fp32.

    Returns:
      ``(cos [P, 32], sin [P, 32])``. Angles are ``fp32(t) * inv_freq`` in fp32 and cos/sin are
      numpy's fp32 functions; device libraries differ in the last bits for large angles, so
      bit-exact tests must pass the same table to every implementation.
    """
    cfg = get_config(config)
    rows = rope_table_rows(cfg, layer_kind)
    if max_positions is not None:
        if max_positions < 1 or max_positions > rows:
            raise ValueError(f"max_positions must be in [1, {rows}], got {max_positions}")
        rows = max_positions
    inv_freq = rope_inv_freq(cfg, layer_kind)
    t = np.arange(rows, dtype=np.float32)
    freqs = np.outer(t, inv_freq).astype(np.float32)
    return jnp.asarray(np.cos(freqs), dtype=dtype), jnp.asarray(np.sin(freqs), dtype=dtype)
