"""E8M0 scale rule (docs/NUMERICS.md 4), E8M0 decoding, the lossless weight-scale converter."""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import woa_jax
from woa_jax import AITER_AMAX_FLOOR, CUDA_AMAX_FLOOR, e8m0_decode, e8m0_from_scale, e8m0_scale
from woa_jax._spec import fp8_max_reciprocal

F32 = np.float32
E4M3FN, E4M3FNUZ = jnp.float8_e4m3fn, jnp.float8_e4m3fnuz


def _up(x) -> np.float32:
    return np.nextafter(F32(x), F32(np.inf))


def _down(x) -> np.float32:
    return np.nextafter(F32(x), F32(0))


def _byte(amax, **kw) -> int:
    return int(e8m0_scale(np.float32(amax), **kw)[1])


def _exact_byte(amax, fp8_max: int, floor) -> int:
    """``127 + ceil(log2(max(amax, floor) / fp8_max))`` in exact rational arithmetic."""
    r = max(Fraction(float(F32(amax))), Fraction(float(F32(floor)))) / fp8_max
    n = r.numerator.bit_length() - r.denominator.bit_length() - 1  # 2**n <= r < 2**(n+2)
    while Fraction(2) ** n < r:
        n += 1
    while n > -300 and Fraction(2) ** (n - 1) >= r:
        n -= 1
    return 127 + n


