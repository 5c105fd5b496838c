"""The one intake of a checkpoint projection weight, for ``WoAProjection`` and ``WoBProjection``.

A weight ``[R, K]`` is fp8 (float8_e4m3fn/e4m3fnuz) with ``[ceil(R / B), K / B]`` block scales
(float8_e8m0fnu, uint8 E8M0 bytes or float values; B = 128, or 32 for V4.1), or unquantized
(bf16/fp16/fp32) with none. It is checked once, where the layer is built, with the same checks,
messages and lossless E8M0 conversion for every projection; only the shape rules and the names in
messages differ (``Projection``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from woa_jax import checks

from . import interop, ops
from .backends import torch_ref

#: Dtypes of a quantized weight.
FP8_NAMES = ("float8_e4m3fn", "float8_e4m3fnuz")
#: Unquantized float dtypes: of a weight without scales, and of the activations and tables.
PLAIN_NAMES = ("bfloat16", "float16", "float32")


class Projection(NamedTuple):
    """How a projection's weight is named in messages and viewed by its batched GEMM."""

    #: ``"wo_a"`` or ``"wo_b"``.
    name: str
    #: The weight and its scale as messages name them.
    weight: str
    scale: str
    #: Named dims of the stored weight and of the GEMM's ``[E, R / E, K]`` view of it.
    dims: str
    view: str
    #: The layer class, named if a converted tensor cannot be made ready (``ops.ready_everywhere``).
    owner: str


class Intake(NamedTuple):
    """A checked weight as its layer keeps it."""

    #: B, the scale block edge; ``None`` for an unquantized weight.
    block: int | None
    #: ``[E, R / E, K]`` zero-copy view of an fp8 weight, else ``None``.
    weight_fp8: torch.Tensor | None
    #: ``[E, R / E / B, K / B]`` uint8 E8M0 bytes, ``None`` where the FP8 path cannot run.
    weight_scale_e8m0: torch.Tensor | None
    #: Why the FP8 path cannot take the weight (the BF16 path does), else ``None``.
    fp8_unavailable: str | None


def take_weight(weight, scale, groups: int, proj: Projection,
                shapes: Callable[[torch.Tensor, torch.Tensor | None], int | None]) -> Intake:
    """Check a checkpoint weight ``[R, K]`` and its scale; view it as ``groups`` GEMM groups.

    A valid weight the FP8 path cannot use (float scales that are not powers of two, ``R / E``
    not a whole number of blocks, no scale) is not an error: ``fp8_unavailable`` says why.

    Args:
      weight: ``[R, K]`` fp8 with ``scale``, or bf16/fp16/fp32 with ``scale=None``.
      scale: ``[ceil(R / B), K / B]`` block scales, or ``None``.
      groups: E, which must divide R (``wo_a``'s ``num_groups``; 1 for ``wo_b``).
      proj: the projection's names and view.
      shapes: the projection's own shape rules, ``shapes(weight, scale) -> B`` (``None`` for an
        unquantized weight, which it gets with ``scale=None``); raises on a shape it refuses.

    Raises:
      TypeError: a non-tensor, a weight or scale dtype no checkpoint holds, a non-int ``groups``.
      ValueError: a wrong rank or shape, tensors on two devices or on ``meta``, a missing or
        extra scale, a non-contiguous fp8 weight, or corrupt values
        (``woa_jax.checks.check_wo_a_weight_values``: NaN fp8 bytes, NaN/Inf/zero/negative float
        scales, the E8M0 NaN byte).
    """
    ops.require_torch(weight=weight, weight_scale=scale, optional=("weight_scale",))
    ops.check_weight_device(weight=weight, weight_scale=scale)
    rows, k = checks.check_rank(weight, 2, proj.weight, proj.dims)
    if rows % checks.check_int(groups, "num_groups") != 0:
        raise ValueError(f"{proj.weight} rows {rows} are not divisible by num_groups={groups!r}")
    wname = checks.dtype_name(weight)
    if wname in PLAIN_NAMES:
        if scale is not None:
            raise ValueError(f"a {wname} {proj.name} weight is unquantized and takes no scale; "
                             f"got a weight_scale of shape {tuple(scale.shape)}")
        shapes(weight, None)
        return Intake(None, None, None, f"{wname} checkpoint has no scale")
    if wname not in FP8_NAMES:
        raise TypeError(f"{proj.weight} must be float8_e4m3fn, float8_e4m3fnuz or an unquantized "
                        f"bfloat16/float16/float32 tensor, got {wname}")
    if scale is None:
        raise ValueError(f"an FP8 ({wname}) {proj.name} weight needs its block scale "
                         "(checkpoint '.scale' / 'weight_scale_inv'), got None")
    block = shapes(weight, scale)
    if not weight.is_contiguous():
        raise ValueError(f"{proj.weight} must be contiguous to be viewed as {proj.view}; pass "
                         "weight.contiguous()")
    checks.check_wo_a_weight_values(weight, scale, names=(proj.weight, proj.scale))
    n = rows // groups
    weight_fp8 = weight.view(groups, n, k)
    try:
        if n % block != 0:
            raise ValueError(f"N={n} is not a multiple of the {block}-row weight block")
        e8m0 = interop.e8m0_bytes(scale, proj.scale)
    except ValueError as e:
        return Intake(block, weight_fp8, None, f"weight scale unusable by the FP8 path: {e}")
    if e8m0.data_ptr() != scale.data_ptr():  # converted: kept for every stream
        ops.ready_everywhere(e8m0, proj.owner)
    return Intake(block, weight_fp8, e8m0.view(groups, n // block, k // block), None)


def dequant_bf16(weight: torch.Tensor, scale: torch.Tensor | None, block: int | None,
                 proj: Projection) -> torch.Tensor:
    """A taken ``[R, K]`` weight in bf16: times its ``block``-edge scales (exact for E8M0
    scales), or cast when it has none; a new tensor is made ready for every stream."""
    if scale is None:
        w = weight.to(torch.bfloat16)
    else:
        w = torch_ref.dequant_blocks(weight, torch_ref.weight_scale_f32(scale), block,
                                     torch.bfloat16)
    return w if w is weight else ops.ready_everywhere(w, proj.owner)
