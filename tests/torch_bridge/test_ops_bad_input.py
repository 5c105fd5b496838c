"""Bad input to the public ops (and the JAX entry points): each raises a clear error naming what
was wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from inputs import gemm_operands, np_to_torch, rope_case

import torch_bridge as tb


@pytest.fixture
def rope_args():
    c = rope_case(np.random.default_rng(0), s=4, h=2, dh=128, rd=64, num_groups=2, gs=64)
    return list(c.torch())


@pytest.fixture
def gemm_args():
    return [np_to_torch(a) for a in gemm_operands(np.random.default_rng(0), m=3, g=2, n=128,
                                                  k=256)]


def _quant(args, num_groups=2, gs=64, **kw):
    return tb.inverse_rope_group_quant(*args, num_groups, gs, backend="torch", **kw)


def test_wrong_rank_of_o(rope_args):
    rope_args[0] = rope_args[0].reshape(4, -1)
    with pytest.raises(ValueError, match=r"o must be 3-D \[S, H, Dh\]"):
        _quant(rope_args)


def test_wrong_dtype_of_o(rope_args):
    rope_args[0] = rope_args[0].to(torch.int32)
    with pytest.raises(TypeError, match="o must have dtype"):
        _quant(rope_args)


def test_wrong_positions_dtype_and_length(rope_args):
    bad = list(rope_args)
    bad[1] = rope_args[1].to(torch.float32)
    with pytest.raises(TypeError, match="positions must be int32 or int64"):
        _quant(bad)
    bad[1] = rope_args[1][:2]
    with pytest.raises(ValueError, match="fewer than S=4"):
        _quant(bad)


def test_cos_sin_shape_mismatch(rope_args):
    rope_args[3] = rope_args[3][:, :8]
    with pytest.raises(ValueError, match="same shape"):
        _quant(rope_args)


def test_non_contiguous_o(rope_args):
    o = rope_args[0]
    rope_args[0] = torch.empty((2, 4, 128), dtype=o.dtype).copy_(o.transpose(0, 1)).transpose(0, 1)
    assert not rope_args[0].is_contiguous()
    with pytest.raises(ValueError, match="o must be contiguous"):
        _quant(rope_args)


def test_group_width_not_multiple_of_quant_group(rope_args):
    with pytest.raises(ValueError, match="not a multiple of quant_group_size=64"):
        _quant(rope_args, num_groups=8)  # D = 32
    with pytest.raises(ValueError, match="quant_group_size must be 32, 64 or 128"):
        _quant(rope_args, gs=96)
    with pytest.raises(ValueError, match="not divisible by num_groups=3"):
        _quant(rope_args, num_groups=3)


def test_bad_scale_layout_and_n32k4_group_size(rope_args):
    with pytest.raises(ValueError, match="scale_layout must be"):
        _quant(rope_args, scale_layout="scale_shuffle")
    with pytest.raises(ValueError, match="n32k4 layout needs quant_group_size 32"):
        _quant(rope_args, scale_layout="n32k4")


def test_bad_output_buffers(rope_args):
    with pytest.raises(ValueError, match=r"x_fp8 must have shape \[S, G, D\]"):
        _quant(rope_args, x_fp8=torch.empty((4, 2, 64), dtype=torch.float8_e4m3fn))
    with pytest.raises(TypeError, match="x_fp8 must be float8"):
        _quant(rope_args, x_fp8=torch.empty((4, 2, 128), dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x_scale must be uint8 or float8_e8m0fnu"):
        _quant(rope_args, x_scale=torch.empty((4, 2, 2), dtype=torch.float32))
    with pytest.raises(ValueError, match="x_scale for scale_layout='row' must have shape"):
        _quant(rope_args, x_scale=torch.empty((4, 2, 3), dtype=torch.uint8))
    with pytest.raises(TypeError, match="contradicts"):
        _quant(rope_args, x_fp8=torch.empty((4, 2, 128), dtype=torch.float8_e4m3fn),
               fp8_dtype=torch.float8_e4m3fnuz)


def test_numpy_input_is_rejected(rope_args):
    rope_args[0] = rope_args[0].float().numpy()
    with pytest.raises(TypeError, match="o must be a torch tensor or a JAX array"):
        _quant(rope_args)


def test_empty_batch_returns_empty_results(rope_args):
    empty = [rope_args[0][:0], rope_args[1][:0], rope_args[2], rope_args[3]]
    q, sc = tb.inverse_rope_group_quant(*empty, 2, 64)
    assert q.shape == (0, 2, 128) and sc.shape == (0, 2, 2)
    q, sc = tb.inverse_rope_group_quant(*empty, 1, 128, scale_layout="mfma_tile")
    assert q.shape == (0, 1, 256) and sc.shape == (1, 0, 2)


def test_gemm_bad_operands(gemm_args):
    x, w, xs, ws = gemm_args
    with pytest.raises(ValueError, match=r"x must be 3-D"):
        tb.batched_gemm_a8w8_mxscale(x[0], w, xs, ws, backend="torch")
    with pytest.raises(TypeError, match="x and w must share one fp8 dtype"):
        tb.batched_gemm_a8w8_mxscale(x, w.view(torch.float8_e4m3fnuz), xs, ws, backend="torch")
    with pytest.raises(TypeError, match="x_scale must have dtype"):
        tb.batched_gemm_a8w8_mxscale(x, w, xs.to(torch.int32), ws, backend="torch")
    with pytest.raises(ValueError, match=r"x_scale is not losslessly representable as E8M0: "
                                         r"element \[0, 0, 0\] = 131.0 is not a power of two; .*"
                                         "woa_jax.e8m0_from_scale"):
        tb.batched_gemm_a8w8_mxscale(x, w, xs.float(), ws, backend="torch")
    with pytest.raises(ValueError, match="w_scale must be"):
        tb.batched_gemm_a8w8_mxscale(x, w, xs, ws[:, :, :1], backend="torch")
    with pytest.raises(TypeError, match="dtype must be torch.bfloat16 or torch.float32"):
        tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, torch.float16, backend="torch")
    with pytest.raises(ValueError, match="out must be"):
        tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="torch",
                                     out=torch.empty((3, 2, 128), dtype=torch.float32))


def test_gemm_empty_batch(gemm_args):
    x, w, xs, ws = gemm_args
    y = tb.batched_gemm_a8w8_mxscale(x[:0], w, xs[:0], ws)
    assert y.shape == (0, 2, 128) and y.dtype == torch.bfloat16


def test_unknown_backend_name(rope_args, monkeypatch):
    with pytest.raises(ValueError, match="backend='cuda' is not a backend"):
        tb.inverse_rope_group_quant(*rope_args, 2, 64, backend="cuda")
    with pytest.raises(TypeError, match="backend must be 'auto' or one of .*, got 1"):
        tb.inverse_rope_group_quant(*rope_args, 2, 64, backend=1)
    monkeypatch.setenv("WOA_BACKEND", "fast")
    with pytest.raises(ValueError, match="WOA_BACKEND='fast' is not a backend"):
        tb.inverse_rope_group_quant(*rope_args, 2, 64)


def test_jax_entry_points_reject_bad_weight_and_fp8_dtype():
    import jax.numpy as jnp

    from torch_bridge import jax_ops

    c = rope_case(np.random.default_rng(0), s=4, h=2, dh=128, rd=64, num_groups=2, gs=128)
    w = jnp.zeros((2, 128, 128), jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"weight_scale must be 3-D \[G, N / B, K / B\]"):
        jax_ops.wo_a_fp8(*c.jax(), w, jnp.zeros((2, 1), jnp.uint8), 2)
    with pytest.raises(ValueError, match=r"weight_scale \[G, N / B, K / B\] = \(2, 1, 3\) does "
                                         "not tile K = 128"):
        jax_ops.wo_a_fp8(*c.jax(), w, jnp.zeros((2, 1, 3), jnp.uint8), 2)
    with pytest.raises(TypeError, match="fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz"):
        jax_ops.inverse_rope_group_quant(*c.jax(), 2, 128, fp8_dtype=jnp.bfloat16,
                                         backend="torch")


def test_layout_helpers_reject_non_byte_scales():
    with pytest.raises(TypeError, match="x_scale must have dtype uint8 or float8_e8m0fnu"):
        tb.to_scale_layout(torch.zeros((4, 2, 8)), "row")
    with pytest.raises(TypeError, match="out must have dtype uint8 or float8_e8m0fnu"):
        tb.to_scale_layout(torch.zeros((4, 2, 8), dtype=torch.uint8), "row",
                           out=torch.zeros((4, 2, 8)))
    with pytest.raises(TypeError, match="buffer must have dtype uint8 or float8_e8m0fnu"):
        tb.from_scale_layout(torch.zeros((4, 2, 8)), "row", 4, 2, 8)