def _exact_bytes_vec(amax: np.ndarray, fp8_max: int) -> np.ndarray:
    """Vectorized ``_exact_byte`` for normal fp32 ``amax``, by integer arithmetic only.

    ``amax = M * 2**E`` (``M`` a 24-bit integer) and ``fp8_max = odd * 2**t``; then
    ``ceil(log2(amax / fp8_max)) = E - t + n`` with ``n`` the least integer such that
    ``odd * 2**n >= M``, i.e. the bit length of ``ceil(M / odd) - 1``.
    """
    t = (fp8_max & -fp8_max).bit_length() - 1
    odd = fp8_max >> t
    bits = amax.view(np.uint32).astype(np.int64)
    big_m = (bits & 0x7FFFFF) | 0x800000
    big_e = ((bits >> 23) & 0xFF) - 127 - 23
    c = -(-big_m // odd) - 1
    n = np.frexp(c.astype(np.float64))[1]  # bit length (exact: c < 2**24)
    return 127 + big_e - t + n


# ---------------------------------------------------------- docs/NUMERICS.md section 4 table


@pytest.mark.parametrize(
    ("amax", "byte"),
    [
        (0.0, 92),
        (1e-8, 92),
        (2.0**-30, 92),
        (1.0, 119),
        (224.0, 126),
        (_up(224.0), 127),
        (448.0, 127),
        (_down(448.0), 127),
        (_up(448.0), 128),
        (896.0, 128),
        (float(np.finfo(F32).max), 247),
        (np.inf, 255),
    ],
    ids=lambda v: repr(float(v)) if not isinstance(v, int) else str(v),
)
def test_scale_table_vectors(amax, byte):
    dq, b = e8m0_scale(F32(amax))
    assert b.dtype == jnp.uint8
    assert int(b) == byte
    expected_dq = np.inf if byte == 255 else 2.0 ** (byte - 127)
    assert float(dq) == expected_dq


def test_zero_group_bytes_per_floor():
    assert _byte(0.0, amax_floor=AITER_AMAX_FLOOR) == 92
    assert _byte(0.0, amax_floor=CUDA_AMAX_FLOOR) == 85
    # The floors themselves sit inside the same binade.
    assert _byte(CUDA_AMAX_FLOOR, amax_floor=CUDA_AMAX_FLOOR) == 85
    assert _byte(2.0**-30, amax_floor=CUDA_AMAX_FLOOR) == 127 - 30 - 8  # 2**-30 / 448 -> 2**-38


def test_powers_of_two_times_fp8_max_and_one_ulp_either_side():
    k = np.arange(-26, 120)
    on = (F32(448) * np.exp2(k).astype(F32)).astype(F32)
    _, b_on = e8m0_scale(on)
    _, b_up = e8m0_scale(np.nextafter(on, F32(np.inf)))
    _, b_down = e8m0_scale(np.nextafter(on, F32(0)))
    np.testing.assert_array_equal(np.asarray(b_on), 127 + k)
    np.testing.assert_array_equal(np.asarray(b_up), 128 + k)
    np.testing.assert_array_equal(np.asarray(b_down), 127 + k)
    assert int(b_on.max()) == 246 and int(b_up.max()) == 247


def test_subnormal_and_tiny_amax_take_the_floor():
    tiny = np.array([1e-45, 1e-40, np.finfo(F32).smallest_normal, 1e-11, 9.9e-11], F32)
    np.testing.assert_array_equal(np.asarray(e8m0_scale(tiny)[1]), 92)
    np.testing.assert_array_equal(
        np.asarray(e8m0_scale(tiny, amax_floor=CUDA_AMAX_FLOOR)[1]), 85)
    # Between the two floors only AITER's applies: 1e-9 / 448 lies in (2**-39, 2**-38].
    assert _byte(1e-9) == 92 and _byte(1e-9, amax_floor=CUDA_AMAX_FLOOR) == 89


def test_nan_amax_is_ignored_like_fmaxf_and_inf_is_e8m0_nan():
    _, b = e8m0_scale(np.array([np.nan, np.inf, -np.inf], F32))
    # NaN: fmax(NaN, floor) = floor (AITER reduces with fmaxf). +inf: exponent 0xFF, no bump.
    # (-inf is not an absolute maximum; it is floored like any non-positive value.)
    assert np.asarray(b).tolist() == [92, 255, 92]
    dq, _ = e8m0_scale(F32(np.inf))
    assert float(dq) == np.inf


def test_fnuz_flavour():
    assert fp8_max_reciprocal(E4M3FNUZ).view(np.uint32) == 0x3B888889
    assert fp8_max_reciprocal(E4M3FN).view(np.uint32) == 0x3B124925
    assert woa_jax.fp8_max(E4M3FNUZ) == 240.0 and woa_jax.fp8_max(E4M3FN) == 448.0
    kw = {"fp8_dtype": E4M3FNUZ}
    assert _byte(240.0, **kw) == 127
    assert _byte(_down(240.0), **kw) == 127
    assert _byte(_up(240.0), **kw) == 128
    assert _byte(480.0, **kw) == 128
    assert _byte(1.0, **kw) == 120
    # 1e-8 / 240 lies in (2**-35, 2**-34]: a zero group is one byte above e4m3fn's 92.
    assert _byte(0.0, **kw) == 93
    with pytest.raises(TypeError, match="float8_e4m3fn or float8_e4m3fnuz, got float8_e5m2"):
        e8m0_scale(F32(1), fp8_dtype=jnp.float8_e5m2)


# --------------------------------------------------------------------------- exhaustive checks


@pytest.mark.parametrize(("fp8_dtype", "fp8_max", "low"),
                         [(E4M3FN, 448, 256.0), (E4M3FNUZ, 240, 128.0)], ids=["e4m3fn", "fnuz"])
def test_bit_bump_equals_exact_ceil_log2_over_a_whole_binade(fp8_dtype, fp8_max, low):
    """All 2**23 mantissas of the binade holding fp8_max: bit rule == exact rational ceiling."""
    bits = np.arange(1 << 23, dtype=np.uint32) + F32(low).view(np.uint32)
    amax = bits.view(F32)
    _, b = e8m0_scale(amax, fp8_dtype=fp8_dtype)
    expected = _exact_bytes_vec(amax, fp8_max)
    bad = np.flatnonzero(np.asarray(b).astype(np.int64) != expected)
    assert bad.size == 0, f"{bad.size} mismatches, first amax={amax[bad[0]]!r}"


@pytest.mark.parametrize("fp8_dtype", [E4M3FN, E4M3FNUZ], ids=["e4m3fn", "fnuz"])
def test_bit_bump_matches_exact_math_on_random_bit_patterns(fp8_dtype):
    """Random positive finite fp32 of every binade, plus the independent numpy bit rule."""
    fp8_max = int(woa_jax.fp8_max(fp8_dtype))
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 0x7F800000, size=200_000, dtype=np.uint32)
    amax = bits.view(F32)
    _, b = e8m0_scale(amax, fp8_dtype=fp8_dtype)
    b = np.asarray(b).astype(np.int64)
    # Independent re-implementation of the bit rule in numpy.
    x = (np.fmax(amax, F32(AITER_AMAX_FLOOR)) * fp8_max_reciprocal(fp8_dtype)).astype(F32)
    u = x.view(np.uint32).astype(np.int64)
    e = (u >> 23) & 0xFF
    np.testing.assert_array_equal(b, e + ((e < 0xFF) & ((u & 0x7FFFFF) != 0)))
    # Exact math above the floor (vectorized integer form), and a few through Fraction.
    above = amax >= F32(AITER_AMAX_FLOOR)
    np.testing.assert_array_equal(b[above], _exact_bytes_vec(amax[above], fp8_max))
    for i in range(0, amax.size, 4000):
        assert b[i] == _exact_byte(amax[i], fp8_max, AITER_AMAX_FLOOR), amax[i]


