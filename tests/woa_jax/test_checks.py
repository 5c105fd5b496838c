"""woa_jax.checks: value checks that name the tensor, the element and what was expected."""

from __future__ import annotations

import re

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from woa_jax import checks

E4M3FN = ml_dtypes.float8_e4m3fn


@pytest.mark.parametrize("floor", [1e-8, 1e-10, np.float32(1e-8), 1])
def test_amax_floor_accepts_finite_positive_numbers(floor):
    assert checks.check_amax_floor(floor) == float(floor)


@pytest.mark.parametrize("floor", [float("nan"), float("inf"), 0.0, -1.0])
def test_amax_floor_names_the_bad_value(floor):
    with pytest.raises(ValueError, match=r"amax_floor must be a finite number > 0, got " +
                       re.escape(repr(floor))):
        checks.check_amax_floor(floor)


@pytest.mark.parametrize("floor", ["1e-8", None, [1e-8], True])
def test_amax_floor_of_another_type_is_a_type_error(floor):
    with pytest.raises(TypeError, match=r"amax_floor must be a finite number > 0, got "
                       rf"{type(floor).__name__} " + re.escape(repr(floor))):
        checks.check_amax_floor(floor)


@pytest.mark.parametrize("value, error", [(2, None), (0, ValueError), (-1, ValueError),
                                          (2.0, TypeError), ("2", TypeError), (None, TypeError),
                                          (True, TypeError)])
def test_integers_are_checked_for_type_then_value(value, error):
    if error is None:
        assert checks.check_int(value, "num_groups") == 2
    else:
        with pytest.raises(error, match="num_groups must be a"):
            checks.check_int(value, "num_groups")


def _weight(fp8_dtype=E4M3FN):
    return np.full((4, 256), 0.5, np.float32).astype(fp8_dtype)


def test_clean_weights_pass_with_byte_and_float_scales():
    for scale in (np.full((1, 2), 120, np.uint8),
                  np.full((1, 2), 120, np.uint8).view(ml_dtypes.float8_e8m0fnu),
                  np.array([[2.0 ** -7, 0.75]], np.float32),
                  jnp.array([[2.0 ** -7, 1.0]], jnp.bfloat16)):
        checks.check_wo_a_weight_values(_weight(), scale)
    checks.check_wo_a_weight_values(jnp.asarray(_weight()), np.array([[1.0, 2.0 ** 127]]),
                                    require_e8m0=True)


@pytest.mark.parametrize("fp8_dtype, byte", [(E4M3FN, 0x7F), (E4M3FN, 0xFF),
                                             (ml_dtypes.float8_e4m3fnuz, 0x80)])
def test_nan_weight_bytes_are_named(fp8_dtype, byte):
    w = _weight(fp8_dtype)
    w.view(np.uint8)[2, 130] = byte
    with pytest.raises(ValueError, match=rf"weight: element \[2, 130\] is NaN \(fp8 byte "
                                         rf"0x{byte:02x}\).*corrupt"):
        checks.check_wo_a_weight_values(w, np.full((1, 2), 127, np.uint8))


def test_e8m0_nan_byte_is_named():
    scale = np.full((1, 2), 127, np.uint8)
    scale[0, 1] = 255
    with pytest.raises(ValueError, match=r"weight_scale: element \[0, 1\] is the E8M0 NaN byte"):
        checks.check_wo_a_weight_values(_weight(), scale.view(ml_dtypes.float8_e8m0fnu))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 0.0, -0.5])
def test_corrupt_float_scales_are_named(value):
    scale = np.array([[1.0, value]], np.float32)
    with pytest.raises(ValueError, match=r"weight_scale: element \[0, 1\] = .*expected finite "
                                         r"scales > 0"):
        checks.check_wo_a_weight_values(_weight(), scale)


@pytest.mark.parametrize("value", [0.75, 2.0 ** -130, 2.0 ** 128])
def test_require_e8m0_names_a_scale_the_fp8_path_cannot_take(value):
    scale = np.array([[1.0, value]], np.float64)
    checks.check_wo_a_weight_values(_weight(), scale)
    with pytest.raises(ValueError, match=r"element \[0, 1\] = .* is not a power of two in the "
                                         r"E8M0 range.*BF16 path"):
        checks.check_wo_a_weight_values(_weight(), scale, require_e8m0=True)


def test_value_check_rejects_wrong_dtypes():
    with pytest.raises(TypeError, match="weight must have dtype"):
        checks.check_wo_a_weight_values(np.zeros((4, 256), np.float32), np.ones((1, 2)))
    with pytest.raises(TypeError, match="weight_scale must have dtype"):
        checks.check_wo_a_weight_values(_weight(), np.ones((1, 2), np.int32))


def test_errors_use_the_given_tensor_names():
    names = ("layers.3.attn.wo_a.weight", "layers.3.attn.wo_a.scale")
    scale = np.array([[1.0, float("nan")]], np.float32)
    with pytest.raises(ValueError, match=r"^layers\.3\.attn\.wo_a\.scale: element \[0, 1\] = nan"):
        checks.check_wo_a_weight_values(_weight(), scale, names=names)
    with pytest.raises(TypeError, match=r"^layers\.3\.attn\.wo_a\.weight must have dtype"):
        checks.check_wo_a_weight_values(np.zeros((4, 256), np.float32), scale, names=names)


def test_torch_tensors_are_read_through_their_bytes():
    torch = pytest.importorskip("torch")
    w = torch.full((4, 256), 0.5).to(torch.float8_e4m3fn)
    w.view(torch.uint8)[1, 7] = 0x7F
    with pytest.raises(ValueError, match=r"weight: element \[1, 7\] is NaN"):
        checks.check_wo_a_weight_values(w, torch.full((1, 2), 127, dtype=torch.uint8))


def test_rope_tables_of_two_dtypes_are_rejected():
    o = np.zeros((2, 1, 512), ml_dtypes.bfloat16)
    cos = np.zeros((4, 32), np.float32)
    with pytest.raises(TypeError, match="cos_cache and sin_cache must have one dtype"):
        checks.check_rope_inputs(o, np.zeros(2, np.int32), cos, cos.astype(ml_dtypes.bfloat16))
