"""Tensor-parallel ``wo_a -> wo_b`` (the attention output projection after ``wo_a``).

``wo_b`` is row-parallel: rank ``r`` of ``tp`` holds whole ``wo_a`` groups
``[r * G_l, (r+1) * G_l)`` (``G_l = o_groups / tp``) and the matching ``wo_b`` input columns
``[r * G_l * N, (r+1) * G_l * N)``, computes ``z = wo_a(o_l)`` locally and a partial
``y_r = wo_b_r(z_l)``, and the ranks sum the partials. Summation contract: every partial is fp32,
the reduction is fp32 and the one cast to the output dtype (bf16) happens after it, so a TP result
differs from TP1 only by fp32 summation order.

The 1 x 128 activation quant of ``z`` needs no cross-rank data: ``G_l * N`` is a multiple of the
block, so every rank quantizes exactly the 128-lane groups TP1 would (same fp8 bytes, same scales).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import checks
from ._spec import AITER_AMAX_FLOOR, QuantSemantics, as_enum
from .config import DSV4Config, LocalShapes, get_config, local_shapes
from .quant import e8m0_from_scale
from .wo_b import ProjectionPath, wo_b_bf16, wo_b_fp8
from .woa import wo_a_bf16, wo_a_fp8

#: Mesh axis name the sharded functions use unless told otherwise.
TP_AXIS = "tp"


def wo_a_wo_b_partial(o, positions, cos_cache, sin_cache, wo_a_weight, wo_a_weight_scale,
                      wo_b_weight, wo_b_weight_scale, num_groups: int, *,
                      path: ProjectionPath | str = ProjectionPath.FP8,
                      amax_floor: float = AITER_AMAX_FLOOR,
                      semantics: QuantSemantics | str = QuantSemantics.FUSED):
    """One rank's share: ``wo_a`` on its groups (bf16 ``z``), then its fp32 ``wo_b`` partial.

    Args:
      o: ``[T, H_l, Dh]`` bf16, this rank's heads.
      positions, cos_cache, sin_cache: as for ``wo_a_fp8`` / ``wo_a_bf16``.
      wo_a_weight, wo_a_weight_scale: ``[G_l * N, K]`` fp8 and ``[G_l * N / B, K / B]`` scales.
      wo_b_weight, wo_b_weight_scale: ``[hidden, G_l * N]`` fp8 and ``[hidden / B, G_l * N / B]``
        scales.
      num_groups: G_l, the groups this rank holds.
      path: ``"fp8"`` or ``"bf16"`` for both projections.
      amax_floor, semantics: FP8 quantizer options (both quantizers use ``amax_floor``).

    Returns:
      ``[T, hidden]`` fp32 partial sum (the full result when the rank holds every group).
    """
    mode = as_enum(ProjectionPath, path, "path")
    checks.check_amax_floor(amax_floor)
    if mode is ProjectionPath.FP8:
        z = wo_a_fp8(o, positions, cos_cache, sin_cache, wo_a_weight, wo_a_weight_scale, num_groups,
                     amax_floor=amax_floor, semantics=semantics, dtype=jnp.bfloat16)
        z = z.reshape(z.shape[0], -1)
        return wo_b_fp8(z, wo_b_weight, wo_b_weight_scale, amax_floor=amax_floor, dtype=jnp.float32)
    z = wo_a_bf16(o, positions, cos_cache, sin_cache, wo_a_weight, wo_a_weight_scale, num_groups)
    return wo_b_bf16(z.reshape(z.shape[0], -1), wo_b_weight, wo_b_weight_scale, dtype=jnp.float32)


def wo_a_wo_b(o, positions, cos_cache, sin_cache, wo_a_weight, wo_a_weight_scale, wo_b_weight,
              wo_b_weight_scale, num_groups: int, *,
              path: ProjectionPath | str = ProjectionPath.FP8,
              amax_floor: float = AITER_AMAX_FLOOR,
              semantics: QuantSemantics | str = QuantSemantics.FUSED, dtype=jnp.bfloat16):
    """The TP1 attention output ``[T, hidden]``: ``wo_a_wo_b_partial`` cast once to ``dtype``."""
    y = wo_a_wo_b_partial(o, positions, cos_cache, sin_cache, wo_a_weight, wo_a_weight_scale,
                          wo_b_weight, wo_b_weight_scale, num_groups, path=path,
                          amax_floor=amax_floor, semantics=semantics)
    return y.astype(dtype)


@dataclasses.dataclass(frozen=True)
class TPShard:
    """What rank ``rank`` of ``tp`` holds; the slices index the full (TP1) tensors."""

    tp: int
    rank: int
    local: LocalShapes
    #: ``o``'s head axis ``[T, H, Dh]``.
    heads: slice
    #: ``wo_a.weight`` rows and ``wo_a.scale`` rows.
    wo_a_rows: slice
    wo_a_scale_rows: slice
    #: ``wo_b.weight`` columns and ``wo_b.scale`` columns.
    wo_b_cols: slice
    wo_b_scale_cols: slice


def tp_shard(config: DSV4Config | str, tp: int, rank: int) -> TPShard:
    """Slices of rank ``rank`` under ``tp``-way tensor parallelism.

    Raises ``ValueError`` when ``o_groups`` or ``num_heads`` is not divisible by ``tp`` (from
    ``local_shapes``), when ``hidden_size`` or ``o_lora_rank`` is not a whole number of weight
    blocks, or when ``rank`` is outside ``[0, tp)``.
    """
    cfg = get_config(config)
    loc = local_shapes(cfg, tp)
    if not isinstance(rank, int) or not 0 <= rank < tp:
        raise ValueError(f"rank must be an integer in [0, {tp}), got {rank!r}")
    b = loc.block_size
    if cfg.hidden_size % b != 0:
        raise ValueError(
            f"{cfg.name}: hidden_size={cfg.hidden_size} is not a multiple of the {b}-wide weight "
            "block; wo_b's scale rows would not tile it"
        )
    if cfg.o_lora_rank % b != 0:
        raise ValueError(
            f"{cfg.name}: o_lora_rank={cfg.o_lora_rank} is not a multiple of the {b}-wide block; "
            "a rank's wo_b columns would split a scale block"
        )
    rows = loc.num_groups * loc.group_out_features  # G_l * N
    return TPShard(
        tp=tp, rank=rank, local=loc,
        heads=slice(rank * loc.num_heads, (rank + 1) * loc.num_heads),
        wo_a_rows=slice(rank * rows, (rank + 1) * rows),
        wo_a_scale_rows=slice(rank * rows // b, (rank + 1) * rows // b),
        wo_b_cols=slice(rank * rows, (rank + 1) * rows),
        wo_b_scale_cols=slice(rank * rows // b, (rank + 1) * rows // b),
    )


def check_tp_weights(config: DSV4Config | str, wo_a_weight, wo_a_weight_scale, wo_b_weight,
                     wo_b_weight_scale) -> None:
    """Require the full (TP1) tensors to have the shapes ``config`` implies."""
    cfg = get_config(config)
    b, gn = cfg.block_size, cfg.o_groups * cfg.o_lora_rank
    expect = {
        "wo_a weight": (wo_a_weight, (gn, cfg.group_in_features)),
        "wo_a scale": (wo_a_weight_scale, (-(-gn // b), cfg.group_in_features // b)),
        "wo_b weight": (wo_b_weight, (cfg.hidden_size, gn)),
        "wo_b scale": (wo_b_weight_scale, (cfg.hidden_size // b, gn // b)),
    }
    for what, (t, shape) in expect.items():
        got = tuple(int(d) for d in t.shape)
        if got != shape:
            raise ValueError(f"{cfg.name}: {what} has shape {got}, expected {shape}")


def shard_wo_a_wo_b(wo_a_weight, wo_a_weight_scale, wo_b_weight, wo_b_weight_scale, shard: TPShard):
    """One rank's ``(wo_a weight, wo_a scale, wo_b weight, wo_b scale)`` views of the full tensors.

    Uses only basic slicing, so it works on numpy, JAX and torch tensors (torch gives views).
    """
    return (wo_a_weight[shard.wo_a_rows], wo_a_weight_scale[shard.wo_a_scale_rows],
            wo_b_weight[:, shard.wo_b_cols], wo_b_weight_scale[:, shard.wo_b_scale_cols])


def _shard_map():
    """``jax.shard_map`` (jax >= 0.7) or the older ``jax.experimental.shard_map.shard_map``."""
    sm = getattr(jax, "shard_map", None)
    if sm is None:  # pragma: no cover - jax < 0.7
        from jax.experimental.shard_map import shard_map as sm
    return sm


def tp_mesh(tp: int, *, devices=None, axis: str = TP_AXIS) -> jax.sharding.Mesh:
    """A 1-D ``Mesh`` of the first ``tp`` devices (default ``jax.devices()``) named ``axis``.

    On CPU, more devices come from ``XLA_FLAGS=--xla_force_host_platform_device_count=<n>`` set
    before JAX is imported.
    """
    devs = list(jax.devices() if devices is None else devices)
    if not isinstance(tp, int) or tp < 1 or tp > len(devs):
        raise ValueError(
            f"tp={tp!r} needs that many devices, {len(devs)} available (on CPU set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=<n> before importing jax)"
        )
    return jax.sharding.Mesh(np.array(devs[:tp]), (axis,))


@functools.lru_cache(maxsize=32)
def _tp_fn(mesh, axis: str, g_l: int, mode: ProjectionPath, amax_floor: float,
           semantics: QuantSemantics, dtype: np.dtype):
    """The jitted ``shard_map`` program, cached per mesh and options (not per call)."""
    from jax.sharding import PartitionSpec as P

    def body(o_l, pos, cos, sin, wa, sa, wb, sb):
        y = wo_a_wo_b_partial(o_l, pos, cos, sin, wa, sa, wb, sb, g_l, path=mode,
                              amax_floor=amax_floor, semantics=semantics)
        return jax.lax.psum(y, axis).astype(dtype)

    return jax.jit(_shard_map()(
        body, mesh=mesh,
        in_specs=(P(None, axis, None), P(), P(), P(), P(axis, None), P(axis, None),
                  P(None, axis), P(None, axis)),
        out_specs=P(),
    ))


def wo_a_wo_b_tp(mesh: jax.sharding.Mesh, o, positions, cos_cache, sin_cache, wo_a_weight,
                 wo_a_weight_scale, wo_b_weight, wo_b_weight_scale, config: DSV4Config | str, *,
                 axis: str = TP_AXIS, path: ProjectionPath | str = ProjectionPath.FP8,
                 amax_floor: float = AITER_AMAX_FLOOR,
                 semantics: QuantSemantics | str = QuantSemantics.FUSED, dtype=jnp.bfloat16):
    """``wo_a_wo_b`` split over the ``axis`` axis of ``mesh`` with ``shard_map``, ``psum`` after
    ``wo_b``.

    ``o`` is sharded on its head axis, ``wo_a`` on its rows (whole groups), ``wo_b`` on its input
    columns; positions and the rope tables are replicated. Each shard computes
    ``wo_a_wo_b_partial`` on its ``G_l`` groups; the fp32 partials are summed with ``psum`` and cast
    once to ``dtype``.

    Args:
      mesh: a mesh with an axis named ``axis``; its size is ``tp``.
      o: ``[T, H, Dh]`` bf16, all heads (global array).
      positions, cos_cache, sin_cache: as for ``wo_a_fp8``.
      wo_a_weight, wo_a_weight_scale, wo_b_weight, wo_b_weight_scale: the full TP1 checkpoint
        tensors.
      config: the model config (``o_groups``, shapes, block); validated against the tensors.
      axis, path, amax_floor, semantics, dtype: see ``wo_a_wo_b_partial`` / ``wo_a_wo_b``.

    Returns:
      ``[T, hidden]`` in ``dtype``, replicated over ``axis``.
    """
    cfg = get_config(config)
    floor = checks.check_amax_floor(amax_floor)
    if axis not in mesh.shape:
        raise ValueError(f"mesh axes {tuple(mesh.shape)} have no axis named {axis!r}")
    tp = int(mesh.shape[axis])
    g_l = tp_shard(cfg, tp, 0).local.num_groups
    check_tp_weights(cfg, wo_a_weight, wo_a_weight_scale, wo_b_weight, wo_b_weight_scale)
    _, h, _ = checks.check_rank(o, 3, "o", "[T, H, Dh]")
    if h != cfg.num_heads:
        raise ValueError(f"o has {h} heads; {cfg.name} has num_heads={cfg.num_heads}")
    mode = as_enum(ProjectionPath, path, "path")
    if mode is ProjectionPath.FP8:
        # The lossless float -> E8M0 conversion inspects values on the host; do it before tracing.
        if checks.dtype_name(wo_a_weight_scale) in checks._FLOAT_SCALES:
            wo_a_weight_scale = e8m0_from_scale(wo_a_weight_scale)
        if checks.dtype_name(wo_b_weight_scale) in checks._FLOAT_SCALES:
            wo_b_weight_scale = e8m0_from_scale(wo_b_weight_scale)

    fn = _tp_fn(mesh, axis, g_l, mode, floor,
                as_enum(QuantSemantics, semantics, "semantics"), np.dtype(dtype))
    return fn(o, positions, cos_cache, sin_cache, wo_a_weight, wo_a_weight_scale, wo_b_weight,
              wo_b_weight_scale)
