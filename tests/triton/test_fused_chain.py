"""The fused decode chain (``launch.wo_a_fp8``, ``wo_a_fp8_kernel``) on tiny shapes.

CPU through ``TRITON_INTERPRET=1`` (on a GPU machine these run on the GPU). The fused kernel must
give the bits of the two-kernel chain (quant, then the pointer GEMM with the same tiles) and stay
within the bf16 output rounding of the oracle.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import woa_jax
from woa_jax.testing import assert_close, to_numpy

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch_bridge.backends.triton import chain, gemm, launch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _chain_case(rng, s, *, g=2, h=4, dh=512, rd=64, n=128, block=128, p=64,
                rope_dtype=torch.bfloat16, pos_dtype=torch.int64):
    """``o [S, H, Dh]`` bf16, positions, cos/sin ``[P, rd / 2]``, ``w [G, N, K]`` fp8 and its
    ``[G, N / B, K / B]`` scale bytes (K = H * Dh / G)."""
    k = h * dh // g
    o = torch.from_numpy(rng.standard_normal((s, h, dh)).astype(np.float32) / 10).to(
        torch.bfloat16)
    pos = torch.from_numpy(rng.integers(0, p, s)).to(pos_dtype)
    ang = rng.uniform(0, 6.3, (p, rd // 2)).astype(np.float32)
    cos = torch.from_numpy(np.cos(ang)).to(rope_dtype)
    sin = torch.from_numpy(np.sin(ang)).to(rope_dtype)
    w = torch.from_numpy(rng.standard_normal((g, n, k)).astype(np.float32) * 30).to(
        torch.float8_e4m3fn)
    ws = torch.from_numpy(rng.integers(112, 120, (g, -(-n // block), k // block)).astype(
        np.uint8))
    return [t.to(DEVICE) for t in (o, pos, cos, sin, w, ws)]


def _oracle(o, pos, cos, sin, w, ws, g, block):
    """The oracle's two steps (quant, then GEMM), fp32 out."""
    args = [jnp.asarray(to_numpy(t)) for t in (o, pos, cos, sin)]
    q, sc = woa_jax.inverse_rope_group_quant(*args, g, block)
    return woa_jax.batched_gemm_a8w8_mxscale(q, jnp.asarray(to_numpy(w)), sc,
                                             jnp.asarray(to_numpy(ws)), dtype=jnp.float32)


def _bits(y: torch.Tensor) -> np.ndarray:
    return to_numpy(y.view(torch.int16) if y.dtype == torch.bfloat16 else y.view(torch.int32))


@pytest.mark.parametrize("s,block,rope_dtype,pos_dtype", [
    (1, 128, torch.bfloat16, torch.int64),
    (3, 128, torch.float32, torch.int32),  # QUANT_M = 4 rows tiled up to the MMA's 16
    (16, 128, torch.bfloat16, torch.int32),
    (5, 32, torch.bfloat16, torch.int64),  # V4.1: 1 x 32 groups, 32 x 32 weight blocks
    (20, 64, torch.float32, torch.int64),  # two M tiles of 16 rows
])
def test_fused_gives_the_two_kernel_bits(rng, s, block, rope_dtype, pos_dtype):
    o, pos, cos, sin, w, ws = _chain_case(rng, s, block=block, rope_dtype=rope_dtype,
                                          pos_dtype=pos_dtype)
    cfg = launch.GemmConfig(16, 64, swap_ab=True)
    y = torch.full((s, 2, 128), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    assert launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, out=y, fused=True, config=cfg) is y
    two = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, fused=False, config=cfg)
    np.testing.assert_array_equal(_bits(y), _bits(two))
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 2, block), tolerance="gemm_bf16")


def test_fused_groups_that_start_inside_a_head(rng):
    """G = 4 groups over H = 2 heads: group 1 is the second half of head 0, so its last block
    holds that head's rope tail; the prologue must find it from the lane's place in the head."""
    o, pos, cos, sin, w, ws = _chain_case(rng, 3, g=4, h=2)
    cfg = launch.GemmConfig(16, 64, swap_ab=True)
    y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 4, fused=True, config=cfg)
    two = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 4, fused=False, config=cfg)
    np.testing.assert_array_equal(_bits(y), _bits(two))
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 4, 128), tolerance="gemm_bf16")


def test_fused_split_k_fp32_out_padded_tokens_and_clamped_positions(rng):
    """Split-K (parts reduced in the kernel), an fp32 ``out``, ``o`` with a padded token
    stride and positions outside ``[0, P)`` (clamped, as AITER does)."""
    o, pos, cos, sin, w, ws = _chain_case(rng, 4)
    padded = torch.zeros((4, 4, 640), dtype=o.dtype, device=DEVICE)[:, :, :512]
    padded.copy_(o)
    pos = torch.tensor([-5, 0, 63, 1000], dtype=torch.int64, device=DEVICE)
    cfg = launch.GemmConfig(16, 64, split_k=2, swap_ab=True)
    ref = _oracle(o, pos, cos, sin, w, ws, 2, 128)
    y32 = launch.wo_a_fp8(padded, pos, cos, sin, w, ws, 2, dtype=torch.float32, fused=True,
                          config=cfg)
    assert y32.dtype == torch.float32
    assert_close(y32, ref, tolerance="gemm_fp32")
    y = launch.wo_a_fp8(padded, pos, cos, sin, w, ws, 2, fused=True, config=cfg)
    assert y.dtype == torch.bfloat16
    assert_close(y, ref, tolerance="gemm_bf16")


