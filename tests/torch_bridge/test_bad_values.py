"""Bad values through every entry point: corrupt checkpoints, wrong rope tables, bad amax floors,
float GEMM scales. Each raises the documented error; a valid checkpoint the FP8 path cannot take
runs the BF16 chain with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from inputs import gemm_operands, np_to_torch, rope_case, wo_a_checkpoint

import torch_bridge as tb
from torch_bridge import jax_ops
from torch_bridge.wo_b import WoBProjection, group_quant_e8m0_2d
from woa_jax.testing import assert_bitwise_equal

G, N, H, DH = 2, 128, 4, 64  # K = H * DH / G = 128


def _layer(seed=0):
    rng = np.random.default_rng(seed)
    c = rope_case(rng, s=3, h=H, dh=DH, rd=64, num_groups=G, gs=128)
    w, sc = wo_a_checkpoint(rng, g=G, n=N, k=H * DH // G)
    return c, np_to_torch(w), np_to_torch(sc)


def _float_scales(sc: torch.Tensor) -> torch.Tensor:
    return torch.exp2(sc.view(torch.uint8).float() - 127)


@pytest.mark.parametrize("value,why", [(float("nan"), "nan"), (float("inf"), "inf"),
                                       (0.0, "0.0"), (-0.25, "-0.25")])
def test_corrupt_float_scale_raises_naming_the_element(value, why):
    c, w, sc = _layer()
    scale = _float_scales(sc)
    scale[1, 0] = value
    with pytest.raises(ValueError, match=rf"weight_scale: element \[1, 0\] = {why}; expected "
                                         "finite scales > 0, so the checkpoint is corrupt"):
        tb.WoAProjection(w, scale, G, *c.torch()[2:])
    with pytest.raises(ValueError, match=r"weight_scale: element \[1, 0\]"):
        tb.wo_a_bf16(*c.torch(), w, scale, G)


def test_nan_weight_byte_and_nan_scale_byte_raise():
    c, w, sc = _layer()
    bad = w.clone()
    bad.view(torch.uint8)[3, 5] = 0x7F
    with pytest.raises(ValueError, match=r"weight: element \[3, 5\] is NaN \(fp8 byte 0x7f\)"):
        tb.WoAProjection(bad, sc, G, *c.torch()[2:])
    nan_scale = sc.clone()
    nan_scale.view(torch.uint8)[0, 0] = 0xFF
    with pytest.raises(ValueError, match=r"weight_scale: element \[0, 0\] is the E8M0 NaN byte"):
        tb.WoAProjection(w, nan_scale, G, *c.torch()[2:])
    with pytest.raises(ValueError, match=r"wo_b weight: element \[3, 5\] is NaN"):
        WoBProjection(bad, sc)


def test_non_power_of_two_float_scale_is_valid_and_takes_bf16_with_reason(triton_off):
    c, w, sc = _layer()
    scale = _float_scales(sc) * 1.5
    proj = tb.WoAProjection(w, scale, G, *c.torch()[2:])
    y = proj(*c.torch()[:2])
    assert proj.path == "bf16" and "not a power of two" in proj.fallback_reason
    assert torch.isfinite(y.float()).all()
    with pytest.raises(ValueError, match="the FP8 chain cannot run: .*not a power of two"):
        tb.wo_a_fp8(*c.torch(), w, scale, G)


def test_power_of_two_float_scale_runs_fp8_like_bytes():
    c, w, sc = _layer()
    by_bytes = tb.WoAProjection(w, sc, G, *c.torch()[2:], backend="torch")
    by_floats = tb.WoAProjection(w, _float_scales(sc), G, *c.torch()[2:], backend="torch")
    assert_bitwise_equal(by_floats(*c.torch()[:2]), by_bytes(*c.torch()[:2]))


def test_rope_table_of_the_wrong_width_raises():
    c, w, sc = _layer()
    _, _, cos, sin = c.torch()
    wide = torch.cat([cos, cos], dim=1)  # 64 columns: a 128-lane table for a 64-lane rope
    with pytest.raises(ValueError, match=r"cos_cache \[P, rope_dim / 2\] = \(64, 64\) rotates "
                                         "128 lanes per head, but this layer's rope_dim is 64"):
        tb.WoAProjection(w, sc, G, wide, wide)
    proj = tb.WoAProjection(w, sc, G, cos, sin, rope_dim=None)  # width from the tables
    assert tuple(proj.cos_cache.shape) == (64, 32)


@pytest.mark.parametrize("floor", [float("nan"), 0.0, -1.0, float("inf"), "1e-8", True])
def test_bad_amax_floor_raises_in_every_entry_point(floor):
    c, w, sc = _layer()
    o, pos, cos, sin = c.torch()
    match = "amax_floor must be a finite number > 0"
    calls = {
        "op": lambda: tb.inverse_rope_group_quant(o, pos, cos, sin, G, 128, backend="torch",
                                                  amax_floor=floor),
        "wo_a_fp8": lambda: tb.wo_a_fp8(o, pos, cos, sin, w, sc, G, amax_floor=floor),
        "projection": lambda: tb.WoAProjection(w, sc, G, cos, sin, amax_floor=floor),
        "wo_b": lambda: WoBProjection(w, sc, amax_floor=floor),
        "quant_2d": lambda: group_quant_e8m0_2d(o.reshape(3, -1), amax_floor=floor),
        "jax_op": lambda: jax_ops.inverse_rope_group_quant(*c.jax(), G, 128, amax_floor=floor),
        "jax_chain": lambda: jax_ops.wo_a_fp8(*c.jax(), tb.to_jax(w), tb.to_jax(sc), G,
                                              amax_floor=floor),
    }
    error = ValueError if isinstance(floor, float) else TypeError  # "1e-8", True: wrong type
    for name, call in calls.items():
        with pytest.raises(error, match=match):
            call()
            pytest.fail(f"{name} returned")


def test_gemm_takes_float_power_of_two_scales_losslessly():
    x, w, xs, ws = (np_to_torch(a) for a in gemm_operands(np.random.default_rng(0), m=3, g=2,
                                                           n=128, k=256))
    want = tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="torch")
    for xs_f, ws_f in ((_float_scales(xs), ws), (xs, _float_scales(ws)),
                       (_float_scales(xs), _float_scales(ws).to(torch.bfloat16))):
        got = tb.batched_gemm_a8w8_mxscale(x, w, xs_f, ws_f, backend="torch")
        assert_bitwise_equal(got, want)
    bad = _float_scales(ws)
    bad[1, 0, 1] = 3.0
    with pytest.raises(ValueError, match=r"w_scale is not losslessly representable as E8M0: "
                                         r"element \[1, 0, 1\] = 3.0 is not a power of two; "
                                         ".*woa_jax.e8m0_from_scale"):
        tb.batched_gemm_a8w8_mxscale(x, w, xs, bad, backend="torch")
