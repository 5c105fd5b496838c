"""The native route of ``torch_bridge.jax_ops`` on a CUDA GPU (``pytest -m gpu``): the
``woa_triton_launch`` custom call under ``jax.jit`` against the ``woa_jax`` oracle and the
torch launcher's bits."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from inputs import DH, HPG, RD, N, P, new_seed

import woa_jax
from torch_bridge import interop, jax_ops
from torch_bridge.backends.triton import configs, jax_launch, launch
from woa_jax.testing import assert_bitwise_equal, assert_close


def _inputs(s: int, g: int, seed: int):
    rng = np.random.default_rng(seed)
    o = jnp.asarray(rng.standard_normal((s, g * HPG, DH), np.float32)).astype(jnp.bfloat16)
    pos = jnp.asarray(rng.integers(0, P, s).astype(np.int32))
    ang = rng.uniform(0, 6.3, (P, RD // 2)).astype(np.float32)
    cos, sin = (jnp.asarray(f(ang)).astype(jnp.bfloat16) for f in (np.cos, np.sin))
    k = HPG * DH
    w = jnp.asarray(np.clip(rng.standard_normal((g, N, k), np.float32) * 40, -448, 448)).astype(
        jnp.float8_e4m3fn)
    ws = jax.lax.bitcast_convert_type(
        jnp.asarray(rng.integers(112, 122, (g, N // 128, k // 128)).astype(np.uint8)),
        jnp.float8_e8m0fnu)
    return (o, pos, cos, sin), w, ws


def _routes(fn, *args) -> set[str]:
    """The launch routes in ``fn``'s lowering: ``native`` (our custom call), ``callback``."""
    text = jax.jit(fn).lower(*args).as_text()
    return ({"native"} if "woa_triton_launch" in text else set()) | (
        {"callback"} if "xla_buffer_python_gpu_callback" in text else set())


def _assert_native(fn, *args):
    assert _routes(fn, *args) == {"native"}


def _oracle_quant(args, g):
    return jax.jit(woa_jax.inverse_rope_group_quant, static_argnums=(4, 5))(*args, g, 128)


def _oracle_gemm(x, w, xs, ws):
    return jax.jit(woa_jax.batched_gemm_a8w8_mxscale, static_argnames="dtype")(
        x, w, xs, ws, dtype=jnp.float32)


pytestmark = pytest.mark.gpu


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    monkeypatch.delenv("WOA_JAX_NATIVE", raising=False)
    monkeypatch.delenv("WOA_BACKEND", raising=False)
    reason = jax_ops.native_route_reason("triton")
    assert reason is None, f"no native route on this GPU machine: {reason}"


@pytest.mark.parametrize("s", [1, 7, 128, 1000])
@pytest.mark.parametrize("g", [2, 16])
@pytest.mark.parametrize("quant_config", [None, launch.QuantConfig(32, 4)])
def test_gpu_quant_bit_exact(on_gpu, monkeypatch, s, g, quant_config):
    """The tuned launch shape (per-head kernel) and the flat-rows kernel."""
    if quant_config is not None:
        monkeypatch.setattr(configs, "quant_config", lambda s, **_: quant_config)
    seed = new_seed()
    args, _, _ = _inputs(s, g, seed)
    quant = lambda *a: jax_ops.inverse_rope_group_quant(*a, g, 128)  # noqa: E731
    _assert_native(quant, *args)
    q, sc = jax.jit(quant)(*args)
    rq, rs = _oracle_quant(args, g)
    assert q.dtype == jnp.float8_e4m3fn and sc.dtype == jnp.float8_e8m0fnu
    assert not np.isnan(np.asarray(q.astype(jnp.float32))).any(), f"seed {seed}"
    assert_bitwise_equal(sc, rs, name=f"scale (seed {seed})")
    assert_bitwise_equal(q, rq, name=f"fp8 (seed {seed})")


def _torch(*arrays):
    import torch

    return [interop.to_torch(a).view(torch.uint8) if a.dtype == jnp.float8_e8m0fnu
            else interop.to_torch(a) for a in arrays]


@pytest.mark.parametrize("s,g", [(1, 2), (7, 2), (128, 2), (1000, 2), (1, 16), (7, 16),
                                 (64, 16), (128, 16), (1000, 16), (4096, 16)])
