"""WoAProjection and the functional chains against woa_jax's wo_a_bf16 / wo_a_fp8."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from inputs import np_to_torch, rope_case, wo_a_checkpoint

import torch_bridge as tb
import woa_jax
from torch_bridge import WoAProjection
from woa_jax.testing import assert_bitwise_equal, assert_close

G, N, H, DH = 2, 256, 4, 128  # K = H * DH / G = 256


def _layer(seed=0, *, block=128, fp8="float8_e4m3fn", s=5, scale_dtype="e8m0"):
    rng = np.random.default_rng(seed)
    c = rope_case(rng, s=s, h=H, dh=DH, rd=64, num_groups=G, gs=block)
    w, sc = wo_a_checkpoint(rng, g=G, n=N, k=H * DH // G, block=block, fp8=fp8)
    if scale_dtype == "f32":
        sc = sc.astype(np.float32)
    return c, w, sc


def _proj(c, w, sc, **kw):
    _, _, cos, sin = c.torch()
    return WoAProjection.from_tensors(np_to_torch(w), None if sc is None else np_to_torch(sc),
                                      G, cos, sin, **kw)


def test_auto_on_cpu_runs_bf16_chain_with_reasons(triton_off):
    c, w, sc = _layer()
    proj = _proj(c, w, sc)
    o, pos, _, _ = c.torch()
    y = proj(o, pos)
    assert proj.path == "bf16"
    assert proj.fallback_reason == ("aiter: AITER is not installed (no 'aiter' module); "
                                    "triton: disabled by WOA_USE_TRITON=0")
    ref = woa_jax.wo_a_bf16(*c.jax(), w, sc, G)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (5, G, N)
    assert_close(y, ref, tolerance="gemm_bf16")
    assert_close(y, woa_jax.wo_a_truth(*c.jax(), w, sc, G), tolerance="bf16_chain_vs_truth")
    table = proj.explain(o)
    assert table["torch"] == (True, "FP8 chain on torch; only when named: auto does not take "
                                    "torch for wo_a")
    assert table["bf16"] == (True, "auto picks it: the BF16 chain runs any validated wo_a call")
    assert table["aiter"] == (False, "AITER is not installed (no 'aiter' module)")


@pytest.mark.parametrize("block,fp8", [(128, "float8_e4m3fn"), (32, "float8_e4m3fn"),
                                       (128, "float8_e4m3fnuz")])
def test_torch_fp8_chain_matches_oracle(block, fp8):
    c, w, sc = _layer(1, block=block, fp8=fp8)
    proj = _proj(c, w, sc, backend="torch")
    y = proj(*c.torch()[:2])
    assert proj.path == "torch" and proj.fallback_reason is None
    ref = woa_jax.wo_a_fp8(*c.jax(), w, sc, G)
    assert_close(y, ref, tolerance="gemm_bf16")
    assert_close(y, woa_jax.wo_a_bf16(*c.jax(), w, sc, G), tolerance="fp8_chain_vs_bf16")


def test_weight_is_a_zero_copy_view_and_bf16_weight_is_lazy_and_cached():
    c, w, sc = _layer(2)
    weight = np_to_torch(w)
    proj = WoAProjection.from_tensors(weight, np_to_torch(sc), G, *c.torch()[2:],
                                      backend="torch")
    assert proj.weight_fp8.data_ptr() == weight.data_ptr()
    assert tuple(proj.weight_fp8.shape) == (G, N, 256)
    assert tuple(proj.weight_scale_e8m0.shape) == (G, N // 128, 2)
    proj(*c.torch()[:2])
    assert proj._w_bf16 is None  # the FP8 chain never built the BF16 weight
    wb = proj.weight_bf16
    assert wb is proj.weight_bf16
    exact = woa_jax.dequant_wo_a_weight(w, sc, G, dtype=jnp.bfloat16)
    assert_bitwise_equal(wb, exact)


def test_fp32_power_of_two_scales_are_converted_losslessly():
    c, w, sc = _layer(3, scale_dtype="f32")
    proj = _proj(c, w, sc, backend="torch")
    assert proj.weight_scale_e8m0.dtype == torch.uint8
    np.testing.assert_array_equal(proj.weight_scale_e8m0.reshape(-1, 2).numpy(),
                                  woa_jax.e8m0_from_scale(sc))


def test_non_power_of_two_scale_falls_back_with_reason(triton_off):
    c, w, sc = _layer(4, scale_dtype="f32")
    sc = sc * np.float32(1.5)
    proj = _proj(c, w, sc)
    y = proj(*c.torch()[:2])
    assert proj.path == "bf16"
    assert proj.fallback_reason.startswith(
        "weight scale unusable by the FP8 path: weight_scale is not losslessly representable")
    assert_close(y, woa_jax.wo_a_bf16(*c.jax(), w, sc, G), tolerance="gemm_bf16")
    with pytest.raises(tb.BackendUnavailableError, match="not losslessly representable"):
        _proj(c, w, sc, backend="torch")(*c.torch()[:2])


def test_bf16_checkpoint_without_scale_falls_back(triton_off):
    c, w, sc = _layer(5)
    w_bf16 = np.asarray(woa_jax.dequant_wo_a_weight(w, sc, G, dtype=jnp.bfloat16)).reshape(
        G * N, -1)
    proj = _proj(c, w_bf16, None)
    y = proj(*c.torch()[:2])
    assert proj.path == "bf16" and proj.fallback_reason == "bfloat16 checkpoint has no scale"
    assert_close(y, woa_jax.wo_a_bf16(*c.jax(), w, sc, G), tolerance="gemm_bf16")
    with pytest.raises(tb.BackendUnavailableError, match="bfloat16 checkpoint has no scale"):
        _proj(c, w_bf16, None, backend="torch")(*c.torch()[:2])


def test_empty_batch_returns_empty_result():
    c, w, sc = _layer(6, s=0)
    for backend in ("torch", "bf16"):
        y = _proj(c, w, sc, backend=backend)(*c.torch()[:2])
        assert tuple(y.shape) == (0, G, N) and y.dtype == torch.bfloat16


def test_positions_clamped_on_both_chains():
    c, w, sc = _layer(7)
    o, pos, _, _ = c.torch()
    p = c.cos.shape[0]
    bad = torch.tensor([-3, 0, p - 1, p, 10 * p], dtype=torch.int32)
    good = bad.clamp(0, p - 1)
    for backend in ("torch", "bf16"):
        proj = _proj(c, w, sc, backend=backend)
        assert torch.equal(proj(o, bad).view(torch.int16), proj(o, good).view(torch.int16))


def test_bad_weights_are_rejected_at_load():
    c, w, sc = _layer(8)
    cos, sin = c.torch()[2:]
    with pytest.raises(ValueError, match=r"weight must be 2-D \[G \* N, K\]"):
        WoAProjection.from_tensors(np_to_torch(w).reshape(G, N, -1), np_to_torch(sc), G, cos, sin)
    with pytest.raises(ValueError, match="needs its block scale"):
        WoAProjection.from_tensors(np_to_torch(w), None, G, cos, sin)
    with pytest.raises(ValueError, match="does not tile weight"):
        WoAProjection.from_tensors(np_to_torch(w), np_to_torch(sc)[:, :1], G, cos, sin)
    with pytest.raises(ValueError, match="not divisible by num_groups=3"):
        WoAProjection.from_tensors(np_to_torch(w), np_to_torch(sc), 3, cos, sin)
    with pytest.raises(TypeError, match="weight must be float8_e4m3fn"):
        WoAProjection.from_tensors(torch.zeros((G * N, 256), dtype=torch.int8), None, G, cos, sin)
    with pytest.raises(ValueError, match="takes no scale"):
        WoAProjection.from_tensors(torch.zeros((G * N, 256), dtype=torch.bfloat16),
                                   np_to_torch(sc), G, cos, sin)
    proj = WoAProjection.from_tensors(np_to_torch(w), np_to_torch(sc), G, cos, sin)
    o = torch.zeros((2, 2, 128), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="gives G \\* K = 256, but the weight expects"):
        proj(o, torch.zeros(2, dtype=torch.int64))


def test_jax_arrays_in_and_out(triton_off):
    c, w, sc = _layer(9)
    proj = WoAProjection.from_tensors(jnp.asarray(w), jnp.asarray(sc), G, *c.jax()[2:],
                                      backend="torch")
    y = proj(*c.jax()[:2])
    assert isinstance(y, jax.Array) and y.dtype == jnp.bfloat16
    assert_close(y, woa_jax.wo_a_fp8(*c.jax(), w, sc, G), tolerance="gemm_bf16")


def test_functional_forms():
    c, w, sc = _layer(10)
    tw, tsc = np_to_torch(w), np_to_torch(sc)
    y16 = tb.wo_a_bf16(*c.torch(), tw, tsc, G)
    assert_close(y16, woa_jax.wo_a_bf16(*c.jax(), w, sc, G), tolerance="gemm_bf16")
    y8 = tb.wo_a_fp8(*c.torch(), tw, tsc, G, backend="torch")
    assert_close(y8, woa_jax.wo_a_fp8(*c.jax(), w, sc, G), tolerance="gemm_bf16")
    y8j = tb.wo_a_fp8(*c.jax(), jnp.asarray(w), jnp.asarray(sc), G, backend="torch")
    assert isinstance(y8j, jax.Array)
    with pytest.raises(ValueError, match="FP8 chain cannot run"):
        tb.wo_a_fp8(*c.torch(), tw, tsc.view(torch.uint8).float() * 0 + 3.0, G)


def test_path_decided_once_per_device(monkeypatch, triton_off):
    c, w, sc = _layer(11)
    proj = _proj(c, w, sc)
    calls = []
    real = tb._dispatch.check
    monkeypatch.setattr(tb._dispatch, "check", lambda *a: calls.append(a[0]) or real(*a))
    for _ in range(3):
        proj(*c.torch()[:2])
    assert calls == ["aiter", "triton", "bf16"]


def test_jax_ops_wo_a_fp8_takes_the_checkpoint_weight_like_the_oracle():
    """Same arguments as woa_jax.wo_a_fp8 and torch_bridge.wo_a_fp8: the [G * N, K] weight and
    its 2-D scale, under jax.jit (the 3-D GEMM layout is accepted too)."""
    from torch_bridge import jax_ops

    c, w, sc = _layer(12)
    ref = woa_jax.wo_a_fp8(*c.jax(), w, sc, G)
    jw, jsc = jnp.asarray(w), jnp.asarray(sc)
    for backend in (None, "torch"):
        y = jax.jit(lambda *a, b=backend: jax_ops.wo_a_fp8(*a, G, backend=b))(*c.jax(), jw, jsc)
        assert_close(y, ref, tolerance="gemm_bf16")
    w3, ws3 = woa_jax.wo_a_weight_e8m0(jw, jsc, G)
    assert_close(jax_ops.wo_a_fp8(*c.jax(), w3, ws3, G), ref, tolerance="gemm_bf16")
    assert_close(tb.wo_a_fp8(*c.jax(), jw, jsc, G, backend="torch"), ref, tolerance="gemm_bf16")


def test_first_call_under_capture_raises_before_any_conversion(monkeypatch):
    """A layer's one-time copy to a CUDA device is refused under CUDA-graph capture before it
    starts: a host-to-device copy there would end the capture and hide the reason."""
    c, w, sc = _layer()
    proj = _proj(c, w, sc)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="call it once outside capture"):
        proj._on("w_bf16", torch.device("cuda", 0))
    assert not proj._per_device
