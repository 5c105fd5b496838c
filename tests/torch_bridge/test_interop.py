"""DLPack exchange: native codes and the integer-view fallback, both directions, zero-copy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from inputs import rope_case

import torch_bridge as tb
import woa_jax
from woa_jax.testing import assert_bitwise_equal, assert_close

DTYPES = ["bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e8m0fnu", "float32", "uint8"]


def _sample(name: str) -> torch.Tensor:
    raw = torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4) + 100
    if name == "bfloat16":
        return torch.linspace(-3, 3, 24).reshape(2, 3, 4).to(torch.bfloat16)
    if name == "float32":
        return torch.linspace(-3, 3, 24).reshape(2, 3, 4)
    return raw if name == "uint8" else raw.view(getattr(torch, name))


@pytest.mark.parametrize("via_bytes", [False, True], ids=["native", "bytes"])
@pytest.mark.parametrize("name", DTYPES)
def test_round_trip_keeps_dtype_and_bits(name, via_bytes):
    t = _sample(name)
    a = tb.to_jax(t, via_bytes=via_bytes)
    assert a.dtype == getattr(jnp, name) and a.shape == (2, 3, 4)
    assert_bitwise_equal(a, t)
    back = tb.to_torch(a, via_bytes=via_bytes)
    assert back.dtype == t.dtype
    assert_bitwise_equal(back, t)


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e8m0fnu"])
def test_native_exchange_is_zero_copy(name):
    t = _sample(name)
    a = tb.to_jax(t)
    assert a.unsafe_buffer_pointer() == t.data_ptr()
    assert tb.to_torch(a).data_ptr() == t.data_ptr()


def test_fallback_is_taken_when_native_exchange_fails(monkeypatch):
    """Old torch/jax raise on fp8 DLPack codes; the byte view must take over."""
    real = torch.from_dlpack

    def old_torch(x):
        if str(x.dtype).startswith("float8"):
            raise BufferError("float8 types are not supported by dlpack")
        return real(x)

    monkeypatch.setattr(torch, "from_dlpack", old_torch)
    a = jnp.asarray(np.arange(8, dtype=np.float32)).astype(jnp.float8_e4m3fn)
    t = tb.to_torch(a)
    assert t.dtype == torch.float8_e4m3fn
    assert_bitwise_equal(t, a)


def test_passthrough_and_bad_types():
    t = torch.zeros(2)
    assert tb.to_torch(t) is t
    a = jnp.zeros(2)
    assert tb.to_jax(a) is a
    with pytest.raises(TypeError, match="expects a JAX array or a torch tensor"):
        tb.to_torch(np.zeros(2))
    with pytest.raises(TypeError, match="expects a torch tensor or a JAX array"):
        tb.to_jax([1.0])


def test_tracer_is_refused_with_a_clear_error():
    @jax.jit
    def f(x):
        tb.to_torch(x)
        return x

    with pytest.raises(TypeError, match="got a JAX tracer"):
        f(jnp.zeros(2))


def test_ops_accept_and_return_jax_arrays():
    c = rope_case(np.random.default_rng(0), s=4, h=2, dh=128, rd=64, num_groups=1)
    q, sc = tb.inverse_rope_group_quant(*c.jax(), 1, 128, backend="torch")
    assert isinstance(q, jax.Array) and isinstance(sc, jax.Array)
    assert sc.dtype == jnp.float8_e8m0fnu
    q_ref, sc_ref = woa_jax.inverse_rope_group_quant(*c.jax(), 1, 128)
    assert_bitwise_equal(q, q_ref)
    assert_bitwise_equal(sc, sc_ref)
    w = jnp.transpose(q, (1, 0, 2))  # any fp8 [G=1, N=4, K=256]
    ws = jnp.full((1, 1, 2), 127, jnp.uint8)
    y = tb.batched_gemm_a8w8_mxscale(q, w, sc, ws, backend="torch")
    assert isinstance(y, jax.Array) and y.shape == (4, 1, 4)
    assert_close(y, woa_jax.batched_gemm_a8w8_mxscale(q_ref, w, sc_ref, ws), tolerance="gemm_bf16")
    with pytest.raises(TypeError, match="x_fp8 cannot be filled"):
        tb.inverse_rope_group_quant(*c.jax(), 1, 128, x_fp8=torch.empty(4, 1, 256))


@pytest.mark.parametrize("name", DTYPES)
def test_numpy_torch_byte_views_round_trip(name):
    t = _sample(name)
    a = tb.interop.torch_to_numpy(t)
    assert a.dtype.name == name and a.shape == (2, 3, 4)
    assert_bitwise_equal(a, t)
    back = tb.interop.numpy_to_torch(a)
    assert back.dtype == t.dtype
    assert_bitwise_equal(back, t)
    with pytest.raises(TypeError, match="numpy_to_torch expects a numpy array, got Tensor"):
        tb.interop.numpy_to_torch(t)
    with pytest.raises(TypeError, match="torch_to_numpy expects a torch tensor, got ndarray"):
        tb.interop.torch_to_numpy(a)


def test_e8m0_bytes_is_lossless_or_names_the_element():
    raw = torch.tensor([[0, 1, 127], [128, 200, 254]], dtype=torch.uint8)
    assert tb.interop.e8m0_bytes(raw.view(torch.float8_e8m0fnu)).equal(raw)
    # Each float dtype over the powers of two it holds (fp16: 2**-24 .. 2**15).
    for dtype, lo, hi in ((torch.float64, 0, 254), (torch.float32, 0, 254),
                          (torch.bfloat16, 0, 254), (torch.float16, 103, 142)):
        want = raw.clamp(lo, hi)
        assert tb.interop.e8m0_bytes(torch.exp2(want.double() - 127).to(dtype)).equal(want)
    bad = torch.tensor([[1.0, 0.5], [0.75, 2.0]])
    with pytest.raises(ValueError, match=r"ws is not losslessly representable as E8M0: element "
                                         r"\[1, 0\] = 0.75 is not a power of two"):
        tb.interop.e8m0_bytes(bad, "ws")
    with pytest.raises(ValueError, match=r"element \[0, 0\] = -1.0 is not positive"):
        tb.interop.e8m0_bytes(-bad)
    with pytest.raises(TypeError, match="weight_scale must be float8_e8m0fnu, uint8 or a float"):
        tb.interop.e8m0_bytes(raw.to(torch.int32))


def test_jax_io_converts_both_ways_and_refuses_output_buffers():
    calls = []

    @tb.interop.jax_io(outputs=("out",))
    def double(x, *, scale=2, out=None):
        calls.append(type(x))
        return x * scale, "tag"

    y, tag = double(jnp.arange(3.0))
    assert isinstance(y, jax.Array) and tag == "tag" and calls == [torch.Tensor]
    np.testing.assert_array_equal(np.asarray(y), [0.0, 2.0, 4.0])
    t, _ = double(torch.arange(3.0))
    assert isinstance(t, torch.Tensor)
    with pytest.raises(TypeError, match="out cannot be filled when the inputs are JAX arrays"):
        double(jnp.arange(3.0), out=torch.empty(3))
