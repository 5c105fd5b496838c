"""Our own backends behind AITER's exact signatures, as another project would expose them."""

from __future__ import annotations

import torch

import torch_bridge


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups: int,
                             quant_group_size: int = 128, scale_layout: str = "row",
                             x_fp8=None, x_scale=None):
    return torch_bridge.inverse_rope_group_quant(
        o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
        scale_layout=scale_layout, backend="torch", x_fp8=x_fp8, x_scale=x_scale)


def batched_gemm_a8w8_mxscale(x, wo_a, x_scale, w_scale, dtype=torch.bfloat16):
    return torch_bridge.batched_gemm_a8w8_mxscale(x, wo_a, x_scale, w_scale, dtype,
                                                  backend="torch")


def cuda_floor_quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size=128):
    """vLLM CUDA's floor (1e-10): conforms, and the report says which floor it matches."""
    return torch_bridge.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups,
                                                 quant_group_size, backend="torch",
                                                 amax_floor=1e-10)
