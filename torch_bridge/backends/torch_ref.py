"""The pure-torch reference backend (``WOA_BACKEND=torch``): CPU and GPU, any shape.

It mirrors ``woa_jax`` function by function (same formulas, same order of fp32 operations), so its
fp8 and E8M0 bytes are bit-identical to the oracle's; the GEMM agrees to the output rounding.
Inputs are assumed valid (``torch_bridge.ops`` checks them). Scales are uint8 E8M0 bytes.

On GPUs keep ``torch.backends.cuda.matmul.allow_tf32`` off (torch's default): the fp32 GEMM
reference is meant to be an fp32 contraction.
"""

from __future__ import annotations

import torch

import woa_jax
from woa_jax import AITER_AMAX_FLOOR
from woa_jax.checks import E8M0_NAN

from .._dispatch import Case


def fp8_max(fp8_dtype: torch.dtype) -> float:
    """Largest finite value of the fp8 dtype (``woa_jax.fp8_max``)."""
    return woa_jax.fp8_max(str(fp8_dtype).removeprefix("torch."))


def fp8_max_reciprocal(fp8_dtype: torch.dtype) -> float:
    """fp32(1 / fp8_max), exactly as the kernels multiply by it (``woa_jax``'s)."""
    return float(woa_jax.fp8_max_reciprocal(str(fp8_dtype).removeprefix("torch.")))


def inverse_rope(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                   sin_cache: torch.Tensor) -> torch.Tensor:
    """Inverse GPT-J RoPE of the last ``rd = 2 * cos.shape[1]`` lanes per head; fp32 ``[S, H, Dh]``.

    ``a' = a c + b s``, ``b' = b c - a s`` on lanes ``(2j, 2j+1)`` of the tail; products and sums
    are separate fp32 operations (eager torch never contracts them to FMA). Positions are clamped
    to ``[0, P - 1]`` like AITER's kernel.
    """
    s = o.shape[0]
    half = cos_cache.shape[1]
    pos = positions[:s].to(torch.int64).clamp(0, cos_cache.shape[0] - 1)
    c = cos_cache[pos].to(torch.float32)[:, None, :]  # [S, 1, half]
    sn = sin_cache[pos].to(torch.float32)[:, None, :]
    x = o.to(torch.float32)
    split = x.shape[-1] - 2 * half
    nope, tail = x[..., :split], x[..., split:]
    a, b = tail[..., 0::2], tail[..., 1::2]
    rot = torch.stack([a * c + b * sn, b * c - a * sn], dim=-1).reshape(tail.shape)
    return torch.cat([nope, rot], dim=-1)


def e8m0_decode(scale_bytes: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 E8M0 bytes to fp32 ``2**(b - 127)`` by bit shift (0 -> +0.0, 255 -> +inf);
    ``out``: an fp32 tensor of the bytes' shape, any strides, written in place."""
    if out is None:
        return (scale_bytes.to(torch.int32) << 23).view(torch.float32)
    bits = out.view(torch.int32)
    bits.copy_(scale_bytes)
    bits.bitwise_left_shift_(23)
    return out


def e8m0_scale_bytes(amax: torch.Tensor, fp8_dtype: torch.dtype,
                     amax_floor: float = AITER_AMAX_FLOOR) -> torch.Tensor:
    """Round-up power-of-two scale bytes of fp32 group maxima (``woa_jax.e8m0_scale``), uint8.

    ``x = fp32(fmax(amax, floor) * fp32(1 / fp8_max))``; byte = x's biased exponent, plus one when
    its mantissa is non-zero and the exponent is not already 255. ``fmax`` ignores NaN.
    """
    amax = amax.to(torch.float32)
    # fmax(amax, floor) without a host-built tensor (CUDA-graph safe): NaN >= floor is False.
    amax = torch.where(amax >= amax_floor, amax, amax_floor)
    x = amax * fp8_max_reciprocal(fp8_dtype)
    u = x.view(torch.int32)
    exp = (u >> 23) & 0xFF
    bump = (exp < 0xFF) & ((u & 0x7FFFFF) != 0)
    return (exp + bump.to(torch.int32)).to(torch.uint8)


def group_quant_e8m0(x: torch.Tensor, group_size: int, fp8_dtype: torch.dtype,
                     amax_floor: float = AITER_AMAX_FLOOR) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., K]`` fp32 to ``(q [..., K] fp8, scale [..., K / GS] uint8)``, as ``woa_jax``.

    The group maximum ignores NaN lanes (``jnp.nanmax`` + ``fmax`` in the oracle); an all-NaN group
    gets the floor's byte. The clamp to ``+-fp8_max`` never binds with the round-up scale; it is
    there because out-of-range casts differ between libraries.
    """
    k = x.shape[-1]
    g = x.to(torch.float32).reshape(*x.shape[:-1], k // group_size, group_size)
    mag = g.abs()
    amax = torch.where(torch.isnan(mag), 0.0, mag).amax(dim=-1)
    byte = e8m0_scale_bytes(amax, fp8_dtype, amax_floor)
    # 2**(127 - byte) as fp32 bits, exact; byte 255 (an inf lane) makes the payload NaN.
    inv = ((254 - byte.to(torch.int32)).clamp(1, 254) << 23).view(torch.float32)
    inv = torch.where(byte == E8M0_NAN, float("nan"), inv)
    m = fp8_max(fp8_dtype)
    q = torch.clamp(g * inv[..., None], -m, m).to(fp8_dtype).reshape(x.shape)
    return q, byte


def dequant_blocks(w: torch.Tensor, scale_f32: torch.Tensor, block: int,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``w [..., R, K]`` times its ``[..., ceil(R / B), K / B]`` block scales (ragged last ok)."""
    rows = w.shape[-2]
    full = scale_f32.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    full = full[..., :rows, :]
    return (w.to(torch.float32) * full).to(dtype)


