"""torch launcher of the inverse RoPE + 1 x GS E8M0 FP8 quant (custom op
``woa_triton::inverse_rope_group_quant``)."""

from __future__ import annotations

import torch
from torch.autograd.graph import increment_version

from woa_jax import AITER_AMAX_FLOOR

from ...interop import e8m0_bytes
from . import configs, plans
from ._common import (
    Launch,
    dtype_name,
    last_dims_contiguous,
    launch_for,
    launcher_op,
    on_device_of,
    pdl,
    rows_contiguous,
    run_mutating,
    signature,
    target,
)
from .configs import QuantConfig


@launcher_op("inverse_rope_group_quant", mutates_args=("x_fp8", "x_scale"))
def _inverse_rope_group_quant_op(o: torch.Tensor, positions: torch.Tensor,
                                 cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                                 x_fp8: torch.Tensor, x_scale: torch.Tensor,
                                 quant_group_size: int, amax_floor: float, block_r: int,
                                 num_warps: int, block_h: int, pdl: bool,
                                 whole_head: bool, scale_mn_align: int) -> None:
    if o.shape[0] == 0:
        return
    cfg = QuantConfig(block_r, num_warps, block_h, pdl, whole_head)
    run, args = _quant_launch(o, positions, cos_cache, sin_cache, x_fp8, x_scale,
                              quant_group_size, amax_floor, cfg, scale_mn_align)
    with on_device_of(o):
        run(args)


def _quant_launch(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size,
                  amax_floor, cfg: QuantConfig, scale_mn_align: int = 0):
    """``(launch, runtime arguments)`` of one quant call."""
    key = ("quant", *signature(o), *signature(cos_cache), x_fp8.dtype, quant_group_size,
           amax_floor, cfg, scale_mn_align)
    run = launch_for(key, lambda: Launch(plans.quant(
        *o.shape, 2 * cos_cache.shape[1], quant_group_size, cfg, fp8=dtype_name(x_fp8.dtype),
        amax_floor=amax_floor, o_dtype=dtype_name(o.dtype), rope_dtype=dtype_name(cos_cache.dtype),
        target=target(), pdl=pdl(o.device.index, cfg.pdl), scale_mn_align=scale_mn_align)))
    return run, (o, positions, cos_cache, sin_cache, run.plan.n_work, cos_cache.shape[0],
                 o.stride(0), cos_cache.stride(0), sin_cache.stride(0), x_fp8, x_scale)


#: Where ``_quant_launch``'s runtime arguments hold the call's tensors.
_QUANT_TENSORS = (0, 1, 2, 3, 9, 10)


