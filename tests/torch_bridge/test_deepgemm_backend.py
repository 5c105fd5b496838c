"""The ``deepgemm`` backend: when it is available and why not, what it accepts, and what it
hands DeepGEMM, checked against a stand-in ``deep_gemm`` module that holds DeepGEMM's sm_90
contract (fp32 token-major activation scales padded to 4 tokens, fp32 weight scales) and
multiplies with the pure-torch reference. The quant runs on the Triton interpreter.
GPU axis: ``tests/ops/test_deepgemm.py``."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import chain_tensors, gemm_tensors  # noqa: E402

import torch_bridge as tb  # noqa: E402
from torch_bridge import _capability, _dispatch  # noqa: E402
from torch_bridge._dispatch import BackendUnavailableError, Case  # noqa: E402
from torch_bridge.backends import deepgemm  # noqa: E402
from torch_bridge.backends.torch_ref import BACKEND as REF  # noqa: E402

pytestmark = pytest.mark.usefixtures("clean_dispatch")


def _fake_deep_gemm(calls: list) -> types.ModuleType:
    dg = types.ModuleType("deep_gemm")
    dg.__version__ = "0.0-stand-in"

    def get_tma_aligned_size(x: int, element_size: int) -> int:
        step = 16 // element_size
        return -(-x // step) * step

    def fp8_einsum(expr, a, b, d, c=None, recipe=None):
        (x, sfa), (w, sfb) = a, b
        m, g, k = x.shape
        ks = k // 128
        pad = get_tma_aligned_size(m, 4)
        assert expr == "bhr,hdr->bhd" and recipe == (1, 128, 128) and c is None
        assert sfa.dtype == sfb.dtype == torch.float32 and d.dtype == torch.bfloat16
        assert tuple(sfa.shape) == (m, g, ks) and x.is_contiguous() and d.is_contiguous()
        # DeepGEMM reads the activation scales by this layout, not by the view's strides.
        assert sfa.stride() == (1, ks * pad, pad), sfa.stride()
        assert sfb.is_contiguous() and tuple(sfb.shape) == (g, w.shape[1] // 128, ks)
        # Its weight-scale check, and TMA's 16-byte strides on every dim, size-1 dims included.
        assert sfb.stride(0) == sfb.shape[1] * sfb.shape[2], sfb.stride()
        for t in (x, w):
            assert t.stride(-1) == 1 and all(st % 16 == 0 for st in t.stride()[:-1]), t.stride()
        calls.append(sfb)
        as_bytes = [((t.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
                    for t in (sfa, sfb)]
        d.copy_(REF.batched_gemm_a8w8_mxscale(x, w, *as_bytes, dtype=torch.bfloat16))

    dg.get_tma_aligned_size = get_tma_aligned_size
    dg.fp8_einsum = fp8_einsum
    return dg


@pytest.fixture
def einsum_calls(monkeypatch) -> list:
    """The stand-in installed as ``deep_gemm``; the weight scales of each einsum call."""
    calls: list = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _fake_deep_gemm(calls))
    deepgemm.deep_gemm.cache_clear()
    yield calls
    deepgemm.deep_gemm.cache_clear()
    deepgemm.weight_scales.clear()


@pytest.fixture
def on_hopper(monkeypatch, einsum_calls):
    """The probe as an sm_90 machine outside the interpreter would answer it."""
    import torch_bridge.backends.triton as triton_backend

    monkeypatch.setattr(deepgemm, "interpreter_on", lambda: False)
    monkeypatch.setattr(triton_backend, "interpreter_on", lambda: False)
    monkeypatch.setattr(_capability, "gpu_arch", lambda *a: "sm_90")
    _dispatch.reset_caches()
    yield einsum_calls
    _dispatch.reset_caches()


# -- probe ------------------------------------------------------------------------------------


def test_available_with_deep_gemm_on_sm_90(on_hopper):
    assert deepgemm.BACKEND.is_available() == (True, "DeepGEMM 0.0-stand-in on sm_90")


def test_unavailable_under_the_interpreter_says_why():
    ok, why = deepgemm.BACKEND.is_available()
    assert not ok and "TRITON_INTERPRET=1" in why


def test_unavailable_off_sm_90_names_the_arch(monkeypatch, einsum_calls):
    monkeypatch.setattr(deepgemm, "interpreter_on", lambda: False)
    monkeypatch.setattr(_capability, "gpu_arch", lambda *a: "sm_100")
    assert deepgemm.BACKEND.is_available() == (
        False, "DeepGEMM's fp32-scale recipe (1, 128, 128) runs on sm_90 here, got sm_100")


def test_unavailable_without_a_gpu_says_why(monkeypatch):
    monkeypatch.setattr(deepgemm, "interpreter_on", lambda: False)
    monkeypatch.setattr(_capability, "gpu_arch", lambda *a: None)
    assert deepgemm.BACKEND.is_available() == (
        False, "DeepGEMM's fp32-scale recipe (1, 128, 128) runs on sm_90 here, got no GPU "
               "(torch.cuda.is_available() is False)")


def test_unavailable_without_triton_says_why(monkeypatch, on_hopper):
    monkeypatch.setenv("WOA_USE_TRITON", "0")
    _dispatch.reset_caches()
    ok, why = deepgemm.BACKEND.is_available()
    assert not ok and why == ("its quant runs on the triton backend, which is unavailable: "
                              "disabled by WOA_USE_TRITON=0")


@pytest.mark.parametrize("module,reason", [
    (None, "deep_gemm does not import (ModuleNotFoundError"),
    (types.ModuleType("deep_gemm"), "deep_gemm ? lacks fp8_einsum, get_tma_aligned_size"),
])
def test_unavailable_without_a_usable_deep_gemm(monkeypatch, module, reason):
    monkeypatch.setattr(deepgemm, "interpreter_on", lambda: False)
    monkeypatch.setattr(_capability, "gpu_arch", lambda *a: "sm_90")
    monkeypatch.setitem(sys.modules, "deep_gemm", module)
    deepgemm.deep_gemm.cache_clear()
    try:
        ok, why = deepgemm.BACKEND.is_available()
    finally:
        deepgemm.deep_gemm.cache_clear()
    assert not ok and why.startswith(reason), why


# -- what it accepts ----------------------------------------------------------------------------


def _gemm_case(**changes) -> Case:
    base = dict(device_type="cuda", fp8_dtype="float8_e4m3fn", quant_group_size=128,
                out_dtype="bfloat16", extra=(("num_groups", 2), ("m", 4), ("n", 1024),
                                             ("k", 4096)))
    return Case(**{**base, **changes})


@pytest.mark.parametrize("changes,reason", [
    ({}, "ok"),
    ({"device_type": "cpu"}, "tensors are on cpu; DeepGEMM runs on cuda"),
    ({"fp8_dtype": "float8_e4m3fnuz"}, "fp8 dtype float8_e4m3fnuz: DeepGEMM takes "
                                       "float8_e4m3fn"),
    ({"quant_group_size": 32}, "scale block 32: DeepGEMM's recipe takes 128"),
    ({"out_dtype": "float32"}, "output dtype float32: DeepGEMM's einsum writes bf16"),
    ({"extra": (("n", 1000),)}, "N = 1000 is not a multiple of the weight block 128"),
    ({"head_dim": 192}, "head_dim 192: the quant writes DeepGEMM's scales per head, so 128 "
                        "must divide it"),
])
def test_gemm_support_rules(changes, reason):
    ok, why = deepgemm.BACKEND.supports("batched_gemm_a8w8_mxscale", _gemm_case(**changes))
    assert (ok, why) == (reason == "ok", reason)


def test_named_only_never_auto(on_hopper):
    """Auto never walks to it; named, the whole chain runs on it where both ops accept."""
    assert all("deepgemm" not in order for order in _dispatch.AUTO_ORDER.values())
    case = _dispatch.wo_a_case("bfloat16", torch.empty(8, 32), 512, device_type="cuda",
                               fp8_dtype="float8_e4m3fn", quant_group_size=128, num_groups=2,
                               n=1024, k=4096, amax_floor=1e-8)
    assert _dispatch.check("deepgemm", "wo_a", case) == (True, "FP8 chain on deepgemm")


def test_named_backend_raises_with_the_reason(rng):
    """On this machine (no sm_90 GPU) a named deepgemm call raises, and says why."""
    x, w, xs, ws = gemm_tensors(rng, 2, 2, 128, 256)
    with pytest.raises(BackendUnavailableError, match="backend 'deepgemm' cannot run "
                                                      "batched_gemm_a8w8_mxscale: DeepGEMM"):
        tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="deepgemm")


# -- what it hands DeepGEMM ---------------------------------------------------------------------


@pytest.mark.parametrize("s", [1, 5, 8])
def test_chain_hands_deep_gemm_its_layout_and_gets_the_reference_bits(rng, einsum_calls, s):
    """The quant writes the scales token-major in fp32 and the result is the reference
    chain's, bit for bit (the stand-in multiplies as the reference does)."""
    o, pos, cos, sin, w, ws = chain_tensors(rng, s, g=2, n=256)
    y = deepgemm.BACKEND.wo_a_fp8(o, pos, cos, sin, w, ws, 2, amax_floor=1e-8)
    x, xs = REF.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
    want = REF.batched_gemm_a8w8_mxscale(x, w, xs.view(torch.uint8), ws, dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, want)
    assert len(einsum_calls) == 1


