"""Fake AITER main (``scale_layout`` spelling); see ../../aiter_contract_double.py."""

from __future__ import annotations

import aiter_contract_double as _impl

SCALE_LAYOUTS = {"row": 0, "mfma_tile": 1, "n32k4": 2}


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups: int,
                             quant_group_size: int = 128, scale_layout: str = "row",
                             x_fp8=None, x_scale=None):
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"unknown scale_layout {scale_layout!r}")
    return _impl.quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                       scale_layout, x_fp8, x_scale,
                       {"scale_layout": scale_layout, "positions_dtype": positions.dtype,
                        "cos_dtype": cos_cache.dtype, "sin_dtype": sin_cache.dtype})


def batched_gemm_a8w8_mxscale(x, wo_a, x_scale, w_scale, dtype=None):
    import torch

    return _impl.gemm(x, wo_a, x_scale, w_scale, dtype or torch.bfloat16)