def test_scale_under_jit_matches_eager():
    amax = np.array([0, 1e-9, 1, 448, _up(448), 3e38, np.inf], F32)
    f = jax.jit(e8m0_scale, static_argnames=("fp8_dtype", "amax_floor"))
    for kw in ({}, {"amax_floor": CUDA_AMAX_FLOOR}, {"fp8_dtype": E4M3FNUZ}):
        np.testing.assert_array_equal(np.asarray(f(amax, **kw)[1]),
                                      np.asarray(e8m0_scale(amax, **kw)[1]))


# --------------------------------------------------------------------------- decoding


def test_decode_by_bit_shift_including_the_ends():
    b = np.array([0, 1, 92, 126, 127, 128, 247, 254, 255], np.uint8)
    got = np.asarray(e8m0_decode(b))
    assert got.dtype == F32
    assert got[0] == 0.0 and got[-1] == np.inf
    np.testing.assert_array_equal(got[1:-1], np.exp2(b[1:-1].astype(np.float64) - 127))
    # A float8_e8m0fnu view of the same bytes decodes the same (not through ml_dtypes' values).
    np.testing.assert_array_equal(np.asarray(e8m0_decode(b.view(ml_dtypes.float8_e8m0fnu))), got)
    np.testing.assert_array_equal(
        np.asarray(e8m0_decode(jnp.asarray(b).view(jnp.float8_e8m0fnu))), got)
    with pytest.raises(TypeError, match="E8M0 scales must be uint8 or float8_e8m0fnu, got int8"):
        e8m0_decode(np.zeros(3, np.int8))


# --------------------------------------------------------------------------- lossless conversion


def test_from_scale_powers_of_two():
    got = e8m0_from_scale(np.array([[0.5, 1, 2, 4]], F32))
    assert got.dtype == np.uint8 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, [[126, 127, 128, 129]])


@pytest.mark.parametrize("dtype", [np.float64, ml_dtypes.bfloat16, np.float16, jnp.bfloat16])
def test_from_scale_other_float_dtypes(dtype):
    s = np.array([[2.0**-20, 0.25], [1.0, 2.0**15]]).astype(dtype)
    np.testing.assert_array_equal(e8m0_from_scale(jnp.asarray(s) if dtype is jnp.bfloat16 else s),
                                  [[107, 125], [127, 142]])


def test_from_scale_extreme_bytes():
    np.testing.assert_array_equal(e8m0_from_scale(np.array([2.0**-127, 2.0**127])), [0, 254])


def test_from_scale_non_contiguous_input_gives_contiguous_output():
    s = np.exp2(np.arange(12, dtype=F32).reshape(3, 4) - 6).T
    got = e8m0_from_scale(s)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, np.log2(s).astype(np.int64) + 127)


@pytest.mark.parametrize(
    ("values", "index", "why"),
    [
        ([[0.0, 1.0]], r"\[0, 0\]", "not positive"),
        ([[1.0, -1.0]], r"\[0, 1\]", "not positive"),
        ([[1.0, 0.75]], r"\[0, 1\]", "not a power of two"),
        ([[1.0, 1.0], [3.0, 1.0]], r"\[1, 0\]", "not a power of two"),
        ([[np.inf, 1.0]], r"\[0, 0\]", "not finite"),
        ([[1.0, np.nan]], r"\[0, 1\]", "not finite"),
        ([[2.0**128]], r"\[0, 0\]", "outside the E8M0 range"),
        ([[2.0**-128]], r"\[0, 0\]", "outside the E8M0 range"),
    ],
)
def test_from_scale_rejects_lossy_values(values, index, why):
    with pytest.raises(ValueError, match=rf"element {index} = .* is {why}"):
        e8m0_from_scale(np.array(values, np.float64))


def test_from_scale_rejects_integer_dtypes():
    with pytest.raises(TypeError, match="weight scale dtype int32 cannot be converted"):
        e8m0_from_scale(np.ones(1, np.int32))


@pytest.mark.parametrize("kind", ["ml_dtypes", "jax", "uint8"])
def test_from_scale_passes_e8m0_bytes_through(kind):
    raw = np.array([125, 127, 131], np.uint8)
    if kind == "ml_dtypes":
        s = raw.view(ml_dtypes.float8_e8m0fnu)
    elif kind == "jax":
        s = jnp.asarray(raw).view(jnp.float8_e8m0fnu)
    else:
        s = raw
    got = e8m0_from_scale(s)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, [125, 127, 131])

