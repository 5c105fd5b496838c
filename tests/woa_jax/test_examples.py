"""woa_jax.example_inputs: one rank's checkpoint-layout inputs that the chains take as they are."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import woa_jax
from woa_jax.testing import TOLERANCES, assert_bitwise_equal, relative_error


@pytest.fixture(scope="module")
def inputs():
    return woa_jax.example_inputs(tokens=3, seed=5)


def test_layout_matches_the_rank_shapes(inputs):
    ls = woa_jax.local_shapes("v4-flash", 8)
    assert inputs.o.shape == (3, *ls.o_shape_per_token) and inputs.o.dtype == ml_dtypes.bfloat16
    assert inputs.weight.shape == ls.weight_shape
    assert inputs.weight.dtype == ml_dtypes.float8_e4m3fn
    assert inputs.weight_scale.shape == ls.scale_shape
    assert inputs.weight_scale.dtype == ml_dtypes.float8_e8m0fnu
    assert inputs.cos_cache.shape == (4096, 32) and inputs.cos_cache.dtype == ml_dtypes.bfloat16
    assert inputs.positions.dtype == np.int32 and inputs.positions.max() < 4096
    assert inputs.num_groups == ls.num_groups
    checks_pass = woa_jax.checks.check_wo_a_weight_values(inputs.weight, inputs.weight_scale,
                                                          require_e8m0=True)
    assert checks_pass is None


def test_the_chains_run_as_pasted(inputs):
    y = woa_jax.wo_a_fp8(*inputs)
    ref = woa_jax.wo_a_bf16(*inputs)
    assert y.shape == (3, 1, 1024) and y.dtype == jnp.bfloat16
    assert relative_error(y, ref) < TOLERANCES["fp8_chain_vs_bf16"].rel
    assert 0.1 < float(np.abs(np.asarray(y, np.float32)).mean()) < 10  # not vanishing, not huge


def test_the_table_is_the_models_own(inputs):
    cos, sin = woa_jax.rope_cos_sin("v4-flash", "compress", 4096, dtype=jnp.bfloat16)
    assert_bitwise_equal(inputs.cos_cache, cos)
    assert_bitwise_equal(inputs.sin_cache, sin)


def test_seeded_and_the_same_weight_whatever_the_split(inputs):
    again = woa_jax.example_inputs(tokens=3, seed=5)
    for a, b in zip(inputs[:-1], again[:-1], strict=True):
        assert_bitwise_equal(a, b)
    rank1_of_4 = woa_jax.example_inputs(tokens=3, seed=5, tp_size=4, tp_rank=1, max_position=64)
    rank2_of_8 = woa_jax.example_inputs(tokens=3, seed=5, tp_size=8, tp_rank=2, max_position=64)
    rows = rank2_of_8.weight.shape[0]
    assert_bitwise_equal(rank1_of_4.weight[:rows], rank2_of_8.weight)
    assert_bitwise_equal(rank1_of_4.o[:, :8], rank2_of_8.o)


def test_inputs_from_any_draws_of_the_rules(inputs):
    """What another generator draws by ``draw_rules`` makes inputs of ``example_inputs``' layout
    (the benchmark harness draws them with torch)."""
    rules = woa_jax.draw_rules(tokens=3)
    assert rules.logits.shape == (3, 8, 64) and rules.spread.high == 3
    rng = np.random.default_rng(1)
    cos, sin = woa_jax.rope_cos_sin("v4-flash", "compress", 4096)
    x = woa_jax.inputs_from_draws(woa_jax.Draws(*(r.sample(rng) for r in rules)), cos, sin, 1)
    for got, want in zip(x[:-1], inputs[:-1], strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
    assert np.all(np.diff(np.asarray(x.positions)) >= 0)
    ref = woa_jax.wo_a_bf16(*x)
    assert relative_error(woa_jax.wo_a_fp8(*x), ref) < TOLERANCES["fp8_chain_vs_bf16"].rel


def test_options(inputs):
    x = woa_jax.example_inputs(config="v4.1-flash", tokens=1, rope_dtype=jnp.float32,
                               layer_kind="window", max_position=16, keys=4)
    assert x.cos_cache.dtype == np.float32 and x.cos_cache.shape == (16, 32)
    assert x.weight_scale.shape == (x.weight.shape[0] // 32, x.weight.shape[1] // 32)
    assert woa_jax.wo_a_fp8(*x).shape == (1, x.num_groups, 1024)


@pytest.mark.parametrize("kwargs, match", [
    ({"tokens": 0}, "tokens must be a positive integer"),
    ({"max_position": 0}, "max_position must be a positive integer"),
    ({"keys": 0}, "keys must be a positive integer"),
    ({"tp_rank": 8}, r"tp_rank must be in \[0, 8\), got 8"),
    ({"tp_size": 3}, "not divisible by tp=3"),
    ({"config": "v5"}, "unknown config 'v5'"),
    ({"layer_kind": "global"}, "layer_kind must be one of"),
    ({"max_position": 2 ** 21}, r"max_positions must be in \[1, 1048576\]"),
])
def test_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        woa_jax.example_inputs(**kwargs)
