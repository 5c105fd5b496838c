"""Fake released AITER (``scale_shuffle`` spelling); see ../../aiter_contract_double.py."""

from __future__ import annotations

import aiter_contract_double as _impl

inverse_rope_group_quant = _impl.scale_shuffle_quant


def batched_gemm_a8w8_mxscale(x, wo_a, x_scale, w_scale, dtype=None):
    import torch

    return _impl.gemm(x, wo_a, x_scale, w_scale, dtype or torch.bfloat16)
