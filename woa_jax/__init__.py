"""woa_jax: the JAX reference (numerical oracle) of DeepSeek V4's FP8 ``wo_a`` projection.

Bit-exact with AITER's ``inverse_rope_group_quant`` on fp8 and E8M0 scale bytes; the GEMM is an
fp32-accumulated reference (``docs/NUMERICS.md`` states the contract). Depends on jax, numpy and
ml_dtypes only (never torch).

Submodules: ``woa_jax.checks`` (input validation with errors that name the problem),
``woa_jax.testing`` (relative error, byte equality, the tolerance table) and
``woa_jax.conformance`` (the sweep that checks another implementation against the oracle).
"""

from ._spec import (
    AITER_AMAX_FLOOR,
    CUDA_AMAX_FLOOR,
    QUANT_GROUP_SIZE,
    QuantSemantics,
    RopeKind,
    ScaleLayout,
    fp8_max,
    fp8_max_reciprocal,
    fp8_min_normal_exp,
)
from .config import (
    DSV4_CONFIGS,
    DSV4Config,
    LocalShapes,
    get_config,
    local_shapes,
    rope_cos_sin,
    rope_inv_freq,
)
from .examples import (
    Draw,
    Draws,
    WoAInputs,
    attention_output,
    draw_rules,
    example_inputs,
    inputs_from_draws,
)
from .gemm import batched_gemm_a8w8_mxscale, batched_gemm_float64, dequant_weight
from .layouts import from_scale_layout, scale_shape, to_scale_layout
from .quant import (
    e8m0_bytes,
    e8m0_decode,
    e8m0_from_scale,
    e8m0_scale,
    group_dequant_e8m0,
    group_quant_e8m0,
    inverse_rope_group_quant,
    quantize_weight_blocks,
)
from .rope import forward_rope, inverse_rope, inverse_rope_float64
from .tp import (
    TP_AXIS,
    TPShard,
    check_tp_weights,
    shard_wo_a_wo_b,
    tp_mesh,
    tp_shard,
    wo_a_wo_b,
    wo_a_wo_b_partial,
    wo_a_wo_b_tp,
)
from .wo_b import (
    ProjectionPath,
    check_wo_b_weight,
    dequant_wo_b_weight,
    wo_b_bf16,
    wo_b_fp8,
    wo_b_weight_e8m0,
)
from .woa import (
    check_wo_a_weight,
    dequant_wo_a_weight,
    wo_a_bf16,
    wo_a_fp8,
    wo_a_truth,
    wo_a_weight_e8m0,
)

__all__ = [
    "AITER_AMAX_FLOOR",
    "batched_gemm_a8w8_mxscale",
    "batched_gemm_float64",
    "check_tp_weights",
    "check_wo_a_weight",
    "check_wo_b_weight",
    "CUDA_AMAX_FLOOR",
    "dequant_weight",
    "dequant_wo_a_weight",
    "dequant_wo_b_weight",
    "Draw",
    "draw_rules",
    "Draws",
    "DSV4_CONFIGS",
    "DSV4Config",
    "e8m0_bytes",
    "e8m0_decode",
    "e8m0_from_scale",
    "e8m0_scale",
    "attention_output",
    "example_inputs",
    "forward_rope",
    "fp8_max",
    "fp8_max_reciprocal",
    "fp8_min_normal_exp",
    "from_scale_layout",
    "get_config",
    "group_dequant_e8m0",
    "group_quant_e8m0",
    "inputs_from_draws",
    "inverse_rope",
    "inverse_rope_float64",
    "inverse_rope_group_quant",
    "local_shapes",
    "LocalShapes",
    "ProjectionPath",
    "QUANT_GROUP_SIZE",
    "quantize_weight_blocks",
    "QuantSemantics",
    "rope_cos_sin",
    "rope_inv_freq",
    "RopeKind",
    "scale_shape",
    "ScaleLayout",
    "shard_wo_a_wo_b",
    "to_scale_layout",
    "TP_AXIS",
    "tp_mesh",
    "tp_shard",
    "TPShard",
    "wo_a_bf16",
    "wo_a_fp8",
    "wo_a_truth",
    "wo_a_weight_e8m0",
    "wo_a_wo_b",
    "wo_a_wo_b_partial",
    "wo_a_wo_b_tp",
    "wo_b_bf16",
    "wo_b_fp8",
    "wo_b_weight_e8m0",
    "WoAInputs",
]
