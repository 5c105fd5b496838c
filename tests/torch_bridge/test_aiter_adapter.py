"""The AITER adapter against a contract test double (tests/fake_aiter), on CPU.

The double implements the documented signatures of both AITER spellings on top of the torch
reference, so these tests check the adapter's gating, argument mapping and fallback, not AITER's
kernels (those run only on gfx950: see test_real_aiter_matches_oracle).
"""

from __future__ import annotations

import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from inputs import np_to_torch, rope_case, wo_a_checkpoint

import torch_bridge as tb
import woa_jax
from torch_bridge import WoAProjection, _capability, _dispatch
from torch_bridge.backends.aiter import BACKEND as AITER
from woa_jax.testing import assert_bitwise_equal, assert_close


def _case(seed=0, s=5, act="bfloat16", rope="float32"):
    return rope_case(np.random.default_rng(seed), s=s, h=2, dh=512, rd=64, num_groups=1,
                     act=act, rope=rope, pos_dtype=np.int32)


def _oracle_aiter_semantics(c):
    """AITER rotates with cos/sin rounded to o's dtype (docs/NUMERICS.md section 2)."""
    o, pos, cos, sin = c.jax()
    return woa_jax.inverse_rope_group_quant(o, pos, cos.astype(o.dtype), sin.astype(o.dtype), 1)


@pytest.mark.parametrize("flavour,spelling,version",
                         [("main", "scale_layout", "0.1.21.dev3+gfeed"),
                          ("released", "scale_shuffle", "0.1.20")])
def test_both_spellings_map_arguments(fake_aiter, flavour, spelling, version):
    calls = fake_aiter(flavour)
    assert tb.available_backends()["aiter"] == (
        True, f"AITER {version} ({spelling} spelling) on gfx950")
    c = _case()
    q, sc = tb.inverse_rope_group_quant(*c.torch(), 1, 128, backend="aiter")
    ((op, rec),) = calls
    assert op == "inverse_rope_group_quant"
    assert rec[spelling] == ("row" if spelling == "scale_layout" else False)
    assert rec["positions_dtype"] == torch.int64  # int32 in, int64 to AITER
    assert rec["cos_dtype"] == rec["sin_dtype"] == torch.bfloat16  # fp32 in, o's dtype to AITER
    q_ref, sc_ref = _oracle_aiter_semantics(c)
    assert_bitwise_equal(q, q_ref)
    assert_bitwise_equal(sc, sc_ref)


def test_fp16_activations_get_fp16_tables(fake_aiter):
    calls = fake_aiter("main")
    c = _case(act="float16")
    tb.inverse_rope_group_quant(*c.torch(), 1, 128, backend="aiter")
    assert calls[0][1]["cos_dtype"] == torch.float16


def test_tiled_layout_built_from_row(fake_aiter):
    calls = fake_aiter("released")
    c = _case(s=40)
    _, sc = tb.inverse_rope_group_quant(*c.torch(), 1, 128, backend="aiter",
                                        scale_layout="mfma_tile")
    assert calls[0][1]["scale_shuffle"] is False  # released tile bytes differ: never asked for
    _, row = _oracle_aiter_semantics(c)
    assert_bitwise_equal(tb.from_scale_layout(sc, "mfma_tile", 40, 1, 8), row)


@pytest.mark.parametrize("setup,reason", [
    (dict(flavour="old"), "AITER 0.1.19.post1 is older than 0.1.20, the first release with "
                          "batched_gemm_a8w8_mxscale"),
    (dict(arch="gfx942"), "GPU arch is gfx942; AITER's wo_a ops run on gfx950 only"),
    (dict(arch=None), "GPU arch is none; AITER's wo_a ops run on gfx950 only"),
    (dict(rocm=False), "torch is not a ROCm build (torch.version.hip is None)"),
])
def test_gating_rejects_with_reason(fake_aiter, setup, reason):
    fake_aiter(**setup)
    assert tb.available_backends()["aiter"] == (False, reason)
    assert "aiter" not in sys.modules  # rejected before importing AITER
    with pytest.raises(tb.BackendUnavailableError, match="backend 'aiter' cannot run"):
        tb.inverse_rope_group_quant(*_case().torch(), 1, 128, backend="aiter")


def test_env_switch_disables_aiter(fake_aiter, monkeypatch):
    fake_aiter("main")
    monkeypatch.setenv("WOA_USE_AITER", "0")
    _dispatch.reset_caches()
    assert tb.available_backends()["aiter"] == (False, "disabled by WOA_USE_AITER=0")


