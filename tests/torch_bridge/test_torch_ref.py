"""The pure-torch backend against the woa_jax oracle on CPU: bytes bit-exact, GEMM to rounding."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from inputs import gemm_operands, np_to_torch, oracle_rope_quant, rope_case

import torch_bridge as tb
import woa_jax
from woa_jax.testing import assert_bitwise_equal, assert_close


def _random_shape(rng):
    """A random valid (S, H, Dh, rd, G, GS) with whole heads per group and whole quant groups."""
    while True:
        gs = int(rng.choice([32, 64, 128]))
        dh = int(rng.choice([64, 128, 256, 512]))
        rd = int(rng.choice([r for r in (2, 8, 32, 64) if r <= dh]))
        h = int(rng.choice([1, 2, 4, 8]))
        groups = [g for g in (1, 2, 4, 8) if h % g == 0 and (h * dh // g) % gs == 0]
        if groups:
            s = int(rng.choice([1, 3, 7, 16, 33]))
            return s, h, dh, rd, int(rng.choice(groups)), gs


@pytest.mark.parametrize("seed", range(40))
def test_quant_bytes_match_oracle_random_shapes(seed):
    rng = np.random.default_rng(seed)
    s, h, dh, rd, g, gs = _random_shape(rng)
    act = ["bfloat16", "float16", "float32"][seed % 3]
    rope = ["bfloat16", "float32"][seed % 2]
    fp8 = ["float8_e4m3fn", "float8_e4m3fnuz"][(seed // 2) % 2]
    floor = [woa_jax.AITER_AMAX_FLOOR, woa_jax.CUDA_AMAX_FLOOR][(seed // 3) % 2]
    c = rope_case(rng, s=s, h=h, dh=dh, rd=rd, num_groups=g, gs=gs, act=act, rope=rope,
                  pos_dtype=[np.int32, np.int64][seed % 2],
                  scale=float(10.0 ** rng.integers(-3, 3)))
    q, sc = tb.inverse_rope_group_quant(*c.torch(), g, gs, backend="torch",
                                        fp8_dtype=getattr(torch, fp8), amax_floor=floor)
    q_ref, sc_ref = oracle_rope_quant(c, fp8=getattr(jnp, fp8), amax_floor=floor)
    assert_bitwise_equal(sc, sc_ref, name=f"scales seed {seed}")
    assert_bitwise_equal(q, q_ref, name=f"fp8 seed {seed}")
    assert q.dtype == getattr(torch, fp8) and sc.dtype == torch.float8_e8m0fnu


def test_zero_groups_and_power_of_two_amax():
    rng = np.random.default_rng(1)
    c = rope_case(rng, s=4, h=2, dh=128, rd=64, num_groups=2, gs=32)
    c.o[0] = 0  # all-zero token: byte 92 with the AITER floor
    c.o[1, 0, :32] = 0
    c.o[1, 0, 5] = 448.0  # amax exactly on a power of two times 448: no bump
    c.o[1, 1, :32] = 0
    c.o[1, 1, 7] = np.float32(np.nextafter(np.float32(448), np.float32(1e9)))  # one ulp above
    q, sc = tb.inverse_rope_group_quant(*c.torch(), 2, 32, backend="torch")
    q_ref, sc_ref = oracle_rope_quant(c)
    assert_bitwise_equal(sc, sc_ref)
    assert_bitwise_equal(q, q_ref)
    raw = sc.view(torch.uint8)
    assert (raw[0] == 92).all()
    assert raw[1, 0, 0] == 127


def test_positions_are_clamped_like_aiter():
    """Contract: 0 <= p < P; out-of-range positions are clamped to [0, P - 1]."""
    rng = np.random.default_rng(2)
    c = rope_case(rng, s=4, h=2, dh=128, rd=64, num_groups=1, p=16)
    c.positions[:] = [-5, 0, 15, 1000]
    q, sc = tb.inverse_rope_group_quant(*c.torch(), 1, 128, backend="torch")
    clamped = tb.inverse_rope_group_quant(*c.torch()[:1], torch.tensor([0, 0, 15, 15]),
                                          *c.torch()[2:], 1, 128, backend="torch")
    assert_bitwise_equal(q, clamped[0])
    assert_bitwise_equal(sc, clamped[1])
    q_ref, sc_ref = oracle_rope_quant(c)
    assert_bitwise_equal(q, q_ref)


def test_inf_lane_gives_nan_scale_and_nan_lane_is_ignored():
    rng = np.random.default_rng(3)
    c = rope_case(rng, s=2, h=1, dh=256, rd=64, num_groups=1, gs=128)
    c.o = c.o.astype(np.float32)
    c.o[0, 0, 3] = np.inf
    c.o[1, 0, 3] = np.nan
    q, sc = tb.inverse_rope_group_quant(*c.torch(), 1, 128, backend="torch")
    _, sc_ref = oracle_rope_quant(c)
    assert_bitwise_equal(sc, sc_ref)
    raw = sc.view(torch.uint8)
    assert raw[0, 0, 0] == 255
    assert raw[1, 0, 0] < 255  # NaN ignored by the group max, like AITER's fmaxf


@pytest.mark.parametrize("layout,gs", [("mfma_tile", 128), ("mfma_tile", 32), ("n32k4", 32)])
def test_tiled_layouts_match_oracle_on_logical_extent(layout, gs):
    rng = np.random.default_rng(4)
    c = rope_case(rng, s=37, h=2, dh=256, rd=64, num_groups=1, gs=gs)
    _, sc = tb.inverse_rope_group_quant(*c.torch(), 1, gs, backend="torch", scale_layout=layout)
    _, row = oracle_rope_quant(c)
    assert tuple(sc.shape) == woa_jax.scale_shape(37, 1, 512 // gs, layout, gs)
    back = tb.from_scale_layout(sc, layout, 37, 1, 512 // gs, quant_group_size=gs)
    assert_bitwise_equal(back, row)
    oracle_buf = woa_jax.to_scale_layout(row, layout, quant_group_size=gs)
    assert_bitwise_equal(
        tb.from_scale_layout(np_to_torch(np.asarray(oracle_buf)), layout, 37, 1, 512 // gs,
                             quant_group_size=gs), back)


def test_output_buffers_are_written_in_place():
    rng = np.random.default_rng(5)
    c = rope_case(rng, s=5, h=2, dh=128, rd=64, num_groups=2, gs=64)
    x_fp8 = torch.empty((5, 2, 128), dtype=torch.float8_e4m3fnuz)
    x_scale = torch.empty((5, 2, 2), dtype=torch.uint8)
    q, sc = tb.inverse_rope_group_quant(*c.torch(), 2, 64, backend="torch", x_fp8=x_fp8,
                                        x_scale=x_scale)
    assert q is x_fp8 and sc is x_scale
    q_ref, sc_ref = oracle_rope_quant(c, fp8=jnp.float8_e4m3fnuz)
    assert_bitwise_equal(x_fp8, q_ref)
    assert_bitwise_equal(x_scale, sc_ref)


def test_tiled_layout_into_preallocated_buffer():
    rng = np.random.default_rng(6)
    c = rope_case(rng, s=3, h=1, dh=512, rd=64, num_groups=1, gs=128)
    buf = torch.full(woa_jax.scale_shape(3, 1, 4, "mfma_tile", 128), 0xAB, dtype=torch.uint8)
    _, sc = tb.inverse_rope_group_quant(*c.torch(), 1, 128, backend="torch",
                                        scale_layout="mfma_tile", x_scale=buf)
    assert sc is buf
    _, row = oracle_rope_quant(c)
    assert_bitwise_equal(tb.from_scale_layout(buf, "mfma_tile", 3, 1, 4), row)


@pytest.mark.parametrize("m,g,n,k,block", [(1, 1, 128, 128, 128), (7, 2, 256, 512, 128),
                                           (33, 3, 96, 256, 32), (5, 2, 200, 256, 128)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gemm_matches_oracle(m, g, n, k, block, dtype):
    x, w, xs, ws = gemm_operands(np.random.default_rng(m + n), m=m, g=g, n=n, k=k, block=block)
    y = tb.batched_gemm_a8w8_mxscale(*(np_to_torch(a) for a in (x, w, xs, ws)),
                                     getattr(torch, dtype), backend="torch")
    ref = woa_jax.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=getattr(jnp, dtype))
    assert y.dtype == getattr(torch, dtype) and tuple(y.shape) == (m, g, n)
    assert_close(y, ref, tolerance="gemm_bf16" if dtype == "bfloat16" else "gemm_fp32")


def test_gemm_e8m0_scales_out_buffer_and_transposed_x():
    x, w, xs, ws = gemm_operands(np.random.default_rng(7), m=6, g=2, n=128, k=256)
    xt = np_to_torch(np.ascontiguousarray(x.transpose(1, 0, 2))).transpose(0, 1)  # [M,G,K] view
    out = torch.empty((6, 2, 128), dtype=torch.float32)
    y = tb.batched_gemm_a8w8_mxscale(xt, np_to_torch(w),
                                     np_to_torch(xs).view(torch.float8_e8m0fnu),
                                     np_to_torch(ws).view(torch.float8_e8m0fnu), torch.float32,
                                     backend="torch", out=out)
    assert y is out
    assert_close(out, woa_jax.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=jnp.float32),
                 tolerance="gemm_fp32")