def test_gpu_gemm_and_chain(on_gpu, s, g):
    """Native at every size, within the oracle's tolerance; the GEMM gives the torch launcher's
    bits wherever torch's takes no TMA kernel (the same kernels, tiles, K split and
    specialization; on Hopper the wgmma kernel where torch takes it, TMA descriptors encoded by
    the custom call)."""
    import torch

    seed = new_seed()
    args, w, ws = _inputs(s, g, seed)
    x, xs = _oracle_quant(args, g)
    ref = _oracle_gemm(x, w, xs, ws)
    tma = launch.gemm_config(s, g, N, HPG * DH, 128, wgmma=jax_launch.wgmma_ok()).tma
    for dtype in (jnp.bfloat16, jnp.float32):
        gemm = lambda *a, d=dtype: jax_ops.batched_gemm_a8w8_mxscale(*a, dtype=d)  # noqa: E731
        assert _routes(gemm, x, w, xs, ws) == {"native"}
        y = jax.jit(gemm)(x, w, xs, ws)
        assert y.dtype == dtype and y.shape == (s, g, N)
        assert_close(y, ref, tolerance="gemm_bf16", name=f"gemm {dtype} (seed {seed})")
        if not tma:
            want = launch.batched_gemm_a8w8_mxscale(*_torch(x, w, xs, ws),
                                                    dtype=getattr(torch, np.dtype(dtype).name))
            torch.cuda.synchronize()
            assert_bitwise_equal(y, interop.to_jax(want), name=f"vs torch {dtype} (seed {seed})")
    chain = lambda *a: jax_ops.wo_a_fp8(*a, g)  # noqa: E731
    assert _routes(chain, *args, w, ws) == {"native"}
    y = jax.jit(chain)(*args, w, ws)
    assert y.dtype == jnp.bfloat16
    assert_close(y, ref, tolerance="gemm_bf16", name=f"chain (seed {seed})")


#: ``kernels`` of a chain that fuses on the wgmma tile where the wgmma kernels run (Hopper),
#: and runs the quant and the GEMM elsewhere.
FUSED_ON_HOPPER = -1


@pytest.mark.parametrize("s,g,kernels", [(1, 16, 1), (2, 16, 2), (1, 4, 1), (1, 2, FUSED_ON_HOPPER),
                                         (2, 2, 2), (16, 2, 2), (64, 2, 2), (256, 2, 2),
                                         (16, 4, 2), (128, 4, 2)])
def test_gpu_chain_is_one_call_with_torchs_bits(on_gpu, s, g, kernels):
    """The chain lowers to one custom call: the fused launch where the torch launcher fuses,
    else the quant and the GEMM (its programmatic dependent where the GEMM is the wgmma
    kernel); both give the torch launcher's bits (the same kernels and tiles) and meet the
    oracle."""
    import torch

    from torch_bridge import interop
    from torch_bridge.backends.triton import gemm

    if kernels == FUSED_ON_HOPPER:
        kernels = 1 if gemm.wgmma_available(None)[0] else 2

    seed = new_seed()
    args, w, ws = _inputs(s, g, seed)
    chain = lambda *a: jax_ops.wo_a_fp8(*a, g)  # noqa: E731
    (line,) = [line for line in jax.jit(chain).lower(*args, w, ws).as_text().splitlines()
               if "custom_call @woa_triton_launch" in line]
    names = re.search(r'names = "([^"]*)"', line).group(1).split()
    assert len(names) == kernels, names
    y = jax.jit(chain)(*args, w, ws)
    t = [interop.to_torch(a) for a in (*args, w)] + [interop.to_torch(ws).view(torch.uint8)]
    want = launch.wo_a_fp8(*t, g)
    torch.cuda.synchronize()
    assert_bitwise_equal(y, interop.to_jax(want), name=f"vs torch (seed {seed})")
    x, xs = _oracle_quant(args, g)
    assert_close(y, _oracle_gemm(x, w, xs, ws), tolerance="gemm_bf16", name=f"seed {seed}")


def test_gpu_env_switch_and_torch_launcher_agree(on_gpu, monkeypatch):
    """WOA_JAX_NATIVE=0 lowers to buffer_callback with the same bytes as the native route and
    the torch launcher."""
    import torch

    from torch_bridge import interop

    g, s = 2, 128
    args, _, _ = _inputs(s, g, new_seed())
    q, sc = jax.jit(lambda *a: jax_ops.inverse_rope_group_quant(*a, g, 128))(*args)
    monkeypatch.setenv("WOA_JAX_NATIVE", "0")
    cb = lambda *a: jax_ops.inverse_rope_group_quant(*a, g, 128)  # noqa: E731
    assert _routes(cb, *args) == {"callback"}
    q2, sc2 = jax.jit(cb)(*args)
    assert_bitwise_equal(q2, q, name="fp8")
    assert_bitwise_equal(sc2, sc, name="scale")
    cfg = launch.QuantConfig(block_r=8, num_warps=1)
    tq, ts = launch.inverse_rope_group_quant(*(interop.to_torch(a) for a in args), g, 128,
                                             config=cfg)
    torch.cuda.synchronize()
    assert_bitwise_equal(tq, q, name="torch fp8")
    assert_bitwise_equal(ts, sc, name="torch scale")