@pytest.mark.parametrize("m", [1, 3, 6])
def test_gemm_op_converts_row_scales(rng, einsum_calls, m):
    x, w, xs, ws = gemm_tensors(rng, m, 2, 256, 512)
    out = torch.empty((m, 2, 512), dtype=torch.bfloat16)[:, :, :256]  # N contiguous, padded
    y = deepgemm.BACKEND.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=out)
    assert y is out
    assert torch.equal(y, REF.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=torch.bfloat16))


@pytest.mark.parametrize("m", [1, 4, 7])
def test_activation_scales_are_the_decoded_bytes_in_deep_gemms_layout(einsum_calls, m):
    """Every byte value, 0 and 255 included, decodes as ``e8m0_decode`` does, into ``[G, Ks,
    M padded to 4]`` seen as ``[M, G, Ks]``."""
    from torch_bridge.backends.torch_ref import e8m0_decode

    g, ks = 4, 8
    xs = (torch.arange(m * g * ks) * 37 % 256).to(torch.uint8).reshape(m, g, ks)
    xs[0, 0, :2] = torch.tensor([0, 255], dtype=torch.uint8)
    sf = deepgemm.activation_scales(xs)
    pad = -(-m // 4) * 4
    assert sf.shape == (m, g, ks) and sf.stride() == (1, ks * pad, pad)
    assert sf.dtype == torch.float32
    assert torch.equal(sf.view(torch.int32), e8m0_decode(xs).view(torch.int32))


def test_size_one_dims_reach_deep_gemm_with_row_major_strides(rng, einsum_calls):
    """One group (V4-Flash at TP8) in views whose size-1 dims have strides DeepGEMM would
    reject, though ``contiguous()`` keeps them: the backend hands it row-major copies."""
    x, w, xs, ws = gemm_tensors(rng, 4, 1, 256, 512)
    odd = [t.as_strided(t.shape, (t.stride(0), 7, *t.stride()[2:])) for t in (x,)] + [
        t.as_strided(t.shape, (7, *t.stride()[1:])) for t in (w, ws)]
    assert all(t.is_contiguous() for t in odd)
    y = deepgemm.BACKEND.batched_gemm_a8w8_mxscale(odd[0], odd[1], xs, odd[2])
    assert torch.equal(y, REF.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=torch.bfloat16))