def test_default_fuses_where_the_prologue_is_one_step(rng, monkeypatch):
    """``fused=None`` runs the one-kernel chain when each program quantizes at most 4096
    activations first (DeepSeek V4: M = 1 at G = 16, M <= 8 at G = 2), quant + GEMM otherwise;
    the public ``WoAProjection`` takes the same road."""
    from torch_bridge import WoAProjection

    calls = []
    for module, name in ((chain, "_wo_a_fp8_op"), (gemm, "_batched_gemm_a8w8_mxscale_op")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, real=real, name=name: (calls.append(name), real(*a)))
    # K = 1024 in 8 blocks, split 8 ways: one prologue step up to 32 tokens.
    for s, want in ((1, ["_wo_a_fp8_op"]), (32, ["_wo_a_fp8_op"]),
                    (33, ["_batched_gemm_a8w8_mxscale_op"])):
        calls.clear()
        o, pos, cos, sin, w, ws = _chain_case(rng, s)
        y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2)
        assert calls == want, s
        assert_close(y, _oracle(o, pos, cos, sin, w, ws, 2, 128), tolerance="gemm_bf16")
    calls.clear()
    o, pos, cos, sin, w, ws = _chain_case(rng, 2)
    proj = WoAProjection(w.flatten(0, 1), ws.flatten(0, 1).view(torch.float8_e8m0fnu), 2, cos,
                         sin, backend="triton")
    y = proj(o, pos)
    assert calls == ["_wo_a_fp8_op"] and proj.path == "triton"
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 2, 128), tolerance="gemm_bf16")


def test_fused_split_k_is_the_same_in_deterministic_mode(rng, monkeypatch):
    """Split-K parts are added in K order in the kernel: deterministic mode keeps the split."""
    seen = []
    real = chain._wo_a_fp8_op
    monkeypatch.setattr(chain, "_wo_a_fp8_op", lambda *a: (seen.append(a[12]), real(*a)))
    o, pos, cos, sin, w, ws = _chain_case(rng, 1, g=1, h=2)
    split = launch.wo_a_fp8_config(1, 1, 128, 1024, 128).split_k
    assert split > 1
    y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 1)
    torch.use_deterministic_algorithms(True)
    try:
        again = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 1)
    finally:
        torch.use_deterministic_algorithms(False)
    assert seen == [split, split]
    np.testing.assert_array_equal(_bits(y), _bits(again))
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 1, 128), tolerance="gemm_bf16")


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_groups=3), "num_groups = 3"),
    (dict(fused=True, config=launch.GemmConfig(16, 64, tma=True, swap_ab=True)),
     "pointer-loaded, swapped tiles"),
    (dict(fused=True, config=launch.GemmConfig(16, 64)), "pointer-loaded, swapped tiles"),
    (dict(fused=True, config=launch.GemmConfig(16, 64, split_k=3, swap_ab=True)),
     "split_k=3 does not divide"),
    (dict(out="short"), r"out must be \[M, G, N\] = \[2, 2, 128\]"),
])
def test_bad_chain_arguments_raise(rng, kwargs, match):
    o, pos, cos, sin, w, ws = _chain_case(rng, 2)
    g = kwargs.pop("num_groups", 2)
    if kwargs.get("out") == "short":
        kwargs["out"] = torch.empty((1, 2, 128), dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, **kwargs)


def test_fused_true_refuses_a_head_dim_the_block_does_not_divide(rng):
    """Dh = 96 with 64-wide scale blocks: a block would straddle two heads' rope tails."""
    o, pos, cos, sin, w, ws = _chain_case(rng, 2, g=1, h=4, dh=96, rd=32, n=64, block=64)
    with pytest.raises(ValueError, match="head_dim 96 is not a multiple of the scale block 64"):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, 1, fused=True)
    y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 1)  # the default runs the two kernels
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 1, 64), tolerance="gemm_bf16")


def test_fused_op_is_opaque_to_torch_compile(rng):
    """Fake implementation, version counter of ``out``, and a graph-break-free trace."""
    o, pos, cos, sin, w, ws = _chain_case(rng, 2)
    y = torch.empty((2, 2, 128), dtype=torch.bfloat16, device=DEVICE)
    xq = torch.empty((2, 2, 1024), dtype=torch.float8_e4m3fn, device=DEVICE)
    xs = torch.empty((2, 2, 8), dtype=torch.uint8, device=DEVICE)
    torch.library.opcheck(torch.ops.woa_triton.wo_a_fp8.default,
                          (o, pos, cos, sin, w, ws, xq, xs, y, 1e-8, 16, 64, 1, 4, 3),
                          test_utils=("test_faketensor",))
    v = y._version
    launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, out=y)
    assert y._version == v + 1
    compiled = torch.compile(lambda o: launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2),
                             backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(o), y)


@pytest.mark.parametrize("fused", [None, True, False])
def test_zero_tokens(rng, fused):
    """An empty batch (a rank with no tokens) gives an empty output, fused or not."""
    o, pos, cos, sin, w, ws = _chain_case(rng, 0)
    y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, fused=fused)
    assert y.shape == (0, 2, 128) and y.dtype == torch.bfloat16
    x = torch.empty((0, 2, 1024), dtype=w.dtype, device=DEVICE)
    xs = torch.empty((0, 2, 8), dtype=torch.uint8, device=DEVICE)
    assert launch.batched_gemm_a8w8_mxscale(x, w, xs, ws).shape == (0, 2, 128)