def test_version_from_source_tree_without_importing(tmp_path, monkeypatch):
    pkg = tmp_path / "aiter"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pkg / "_version.py").write_text("__version__ = version = '0.1.20.post1'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("aiter", None)
    _capability.cache_clear()
    assert _capability.aiter_version() == "0.1.20.post1"
    assert "aiter" not in sys.modules


def test_adapter_checks_scales_before_calling_aiter(fake_aiter):
    calls = fake_aiter("main")
    assert AITER.is_available()[0]
    x = torch.zeros((3, 1, 256), dtype=torch.float8_e4m3fn)
    w = torch.zeros((1, 128, 256), dtype=torch.float8_e4m3fn)
    xs, ws = torch.full((3, 1, 2), 127, dtype=torch.uint8), torch.full((1, 1, 2), 127,
                                                                      dtype=torch.uint8)
    with pytest.raises(TypeError, match="x_scale must be torch.uint8 E8M0 bytes, got torch.float"):
        AITER.batched_gemm_a8w8_mxscale(x, w, xs.float(), ws)
    with pytest.raises(ValueError, match=r"w_scale must have shape \(1, 1, 2\)"):
        AITER.batched_gemm_a8w8_mxscale(x, w, xs, ws[:, :, :1])
    with pytest.raises(ValueError, match=r"x_scale must have shape \(3, 1, 8\)"):
        AITER.inverse_rope_group_quant(*_case(s=3).torch(), 1, 128,
                                       x_scale=torch.empty((3, 1, 4), dtype=torch.uint8))
    assert calls == []
    y = AITER.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=torch.float32)
    assert y.shape == (3, 1, 128) and calls[-1][1]["x_scale_dtype"] == torch.uint8


def test_gemm_through_aiter_and_fallback_for_32_blocks(fake_aiter):
    calls = fake_aiter("main")
    rng = np.random.default_rng(3)
    w, sc = wo_a_checkpoint(rng, g=2, n=128, k=256, block=128)
    x = np_to_torch(w).view(2, 128, 256)[:, :5].transpose(0, 1)  # any fp8 [M, G, K] view
    xs = torch.full((5, 2, 2), 126, dtype=torch.uint8)
    ws = np_to_torch(sc).view(2, 1, 2)
    y = tb.batched_gemm_a8w8_mxscale(x, np_to_torch(w).view(2, 128, 256), xs, ws)
    assert calls[-1][0] == "batched_gemm_a8w8_mxscale"
    ref = woa_jax.batched_gemm_a8w8_mxscale(tb.to_jax(x.contiguous()), tb.to_jax(
        np_to_torch(w).view(2, 128, 256)), tb.to_jax(xs), tb.to_jax(ws))
    assert_close(y, ref, tolerance="gemm_bf16")
    n_calls = len(calls)
    w32 = np_to_torch(w).view(2, 128, 256)
    y32 = tb.batched_gemm_a8w8_mxscale(x, w32, torch.full((5, 2, 8), 127, dtype=torch.uint8),
                                       torch.full((2, 4, 8), 127, dtype=torch.uint8))
    assert len(calls) == n_calls and y32.shape == (5, 2, 128)  # ran on torch instead


def test_gemm_packs_strided_weight_and_scales_for_aiter(fake_aiter):
    """AITER reads w as packed row-major and the scales' last dim as unit stride; the adapter
    packs strided views first (the contract double reads them the kernel's way)."""
    fake_aiter("main")
    rng = np.random.default_rng(5)
    w, sc = wo_a_checkpoint(rng, g=2, n=256, k=256, block=128)
    wt = np_to_torch(w).view(2, 256, 256)
    w_strided = wt[:, ::2]  # [2, 128, 256], K-contiguous, row stride 512
    ws_strided = np_to_torch(sc).view(2, 2, 2).transpose(1, 2).contiguous().transpose(1, 2)[:, :1]
    x = wt[:, :5].transpose(0, 1)
    xs = torch.full((5, 2, 2), 126, dtype=torch.uint8).transpose(1, 2).contiguous().transpose(1, 2)
    assert not (w_strided.is_contiguous() or ws_strided.stride(2) == 1 or xs.stride(2) == 1)
    y = tb.batched_gemm_a8w8_mxscale(x, w_strided, xs, ws_strided, backend="aiter")
    ref = woa_jax.batched_gemm_a8w8_mxscale(*(tb.to_jax(t.contiguous()) for t in (
        x, w_strided, xs, ws_strided)))
    assert_close(y, ref, tolerance="gemm_bf16")