def weight_scale_f32(scale: torch.Tensor) -> torch.Tensor:
    """Checkpoint weight scales as fp32: float scales as they are, E8M0/uint8 bytes decoded."""
    if scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
        return e8m0_decode(scale.view(torch.uint8))
    return scale.to(torch.float32)


def dequant_wo_a_weight(weight: torch.Tensor, scale: torch.Tensor, num_groups: int,
                        dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``[G*N, K]`` checkpoint weight to ``[G, N, K]`` in ``dtype`` (as ``woa_jax``'s function).

    Exact in bf16 for E8M0 scales; non-power-of-two float scales make the bf16 rounding part of
    the result, as in the BF16 reference path.
    """
    rows, k = weight.shape
    block = k // scale.shape[1]
    w = dequant_blocks(weight, weight_scale_f32(scale), block, dtype)
    return w.reshape(num_groups, rows // num_groups, k)


class TorchBackend:
    """Pure torch: always available, supports every valid call."""

    name = "torch"
    ops = frozenset({"inverse_rope_group_quant", "batched_gemm_a8w8_mxscale"})
    eager_ops: frozenset[str] = frozenset()
    rope_in_activation_dtype = False

    def is_available(self) -> tuple[bool, str]:
        return True, "pure torch (reference); runs on any device"

    def supports(self, op: str, case: Case) -> tuple[bool, str]:
        return True, "pure torch supports every validated call"

    def inverse_rope_group_quant(self, o, positions, cos_cache, sin_cache, num_groups: int,
                                 quant_group_size: int, *, amax_floor: float = AITER_AMAX_FLOOR,
                                 x_fp8=None, x_scale=None):
        s = o.shape[0]
        fp8_dtype = x_fp8.dtype if x_fp8 is not None else torch.float8_e4m3fn
        rotated = inverse_rope(o, positions, cos_cache, sin_cache)
        q, byte = group_quant_e8m0(rotated.reshape(s, num_groups, -1), quant_group_size,
                                   fp8_dtype, amax_floor)
        if x_fp8 is not None:
            x_fp8.copy_(q)
            q = x_fp8
        if x_scale is not None:
            x_scale.view(torch.uint8).copy_(byte)
            byte = x_scale
        return q, byte

    def batched_gemm_a8w8_mxscale(self, x, w, x_scale, w_scale, *, dtype=torch.bfloat16,
                                  out=None):
        m, g, k = x.shape
        xs = e8m0_decode(x_scale)
        bk = k // xs.shape[-1]
        xd = (x.to(torch.float32).reshape(m, g, k // bk, bk) * xs[..., None]).reshape(m, g, k)
        wd = dequant_blocks(w, e8m0_decode(w_scale), bk)
        # [G, M, K] @ [G, K, N] -> [G, M, N], fp32 accumulation, one final rounding.
        y = torch.bmm(xd.transpose(0, 1), wd.transpose(1, 2)).transpose(0, 1)
        if out is not None:
            return out.copy_(y)
        return y.to(dtype)


BACKEND = TorchBackend()
