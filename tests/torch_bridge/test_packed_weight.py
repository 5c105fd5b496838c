"""``jax_ops.FP8Weight``: a layer's FP8 weight and its scales as one array argument.

On CPU: packing keeps every byte and makes a pytree of one leaf; ``wo_a_fp8`` on a packed
weight gives the bits of the same call on the weight and scales apart, on the callback route
(fused and quant + GEMM, K split and whole) and on the oracle; the native route's launches,
pointer and TMA descriptor, read both from the one operand (their parameter maps); misuse
raises. On the GPU (``pytest -m gpu``):
the native route's bits, packed against apart, fused and unfused.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from inputs import chain_tensors, jx

from torch_bridge import jax_ops
from torch_bridge.backends.triton import jax_launch, xla_ffi
from torch_bridge.backends.triton.xla_ffi import Ref

gpu = pytest.mark.gpu


def _weight(rng, g=2, n=256, k=512):
    w = jnp.asarray(rng.standard_normal((g, n, k)).astype(np.float32)).astype(jnp.float8_e4m3fn)
    ws = jnp.asarray(rng.integers(112, 130, (g, n // 128, k // 128)).astype(np.uint8))
    return w, ws


@pytest.mark.parametrize("g,n,k", [(2, 256, 512), (1, 128, 384), (3, 128, 256)])
def test_pack_keeps_every_byte_in_one_leaf(g, n, k):
    w, ws = _weight(np.random.default_rng(g), g, n, k)
    packed = jax_ops.pack_weight(w, ws, g)
    assert (packed.num_groups, packed.n, packed.k, packed.block) == (g, n, k, 128)
    assert packed.scale_offset % jax_ops.PACK_ALIGN == 0 and packed.scale_offset >= w.size
    assert jax.tree_util.tree_leaves(packed) == [packed.data] and packed.data.dtype == jnp.uint8
    pw, pws = packed.parts()
    np.testing.assert_array_equal(np.asarray(pw).view(np.uint8), np.asarray(w).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(pws), np.asarray(ws))
    again = jax.jit(lambda p: p)(packed)  # through jit as a pytree
    assert isinstance(again, jax_ops.FP8Weight) and again.scale_offset == packed.scale_offset


def test_pack_takes_the_checkpoint_form():
    """``[G * N, K]`` and ``[G * N / B, K / B]`` as ``wo_a_fp8`` takes them."""
    w, ws = _weight(np.random.default_rng(0))
    flat = jax_ops.pack_weight(w.reshape(512, 512), jax.lax.bitcast_convert_type(
        ws.reshape(4, 4), jnp.float8_e8m0fnu), 2)
    np.testing.assert_array_equal(np.asarray(flat.data),
                                  np.asarray(jax_ops.pack_weight(w, ws, 2).data))


def test_packed_weight_misuse_raises():
    w, ws = _weight(np.random.default_rng(1))
    packed = jax_ops.pack_weight(w, ws, 2)
    o = jnp.zeros((1, 2, 512), jnp.bfloat16)
    pos = jnp.zeros((1,), jnp.int32)
    cos = sin = jnp.ones((8, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="an FP8Weight holds its scales"):
        jax_ops.wo_a_fp8(o, pos, cos, sin, packed, ws, 2)
    with pytest.raises(ValueError, match="packed for 2 groups"):
        jax_ops.wo_a_fp8(o, pos, cos, sin, packed, None, 1)
    with pytest.raises(TypeError):
        jax_ops.pack_weight(w.astype(jnp.bfloat16), ws, 2)
    with pytest.raises(ValueError, match="does not tile K"):
        jax_ops.pack_weight(w, ws[:, :, :3], 2)


def _chain(s: int, g: int = 2, n: int = 128):
    o, pos, cos, sin, w, ws = jx(*chain_tensors(np.random.default_rng(s), s, g=g, n=n))
    return (o, pos.astype(jnp.int32), cos, sin), w, ws


@pytest.mark.parametrize("fused,s", [(True, 1), (False, 3), (False, 16)])
def test_callback_route_reads_the_packed_weight_in_place(monkeypatch, fused, s):
    """The callback route (one callback a layer) on a packed weight: the bits of the same call
    on the weight and scales apart, fused or quant + GEMM, K split (1 and 3 tokens) or whole
    (16 tokens, unfused)."""
    monkeypatch.setenv("WOA_JAX_NATIVE", "0")
    if not fused:
        monkeypatch.setattr(jax_launch, "wo_a_fp8_fits", lambda *a: False)
    rope, w, ws = _chain(s)
    packed = jax_ops.pack_weight(w, ws, 2)
    f = jax.jit(lambda r, wt, st: jax_ops.wo_a_fp8(*r, wt, st, 2, backend="triton"))
    want = np.asarray(f(rope, w, ws)).view(np.uint16)
    np.testing.assert_array_equal(np.asarray(f(rope, packed, None)).view(np.uint16), want)


def test_oracle_route_takes_the_packed_weight():
    rope, w, ws = _chain(2)
    packed = jax_ops.pack_weight(w, ws, 2)
    want = np.asarray(jax_ops.wo_a_fp8(*rope, w, ws, 2)).view(np.uint16)
    got = jax.jit(lambda r, p: jax_ops.wo_a_fp8(*r, p, None, 2))(rope, packed)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want)


def _refs(call):
    return [a for launch in call.launches for a in launch.args
            if isinstance(a, (Ref, xla_ffi.Desc))]


@pytest.mark.parametrize("fused,s,wgmma", [(True, 1, False), (False, 3, False), (False, 3, True),
                                           (False, 64, True)])
def test_native_call_reads_the_weight_from_one_operand(fused, s, wgmma):
    """Each launch's ``w`` (a pointer, or the wgmma GEMM's TMA descriptor: the swapped split
    tile at 3 tokens, the warp-specialized one at 64) is operand 4 from its start, as fp8, its
    ``w_scale`` operand 4 from the scales' offset, as bytes; every other operand one place
    earlier than in the unpacked call (the split counters too)."""
    if wgmma:
        pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    g, n, k, block = 2, 1024, 4096, 128
    shape = (s, 16, 512, 64, 64, g, n, k, block, n // block)
    kinds = dict(fp8_dtype=jnp.float8_e4m3fn, amax_floor=1e-8, dtype=jnp.bfloat16,
                 o_dtype=jnp.bfloat16, rope_dtype=jnp.bfloat16)
    call = (jax_launch.wo_a_fp8_call(*shape, **kinds) if fused else
            jax_launch.wo_a_fp8_chain_call(*shape, **kinds, wgmma=wgmma, sms=132 if wgmma else 0))
    descs = [a for a in _refs(call) if isinstance(a, xla_ffi.Desc) and a.index == 4]
    assert len(descs) == wgmma
    offset = -(-g * n * k // 128) * 128
    moved = jax_launch.weight_in_place(call, offset, "float8_e4m3fn")
    assert type(moved) is type(call)
    before, after = _refs(call), _refs(moved)
    assert len(before) == len(after) and any(r.index == 5 for r in before)
    for was, now in zip(before, after, strict=True):
        if was.index == 4:
            assert (now.index, now.dtype) == (4, "float8_e4m3fn"), now
            assert isinstance(now, xla_ffi.Desc) or now.offset == 0, now
        elif was.index == 5:
            assert (now.index, now.offset, now.dtype) == (4, offset, "uint8"), now
        else:
            assert now.index == was.index - (was.index > 5), (was, now)
            assert dataclasses.replace(now, index=was.index) == was
    assert moved.counters == call.counters and moved.out_shape == call.out_shape
    if s == 3:
        assert call.counters, "the unfused chain at 3 tokens splits K"


@gpu
@pytest.mark.parametrize("s,g", [(1, 2), (16, 2), (64, 2), (64, 16)])
def test_gpu_native_route_packed_weight_bits(s, g):
    """The native route on a packed weight: the bits of the same call on the weight and
    scales apart (fused at one token, quant + GEMM above)."""
    if jax_ops.native_route_reason("triton") is not None:
        pytest.skip(jax_ops.native_route_reason("triton"))
    rope, w, ws = _v4_chain(s, g)
    packed = jax_ops.pack_weight(w, ws, g)
    f = jax.jit(lambda r, wt, st: jax_ops.wo_a_fp8(*r, wt, st, g, backend="triton"))
    want = np.asarray(f(rope, w, ws)).view(np.uint16)
    np.testing.assert_array_equal(np.asarray(f(rope, packed, None)).view(np.uint16), want)


def _v4_chain(s: int, g: int):
    """DeepSeek V4 sizes: 8 heads of 512 per group, N = 1024."""
    o, pos, cos, sin, w, ws = jx(*chain_tensors(np.random.default_rng(s), s, g=g, h=8 * g,
                                               n=1024))
    return (o, pos.astype(jnp.int32), cos, sin), w, ws