def eager_quant(o, positions, cos_cache, sin_cache, num_groups: int, quant_group_size: int,
                amax_floor: float, fp8_dtype: torch.dtype, x_fp8: torch.Tensor | None = None,
                x_scale: torch.Tensor | None = None, config: QuantConfig | None = None,
                stream: int | None = None):
    """For plain eager calls that repeat this call's signature (the ops layer checks that):
    ``run(o, positions, cos_cache, sin_cache, x_fp8=None, x_scale=None) -> (x_fp8, x_scale) |
    None``, the compiled kernel launched directly (``None``: this call needs Triton's path).
    ``x_fp8``, ``x_scale``: bind for calls that pass output buffers like these (their 16-byte
    alignment is checked on each call, their versions bumped as the op's path does); an
    output not given is made new, the scales as float8_e8m0fnu, the public op's dtype (the
    kernel takes their address only). ``None`` when there is nothing to bind: no launch of
    this signature yet, or operands that the launcher would first repack. ``config``: the
    launch shape (``None``: ``configs.quant_config(S, heads=H)``). ``stream``: the given
    buffers belong to that stream's launches (``_common.Bound``): another stream or a capture
    takes the op's path."""
    s, h, dh = o.shape
    if (not o.is_cuda or s == 0 or last_dims_contiguous(o) is not o
            or any(t.stride(-1) != 1 for t in (positions, cos_cache, sin_cache))):
        return None
    d = h * dh // num_groups
    shape_q, shape_s = (s, num_groups, d), (s, num_groups, d // quant_group_size)
    device = o.device
    given = x_fp8 is not None or x_scale is not None
    q = x_fp8 if x_fp8 is not None else torch.empty(shape_q, dtype=fp8_dtype, device=device)
    sc = (e8m0_bytes(x_scale) if x_scale is not None
          else torch.empty(shape_s, dtype=torch.uint8, device=device))
    run, args = _quant_launch(o, positions, cos_cache, sin_cache, q, sc, quant_group_size,
                              float(amax_floor), config or configs.quant_config(s, heads=h))
    bound = run.bind(args, _QUANT_TENSORS, stream, checked=6 if given else 4)
    if bound is None:
        return None
    e8m0 = torch.float8_e8m0fnu
    strides_q, strides_s = plans.dense(*shape_q), plans.dense(*shape_s)

    def go(o, positions, cos_cache, sin_cache, x_fp8=None, x_scale=None):
        q = (x_fp8 if x_fp8 is not None
             else torch.empty_strided(shape_q, strides_q, dtype=fp8_dtype, device=device))
        sc = (x_scale if x_scale is not None
              else torch.empty_strided(shape_s, strides_s, dtype=e8m0, device=device))
        if not bound((o, positions, cos_cache, sin_cache, q, sc)):
            return None
        if given:
            increment_version([t for t in (x_fp8, x_scale) if t is not None])
        return q, sc
    return go


def inverse_rope_group_quant(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                             sin_cache: torch.Tensor, num_groups: int, quant_group_size: int = 128,
                             *, amax_floor: float = AITER_AMAX_FLOOR,
                             x_fp8: torch.Tensor | None = None,
                             x_scale: torch.Tensor | None = None,
                             config: QuantConfig | None = None, scale_mn_align: int = 0
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused inverse RoPE + 1 x GS E8M0 FP8 quantization (AITER semantics), one read of ``o``.

    Args:
      o: ``[S, H, Dh]`` bf16/fp16/fp32; the token stride may be padded.
      positions: ``[>= S]`` int32 or int64 (a strided view is packed first: the kernels read
        them with unit stride); clamped to ``[0, P - 1]`` in the kernel.
      cos_cache, sin_cache: ``[P, rd / 2]`` bf16, fp16 or fp32.
      num_groups: G; D = H * Dh / G.
      quant_group_size: GS in {32, 64, 128}.
      amax_floor: 1e-8 (AITER) or 1e-10 (vLLM CUDA).
      x_fp8: optional contiguous ``[S, G, D]`` fp8 output (its dtype picks e4m3fn / e4m3fnuz).
      x_scale: optional contiguous ``[S, G, D / GS]`` uint8 or float8_e8m0fnu output; with
        ``scale_mn_align``, an fp32 ``[S, G, D / GS]`` view of strides ``token_major_strides``.
      config: launch shape; ``None`` uses ``configs.quant_config(S, heads=H)``.
      scale_mn_align: ``0`` (the row layout of E8M0 bytes), or the scales as fp32 powers of
        two, token-major: scale ``(s, g, j)`` at ``(g * D / GS + j) * S_pad + s``, ``S_pad``
        = S rounded up to a multiple of ``scale_mn_align`` (DeepGEMM's sm_90 layout, 4).

    Returns:
      ``(x_fp8 [S, G, D], x_scale [S, G, D / GS])``; the given buffers when passed.

    Raises:
      ValueError: ``x_fp8`` or ``x_scale`` is not a tensor of its shape and strides, or
        token-major scales asked of a head dim that GS does not divide.
    """
    s, h, dh = o.shape
    d = h * dh // num_groups
    shape_q, shape_s = (s, num_groups, d), (s, num_groups, d // quant_group_size)
    if x_fp8 is None:
        x_fp8 = torch.empty(shape_q, dtype=torch.float8_e4m3fn, device=o.device)
    if x_scale is None:
        x_scale = (token_major_scales(shape_s, scale_mn_align, o.device) if scale_mn_align
                   else torch.empty(shape_s, dtype=torch.uint8, device=o.device))
    for name, t, shape in (("x_fp8", x_fp8, shape_q), ("x_scale", x_scale, shape_s)):
        if tuple(t.shape) != shape or not (t.is_contiguous() or t is x_scale and scale_mn_align):
            raise ValueError(f"{name} must be a contiguous {list(shape)} tensor, got shape "
                             f"{list(t.shape)} with strides {list(t.stride())}")
    if scale_mn_align:
        strides = token_major_strides(shape_s, scale_mn_align)
        if x_scale.dtype != torch.float32 or any(
                n > 1 and st != want
                for n, st, want in zip(shape_s, x_scale.stride(), strides, strict=True)):
            raise ValueError(f"token-major x_scale must be fp32 of strides {list(strides)}, "
                             f"got {x_scale.dtype} of strides {list(x_scale.stride())}")
    cfg = config or configs.quant_config(s, heads=h)
    scale_out = x_scale if scale_mn_align else e8m0_bytes(x_scale)
    run_mutating(_inverse_rope_group_quant_op, (x_fp8, scale_out),
                 last_dims_contiguous(o), rows_contiguous(positions),
                 rows_contiguous(cos_cache), rows_contiguous(sin_cache), x_fp8, scale_out,
                 quant_group_size, float(amax_floor), cfg.block_r, cfg.num_warps, cfg.block_h,
                 cfg.pdl, cfg.whole_head, scale_mn_align)
    return x_fp8, x_scale


def token_major_strides(shape: tuple[int, int, int], align: int) -> tuple[int, int, int]:
    """The strides of an ``[S, G, Ks]`` scale view whose ``[G * Ks, S_pad]`` buffer holds
    each quant group's tokens contiguously, ``S_pad`` = S rounded up to ``align``."""
    s, _, ks = shape
    pad = configs.cdiv(max(s, 1), align) * align
    return (1, ks * pad, pad)


def token_major_scales(shape: tuple[int, int, int], align: int,
                       device: torch.device) -> torch.Tensor:
    """A new fp32 ``[S, G, Ks]`` scale view of ``token_major_strides`` (padding unset)."""
    s, g, ks = shape
    strides = token_major_strides(shape, align)
    return torch.empty((g * ks, strides[2]), dtype=torch.float32, device=device).view(
        g, ks, strides[2]).permute(2, 0, 1)[:s]
