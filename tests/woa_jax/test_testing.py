"""The comparison helpers shipped in woa_jax.testing."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from woa_jax.testing import (
    TOLERANCES,
    assert_bitwise_equal,
    assert_close,
    bytes_equal_fraction,
    calc_diff,
    relative_error,
)


def test_assert_bitwise_equal_names_the_first_mismatch():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = a.copy()
    b[1, 0] = 3.5
    assert_bitwise_equal(a, a.copy())
    with pytest.raises(AssertionError, match=r"x: 1 of 4 elements differ; first at \[1, 0\]: "
                                             r"got np.float32\(3.0\) \(0x40400000\)"):
        assert_bitwise_equal(a, b, name="x")
    # -0.0 and +0.0 compare equal as values but not as bits.
    with pytest.raises(AssertionError, match="1 of 1 elements differ"):
        assert_bitwise_equal(np.array([0.0], np.float32), np.array([-0.0], np.float32))
    with pytest.raises(AssertionError, match=r"shape \(2, 2\) != expected \(4,\)"):
        assert_bitwise_equal(a, a.ravel())
    with pytest.raises(AssertionError, match="dtype float32 != expected float16"):
        assert_bitwise_equal(a, a.astype(np.float16))


def test_bitwise_helpers_read_fp8_e8m0_and_jax_arrays():
    q = np.arange(8, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    assert_bitwise_equal(jnp.asarray(q), q)
    s = jnp.asarray(np.array([127, 128], np.uint8)).view(jnp.float8_e8m0fnu)
    assert_bitwise_equal(s, np.array([127, 128], np.uint8))
    assert bytes_equal_fraction(q, q) == 1.0
    r = q.copy().view(np.uint8)
    r[:2] = 9
    assert bytes_equal_fraction(q, r.view(ml_dtypes.float8_e4m3fn)) == 0.75
    assert bytes_equal_fraction(q[:0], q[:0]) == 1.0


def test_error_measures():
    x = np.array([3.0, 4.0])
    assert relative_error(x, x) == 0.0
    assert relative_error(x * 1.1, x) == pytest.approx(0.1)
    assert relative_error(np.zeros(2), np.zeros(2)) == 0.0
    assert relative_error(np.ones(2), np.zeros(2)) == np.inf
    assert calc_diff(x, x) == pytest.approx(0.0, abs=1e-15)
    assert calc_diff(x, -x) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"shape \(2,\) != \(3,\)"):
        relative_error(x, np.ones(3))


def test_assert_close_uses_the_table_and_rejects_new_nans():
    ref = np.ones(1000)
    ok = ref * (1 + TOLERANCES["gemm_bf16"].rel / 2)
    assert assert_close(ok, ref, tolerance="gemm_bf16") == pytest.approx(
        TOLERANCES["gemm_bf16"].rel / 2)
    with pytest.raises(AssertionError, match=r"y: relative error 8.000e-03 exceeds 4.0e-03 "
                                             r"\(gemm_bf16: bf16 output rounding"):
        assert_close(ref * 1.008, ref, tolerance="gemm_bf16", name="y")
    bad = ref.copy()
    bad[3] = np.nan
    with pytest.raises(AssertionError, match=r"NaN at \[3\] where the reference is finite"):
        assert_close(bad, ref, tolerance="gemm_fp32")
