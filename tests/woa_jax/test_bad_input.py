"""Bad input through every oracle entry point: a documented error, never a result.

A hypothesis sweep mutates one argument of a valid small ``wo_a`` call at a time (shape, rank,
dtype or value) and asserts that each public chain and op raises ``ValueError`` or ``TypeError``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import woa_jax
from woa_jax import checks

BF16, FP8 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn


@pytest.fixture(scope="module")
def call():
    """A valid cut-down call: H 4, Dh 512, G 2 (K 1024), N 256, 128 x 128 blocks."""
    rng = np.random.default_rng(0)
    o = (rng.standard_normal((3, 4, 512), dtype=np.float32) * 0.1).astype(BF16)
    w, ws = woa_jax.quantize_weight_blocks(rng.standard_normal((512, 1024)) * 0.02)
    cos, sin = (np.asarray(t) for t in woa_jax.rope_cos_sin("v4-flash", "compress", 64,
                                                               dtype=BF16))
    return {"o": o, "positions": np.arange(3, dtype=np.int32), "cos_cache": cos,
            "sin_cache": sin, "weight": w, "weight_scale": ws, "num_groups": 2}


def _mutations():
    """(argument, how to break it) pairs; each returns the broken value from the valid one."""
    drop = ("drop a dim", lambda a: a[0])
    add = ("add a dim", lambda a: a[None])
    return {
        "o": [drop, add, ("int32", lambda a: a.astype(np.int32)),
              ("float64", lambda a: a.astype(np.float64)), ("3 heads", lambda a: a[:, :3]),
              ("Dh 256", lambda a: a[..., :256])],
        "positions": [add, ("float32", lambda a: a.astype(np.float32)),
                      ("too few", lambda a: a[:2]), ("uint8", lambda a: a.astype(np.uint8))],
        "cos_cache": [drop, add, ("int8", lambda a: a.astype(np.int8)),
                      ("narrower than sin", lambda a: a[:, :16]),
                      ("wider than the head", lambda a: np.tile(a, (1, 9))),
                      ("no rows", lambda a: a[:0])],
        "weight": [drop, add, ("bf16", lambda a: a.astype(BF16)),
                   ("rows not split by G", lambda a: a[:384 + 1]), ("K 512", lambda a: a[:, :512])],
        "weight_scale": [drop, add, ("int32", lambda a: a.view(np.uint8).astype(np.int32)),
                         ("one row short", lambda a: a[:-1]),
                         ("not a power of two", lambda a: a.astype(np.float32) * 0.75),
                         ("K / 64 columns", lambda a: np.repeat(a, 2, axis=1))],
        "num_groups": [("zero", lambda g: 0), ("negative", lambda g: -2), ("three", lambda g: 3),
                       ("float", lambda g: 2.0), ("string", lambda g: "2")],
    }


MUTATIONS = [(arg, name, fn) for arg, ms in _mutations().items() for name, fn in ms]
CHAINS = {"wo_a_fp8": woa_jax.wo_a_fp8, "wo_a_bf16": woa_jax.wo_a_bf16,
          "wo_a_truth": woa_jax.wo_a_truth}
# Non-power-of-two float scales are valid for the BF16 path and the truth.
CHAIN_CASES = [(chain, m) for chain in sorted(CHAINS) for m in MUTATIONS
               if chain == "wo_a_fp8" or m[:2] != ("weight_scale", "not a power of two")]
# Heads or head width that do not fit G * K are valid for the quant op alone.
QUANT_CASES = [m for m in MUTATIONS if m[0] in ("o", "positions", "cos_cache", "num_groups")
               and m[:2] not in (("o", "3 heads"), ("o", "Dh 256"))]


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CHAIN_CASES))
def test_chains_raise_on_any_single_bad_argument(call, case):
    chain, (arg, _, fn) = case
    kwargs = dict(call, **{arg: fn(call[arg])})
    args = [kwargs.pop(k) for k in ("o", "positions", "cos_cache", "sin_cache", "weight",
                                    "weight_scale", "num_groups")]
    with pytest.raises((ValueError, TypeError)):
        CHAINS[chain](*args)


@pytest.mark.parametrize("arg, name, fn", QUANT_CASES, ids=[f"{a}-{n}" for a, n, _ in QUANT_CASES])
def test_quant_op_raises_on_each_bad_argument(call, arg, name, fn):
    kwargs = {k: call[k] for k in ("o", "positions", "cos_cache", "sin_cache", "num_groups")}
    kwargs[arg] = fn(kwargs[arg])
    with pytest.raises((ValueError, TypeError)):
        woa_jax.inverse_rope_group_quant(*kwargs.values())


@pytest.mark.parametrize("option, value, match", [
    ("amax_floor", float("nan"), "amax_floor must be a finite number > 0"),
    ("semantics", "bogus", "semantics must be one of 'fused', 'unfused'"),
    ("dtype", np.float16, "dtype must be bfloat16 or float32"),
])
def test_fp8_chain_options(call, option, value, match):
    with pytest.raises((ValueError, TypeError), match=match):
        woa_jax.wo_a_fp8(*call.values(), **{option: value})


def test_rope_dim_of_the_layer_is_enforced(call):
    args = [call[k] for k in ("o", "positions", "cos_cache", "sin_cache")]
    assert checks.check_rope_inputs(*args, rope_dim=64) == (3, 4, 512, 64)
    wide = np.tile(call["cos_cache"], (1, 2))
    with pytest.raises(ValueError, match=r"rotates rd = 128 lanes, but the layer's rope_dim is "
                                         r"64: expected tables of shape \[P, 32\]"):
        checks.check_rope_inputs(args[0], args[1], wide, wide, rope_dim=64)
