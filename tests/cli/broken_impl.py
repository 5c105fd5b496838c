"""Deliberately wrong implementations with AITER's signatures (torch in, torch out).

``woa conformance`` must reject each of them and name the failing case; they stand for the bugs
``docs/NUMERICS.md`` warns about.
"""

from __future__ import annotations

import torch

import torch_bridge
from torch_bridge.backends.torch_ref import inverse_rope


def _quant_with(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, scale_byte):
    """The fused op with the E8M0 byte rule replaced by ``scale_byte(amax) -> int32``."""
    s = o.shape[0]
    g = inverse_rope(o, positions, cos_cache, sin_cache).reshape(s, num_groups, -1,
                                                                   quant_group_size)
    byte = scale_byte(g.abs().amax(dim=-1)).clamp(0, 254)
    inv = ((254 - byte).clamp(1, 254) << 23).view(torch.float32)
    q = (g * inv[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.reshape(s, num_groups, -1), byte.to(torch.uint8)


def inverse_rope_group_quant_log2(o, positions, cos_cache, sin_cache, num_groups,
                                  quant_group_size=128):
    """Scale ``2**ceil(log2(amax / 448))`` in fp32: one step low just above a power of two."""

    def byte(amax):
        x = torch.clamp(amax, min=1e-8) / 448.0
        return 127 + torch.ceil(torch.log2(x)).to(torch.int32)

    return _quant_with(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, byte)


def inverse_rope_group_quant_round_down(o, positions, cos_cache, sin_cache, num_groups,
                                        quant_group_size=128):
    """The exponent of ``amax / 448`` without the round-up bump: payloads overflow and clamp."""

    def byte(amax):
        x = torch.clamp(amax, min=1e-8) * (1.0 / 448.0)
        return (x.view(torch.int32) >> 23) & 0xFF

    return _quant_with(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, byte)


def inverse_rope_group_quant_mixed_floor(o, positions, cos_cache, sin_cache, num_groups,
                                         quant_group_size=128):
    """Correct bytes, but the amax floor depends on the group count (1e-10 for one group)."""
    floor = 1e-10 if num_groups == 1 else 1e-8
    return torch_bridge.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups,
                                                 quant_group_size, backend="torch",
                                                 amax_floor=floor)


def batched_gemm_a8w8_mxscale_swapped(x, wo_a, x_scale, w_scale, dtype=torch.bfloat16):
    """Reads the activation scales of K blocks 0 and 1 swapped (a column-permutation bug)."""
    xs = x_scale.clone()
    xs[..., [0, 1]] = x_scale[..., [1, 0]]
    return torch_bridge.batched_gemm_a8w8_mxscale(x, wo_a, xs, w_scale, dtype, backend="torch")
