"""The Triton backend's torch entry points, one per op (each a ``woa_triton::`` custom op).

The launchers live in ``quant``, ``gemm`` (split-K scratch in ``split_k``) and ``chain`` (both
chains); the launch rules they share with the JAX launcher in ``configs`` (the BF16 chain's in
``bf16_configs``). Importing this module imports torch and Triton but touches no GPU.
"""

from __future__ import annotations

from .bf16_configs import Bf16GemmConfig, bf16_gemm_chosen, bf16_gemm_config
from .chain import inverse_rope, wo_a_bf16, wo_a_fp8
from .configs import (
    GemmConfig,
    QuantConfig,
    gemm_config,
    quant_config,
    quant_launch,
    wgmma_stages,
    wo_a_fp8_chosen,
    wo_a_fp8_config,
)
from .gemm import batched_gemm_a8w8_mxscale, wgmma_available, wgmma_chosen
from .quant import inverse_rope_group_quant

__all__ = [
    "Bf16GemmConfig",
    "GemmConfig",
    "QuantConfig",
    "batched_gemm_a8w8_mxscale",
    "bf16_gemm_chosen",
    "bf16_gemm_config",
    "wo_a_fp8_chosen",
    "wo_a_fp8_config",
    "gemm_config",
    "inverse_rope",
    "inverse_rope_group_quant",
    "quant_config",
    "quant_launch",
    "wgmma_available",
    "wgmma_chosen",
    "wgmma_stages",
    "wo_a_bf16",
    "wo_a_fp8",
]
