"""The oracle under jax.jit on a GPU backend keeps every narrowing rounding.

XLA's excess-precision rewrite removed the fp8 rounding between the quant and the GEMM when the
whole FP8 chain was jitted on XLA:GPU; ``woa_jax._spec.upcast_f32`` pins it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import woa_jax as W
from woa_jax.testing import assert_bitwise_equal


@pytest.mark.gpu
def test_jitted_fp8_chain_equals_stepwise_on_gpu():
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax sees no GPU backend")
    rng = np.random.default_rng(3)
    s, h, g = 64, 16, 2
    cos, sin = W.rope_cos_sin("v4-pro", "compress", max_positions=4096, dtype=jnp.bfloat16)
    o = jnp.asarray(rng.standard_normal((s, h, 512)).astype(np.float32) * 0.1, jnp.bfloat16)
    pos = jnp.asarray(rng.integers(0, 4096, s))
    w = jnp.asarray(np.clip(rng.standard_normal((g * 1024, 4096)) * 64, -448, 448),
                    jnp.float8_e4m3fn)
    ws = jnp.asarray(rng.integers(115, 123, (g * 8, 32)).astype(np.uint8))
    whole = jax.jit(W.wo_a_fp8, static_argnums=(6,))(o, pos, cos, sin, w, ws, g)
    x, xs = jax.jit(W.inverse_rope_group_quant, static_argnums=(4,))(o, pos, cos, sin, g)
    w3, ws3 = W.wo_a_weight_e8m0(w, ws, g)
    stepwise = jax.jit(W.batched_gemm_a8w8_mxscale)(x, w3, xs, ws3)
    assert_bitwise_equal(whole, stepwise, name="jit(wo_a_fp8) vs quant then GEMM")