def test_fp32_output_refused(rng, einsum_calls):
    x, w, xs, ws = gemm_tensors(rng, 2, 2, 128, 256)
    with pytest.raises(BackendUnavailableError, match="cannot write torch.float32"):
        deepgemm.BACKEND.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=torch.float32)


def test_weight_scales_decoded_once_per_tensor(rng, einsum_calls):
    """Fresh views of one scale tensor share one decode; an in-place update decodes again;
    ``reset_caches`` drops the decodes."""
    x, w, xs, ws = gemm_tensors(rng, 2, 2, 128, 256)
    for _ in range(2):
        deepgemm.BACKEND.batched_gemm_a8w8_mxscale(x, w, xs, ws.view(torch.uint8))
    assert einsum_calls[0] is einsum_calls[1]
    ws.add_(1)
    y = deepgemm.BACKEND.batched_gemm_a8w8_mxscale(x, w, xs, ws.view(torch.uint8))
    assert einsum_calls[2] is not einsum_calls[1]
    assert torch.equal(y, REF.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=torch.bfloat16))
    assert len(deepgemm.weight_scales._made) == 1
    _dispatch.reset_caches()
    assert not deepgemm.weight_scales._made


# -- through the public entry points ------------------------------------------------------------


@pytest.fixture
def named_here(monkeypatch, einsum_calls):
    """The backend as an sm_90 machine would offer it, on this machine's interpreted CPU
    tensors: its own device rule reads them as cuda; the quant's stays the Triton backend's."""
    monkeypatch.setattr(deepgemm, "interpreter_on", lambda: False)
    monkeypatch.setattr(_capability, "gpu_arch", lambda *a: "sm_90")
    real = deepgemm.BACKEND.supports

    def supports(op, case):
        if op == "inverse_rope_group_quant":
            return _dispatch.get_backend("triton").supports(op, case)
        return real(op, dataclasses.replace(case, device_type="cuda"))

    monkeypatch.setattr(deepgemm.BACKEND, "supports", supports)
    _dispatch.reset_caches()
    yield einsum_calls
    _dispatch.reset_caches()