def _projection(seed=4, fp8="float8_e4m3fn", **kw):
    rng = np.random.default_rng(seed)
    c = _case(seed)
    w, sc = wo_a_checkpoint(rng, g=1, n=128, k=1024, fp8=fp8)
    proj = WoAProjection.from_tensors(np_to_torch(w), np_to_torch(sc), 1, *c.torch()[2:], **kw)
    return c, w, sc, proj


def test_projection_runs_the_aiter_chain(fake_aiter):
    calls = fake_aiter("released")
    c, w, sc, proj = _projection()
    y = proj(*c.torch()[:2])
    assert proj.path == "aiter" and proj.fallback_reason is None
    assert [op for op, _ in calls] == ["inverse_rope_group_quant", "batched_gemm_a8w8_mxscale"]
    o, pos, cos, sin = c.jax()
    ref = woa_jax.wo_a_fp8(o, pos, cos.astype(jnp.bfloat16), sin.astype(jnp.bfloat16), w, sc, 1)
    assert_close(y, ref, tolerance="gemm_bf16")
    proj(*c.torch()[:2])
    bf16_tables = [k for k in proj._per_device if k[0] == "cos"]
    assert bf16_tables == [("cos", "cpu", torch.bfloat16)]  # converted once, reused


def test_e4m3fnuz_weight_needs_another_backend(fake_aiter):
    fake_aiter("main")
    c, _, _, proj = _projection(fp8="float8_e4m3fnuz", backend="aiter")
    with pytest.raises(tb.BackendUnavailableError,
                       match="AITER on gfx950 needs float8_e4m3fn, got float8_e4m3fnuz"):
        proj(*c.torch()[:2])
    c, _, _, auto = _projection(fp8="float8_e4m3fnuz")
    auto(*c.torch()[:2])
    assert auto.path == "bf16"
    assert auto.fallback_reason.startswith(
        "aiter: inverse_rope_group_quant: AITER on gfx950 needs float8_e4m3fn")


def test_auto_falls_back_when_aiter_rejects_the_shape(fake_aiter):
    fake_aiter("main")
    c = rope_case(np.random.default_rng(5), s=3, h=2, dh=128, rd=64, num_groups=1)
    q, _ = tb.inverse_rope_group_quant(*c.torch(), 1, 128)
    assert q.shape == (3, 1, 256)  # head_dim 128: AITER refuses, torch runs
    case = _dispatch.rope_case(c.torch()[0], c.torch()[2], 128, torch.float8_e4m3fn,
                               num_groups=1, amax_floor=1e-8, device_type="cpu")
    assert _dispatch.check("aiter", "inverse_rope_group_quant", case) == (
        False, "AITER's kernel is built for head_dim 512 and rope_dim 64, got 128 and 64")


def test_jax_entry_points_describe_the_call_to_aiter(fake_aiter):
    """``torch_bridge.jax_ops`` tells the dispatcher the amax floor and the GEMM's N and K, so
    AITER refuses what it would run wrong (its floor is fixed; its GEMM needs 128-multiples)."""
    from torch_bridge import jax_ops

    fake_aiter("main")
    c = _case()
    with pytest.raises(tb.BackendUnavailableError, match="AITER's amax floor is 1e-08"):
        jax_ops.inverse_rope_group_quant(*c.jax(), 1, 128, amax_floor=woa_jax.CUDA_AMAX_FLOOR,
                                         backend="aiter")
    x = jnp.zeros((3, 1, 256), jnp.float8_e4m3fn)
    w = jnp.zeros((1, 96, 256), jnp.float8_e4m3fn)
    xs, ws = jnp.full((3, 1, 2), 127, jnp.uint8), jnp.full((1, 1, 2), 127, jnp.uint8)
    with pytest.raises(tb.BackendUnavailableError, match="N and K multiples of 128, got N=96"):
        jax_ops.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="aiter")


@pytest.mark.gpu
def test_real_aiter_matches_oracle():
    """On a gfx950 box with AITER: the real kernels against woa_jax (bytes exact)."""
    ok, reason = AITER.is_available()
    if not ok:
        pytest.skip(reason)
    c = rope_case(np.random.default_rng(6), s=64, h=16, dh=512, rd=64, num_groups=2,
                  rope="bfloat16")
    o, pos, cos, sin = (t.cuda() for t in c.torch())
    q, sc = tb.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, backend="aiter")
    q_ref, sc_ref = woa_jax.inverse_rope_group_quant(*c.jax(), 2, 128)
    assert_bitwise_equal(sc.cpu(), sc_ref)
    assert_bitwise_equal(q.cpu(), q_ref)
