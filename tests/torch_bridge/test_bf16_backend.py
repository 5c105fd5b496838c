"""The BF16 chain: the caller's ``o`` is untouched unless it opts in, on the torch rotation and on
the Triton chain (the interpreter on CPU), and the rotated lanes have the same bits either way
(an identity weight makes the chain's output its rotated activations, exactly)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tb_cases import np_to_torch, rope_case, wo_a_checkpoint

import torch_bridge as tb
from torch_bridge import _dispatch
from torch_bridge.backends.torch_ref import inverse_rope
from woa_jax.testing import assert_bitwise_equal, assert_close

G, N, H, DH = 2, 128, 4, 64


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    c = rope_case(rng, s=5, h=H, dh=DH, rd=32, num_groups=G, gs=128)
    w, sc = wo_a_checkpoint(rng, g=G, n=N, k=H * DH // G)
    return c.torch(), np_to_torch(w), np_to_torch(sc)


def _identity(g: int, k: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A ``[G * K, K]`` fp8 checkpoint weight holding G identities, scale 1 (E8M0 byte 127)."""
    eye = torch.eye(k, device=device).repeat(g, 1).to(torch.float8_e4m3fn)
    return eye, torch.full((g * k // 128, k // 128), 127, dtype=torch.uint8, device=device)


@pytest.fixture
def rotations(monkeypatch):
    """Counts the BF16 chains run by the Triton backend."""
    from torch_bridge.backends.triton import launch

    calls = []
    real = launch.wo_a_bf16
    monkeypatch.setattr(launch, "wo_a_bf16", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _triton_on() -> bool:
    return _dispatch.get_backend("triton").is_available()[0]


@pytest.mark.parametrize("rotation", ["torch", "triton"])
def test_o_is_untouched_unless_overwrite_o(rotation, monkeypatch, rotations):
    if rotation == "torch":
        monkeypatch.setenv("WOA_USE_TRITON", "0")
        _dispatch.reset_caches()
    elif not _triton_on():
        pytest.skip(f"triton backend unavailable: {_dispatch.get_backend('triton').is_available()}")
    (o, pos, cos, sin), w, sc = _inputs()
    proj = tb.WoAProjection(w, sc, G, cos, sin, rope_dim=32, backend="bf16")
    before = o.clone()
    y = proj(o, pos)
    assert_bitwise_equal(o, before, name="o after a default call")
    y_fn = tb.wo_a_bf16(o, pos, cos, sin, w, sc, G)
    assert_bitwise_equal(o, before, name="o after wo_a_bf16")
    assert_bitwise_equal(y_fn, y)
    # At these sizes both rotate (a copy, or o itself) and then call the same torch GEMM.
    y_in_place = proj(o, pos, overwrite_o=True)
    assert_bitwise_equal(y_in_place, y, name="overwrite_o result")
    assert len(rotations) == (3 if rotation == "triton" else 0)


def test_triton_and_torch_rotations_give_the_same_bits(monkeypatch, rotations):
    if not _triton_on():
        pytest.skip("triton backend unavailable")
    (o, pos, cos, sin), _, _ = _inputs(1)
    eye, one = _identity(G, H * DH // G)
    y_triton = tb.wo_a_bf16(o, pos, cos, sin, eye, one, G)
    assert rotations
    monkeypatch.setenv("WOA_USE_TRITON", "0")
    _dispatch.reset_caches()
    y_torch = tb.wo_a_bf16(o, pos, cos, sin, eye, one, G)
    assert_bitwise_equal(y_triton, y_torch, name="rotated activations")
    assert_bitwise_equal(y_torch.reshape(o.shape), inverse_rope(o, pos, cos, sin).to(
        torch.bfloat16))


def test_fp8_chain_ignores_overwrite_o():
    (o, pos, cos, sin), w, sc = _inputs(2)
    proj = tb.WoAProjection(w, sc, G, cos, sin, rope_dim=32, backend="torch")
    before = o.clone()
    y = proj(o, pos, overwrite_o=True)
    assert_bitwise_equal(o, before)
    assert_bitwise_equal(proj(o, pos), y)


def test_non_bf16_o_takes_the_torch_rotation(rotations):
    (o, pos, cos, sin), w, sc = _inputs(3)
    o32 = o.float()
    before = o32.clone()
    y = tb.wo_a_bf16(o32, pos, cos, sin, w, sc, G, overwrite_o=True)
    assert y.dtype == torch.bfloat16 and not rotations
    assert_bitwise_equal(o32, before)


@pytest.mark.gpu
@pytest.mark.parametrize("rope_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("s", [1, 64, 1024])
def test_gpu_fallback_runs_the_triton_rotation_with_the_torch_bits(rope_dtype, s, rotations):
    """On CUDA the BF16 chain rotates with the Triton kernel (``launch.wo_a_bf16``): its rotated
    lanes have the torch rotation's bits, ``o`` is untouched unless ``overwrite_o``, and the
    result agrees with the pure-torch chain."""
    rng = np.random.default_rng(s)
    g, h, dh = 16, 64, 512
    c = rope_case(rng, s=s, h=h, dh=dh, rd=64, num_groups=g, gs=128, p=4096, scale=1.0)
    w, sc = wo_a_checkpoint(rng, g=g, n=1024, k=h * dh // g)
    o, pos, cos, sin = (t.cuda() for t in c.torch())
    cos, sin = cos.to(rope_dtype), sin.to(rope_dtype)
    proj = tb.WoAProjection(np_to_torch(w).cuda(), np_to_torch(sc).cuda(), g, cos, sin,
                            backend="bf16")
    before = o.clone()
    y = proj(o, pos)
    assert rotations and torch.equal(o, before)
    want = inverse_rope(o, pos, cos, sin).to(torch.bfloat16)
    eye, one = _identity(g, h * dh // g, "cuda")
    rotated = tb.WoAProjection(eye, one, g, cos, sin, backend="bf16")(o, pos)
    assert_bitwise_equal(rotated.reshape(o.shape), want, name="Triton vs torch rotation")
    from torch_bridge.backends.triton import chain, configs

    in_place = proj(o.clone(), pos, overwrite_o=True)
    if configs.bf16_gemm_chosen(s, g, 1024, h * dh // g, tma=chain._tma_loads(o), dh=dh):
        # The default ran the BF16 GEMM from o: the same products, summed in another order.
        assert_close(in_place, y, tolerance="gemm_bf16", name="overwrite_o (cuBLAS)")
    else:  # both rotate, then call the same cuBLAS GEMM
        assert_bitwise_equal(in_place, y, name="overwrite_o")
    x = want.reshape(s, g, -1).transpose(0, 1)
    ref = torch.bmm(x, proj.weight_bf16.cuda().transpose(1, 2)).transpose(0, 1)
    assert_close(y, ref, tolerance="gemm_bf16")