def test_layer_function_and_ops_named_deepgemm(rng, named_here):
    """``WoAProjection``, ``wo_a_fp8`` and both ops with ``backend="deepgemm"`` run on it (one
    einsum per GEMM, the layer's chain with the quant's scales in DeepGEMM's layout), with the
    reference chain's bits; auto still takes another backend."""
    g, s = 2, 5
    o, pos, cos, sin, w, ws = chain_tensors(rng, s, g=g, n=256)
    weight, scale = w.flatten(0, 1), ws.flatten(0, 1)
    x, xs = REF.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
    want = REF.batched_gemm_a8w8_mxscale(x, w, xs.view(torch.uint8), ws, dtype=torch.bfloat16)

    layer = tb.WoAProjection(weight, scale, g, cos, sin, backend="deepgemm")
    assert torch.equal(layer(o, pos), want) and layer.path == "deepgemm"
    assert torch.equal(tb.wo_a_fp8(o, pos, cos, sin, weight, scale, g, backend="deepgemm"),
                       want)
    q, qs = tb.inverse_rope_group_quant(o, pos, cos, sin, g, 128, backend="deepgemm")
    assert torch.equal(q.view(torch.uint8), x.view(torch.uint8))
    assert torch.equal(tb.batched_gemm_a8w8_mxscale(q, w, qs, ws, backend="deepgemm"), want)
    assert len(named_here) == 3
    assert tb.WoAProjection(weight, scale, g, cos, sin).path != "deepgemm"


def test_function_form_fp32_output_raises_on_deepgemm(rng, named_here):
    """The function form's fp32 output, which DeepGEMM's einsum cannot write, is refused
    with the reason before the quant runs."""
    o, pos, cos, sin, w, ws = chain_tensors(rng, 3, g=2, n=128)
    with pytest.raises(BackendUnavailableError, match="DeepGEMM's einsum writes bf16"):
        tb.wo_a_fp8(o, pos, cos, sin, w.flatten(0, 1), ws.flatten(0, 1), 2,
                    backend="deepgemm", dtype=torch.float32)
    assert not named_here  # refused before anything ran


def test_version_from_the_package_folder_without_importing(tmp_path, monkeypatch):
    """``woa probe`` reports DeepGEMM's version from a package folder on the path (how the
    wheel's folder is carried) without running its ``__init__``."""
    pkg = tmp_path / "deep_gemm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n__version__ = '2.6.1'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deep_gemm", raising=False)
    _capability.cache_clear()
    assert _capability.deep_gemm_version() == "2.6.1"
    assert "deep_gemm" not in sys.modules
    from torch_bridge.cli.probe import versions

    assert versions()["deep_gemm"] == "2.6.1"
