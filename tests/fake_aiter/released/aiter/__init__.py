"""Fake released AITER (``scale_shuffle`` spelling); see ../../aiter_contract_double.py."""

from __future__ import annotations

import aiter_contract_double as _impl


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups: int,
                             quant_group_size: int = 128, scale_shuffle: bool = False,
                             x_fp8=None, x_scale=None):
    return _impl.quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                       "scale_shuffle" if scale_shuffle else "row", x_fp8, x_scale,
                       {"scale_shuffle": scale_shuffle, "positions_dtype": positions.dtype,
                        "cos_dtype": cos_cache.dtype, "sin_dtype": sin_cache.dtype})


def batched_gemm_a8w8_mxscale(x, wo_a, x_scale, w_scale, dtype=None):
    import torch

    return _impl.gemm(x, wo_a, x_scale, w_scale, dtype or torch.bfloat16)
