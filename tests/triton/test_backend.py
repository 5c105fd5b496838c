"""The Triton backend's machinery around its kernels, on CPU through ``TRITON_INTERPRET=1``
(tests/conftest.py sets it without a GPU; on a GPU machine these run on the GPU): the backend's
availability and refusals, the registered custom ops (fake implementations, version counters,
the eager fast path, ``torch.compile``) and the JAX entry points' callback route.

The kernels themselves, op by op: ``tests/ops``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import woa_jax
from woa_jax.testing import assert_close, to_numpy

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import (  # noqa: E402
    DEVICE,
    assert_quant_equal,
    gemm_tensors,
    jx,
    rope_tensors,
)

from torch_bridge import _dispatch  # noqa: E402
from torch_bridge.backends.triton import (  # noqa: E402
    BACKEND,
    launch,
    quant,
)


def test_backend_availability_and_refusals():
    ok, reason = BACKEND.is_available()
    assert ok, reason
    case = _dispatch.Case(device_type=DEVICE, fp8_dtype="float8_e4m3fn", act_dtype="bfloat16",
                          rope_dtype="bfloat16", head_dim=512, rope_dim=64, quant_group_size=128)
    assert _dispatch.select("inverse_rope_group_quant", case, "triton") is BACKEND
    assert BACKEND.supports("batched_gemm_a8w8_mxscale", case) == (True, "ok")
    other = "cuda" if DEVICE == "cpu" else "cpu"
    refusals = {
        "device": _dispatch.Case(device_type=other),
        "layout": _dispatch.Case(device_type=DEVICE, scale_layout="mfma_tile"),
        "fp8": _dispatch.Case(device_type=DEVICE, fp8_dtype="float8_e5m2"),
        "out": _dispatch.Case(device_type=DEVICE, out_dtype="float16"),
        "gs": _dispatch.Case(device_type=DEVICE, quant_group_size=256),
    }
    for what, c in refusals.items():
        op = "batched_gemm_a8w8_mxscale" if what in ("out", "gs") else "inverse_rope_group_quant"
        ok, reason = BACKEND.supports(op, c)
        assert not ok and reason, what
    # The wo_a chain: the dispatcher asks the backend about both FP8 ops, after the weight check.
    wo_a = dataclasses.replace(case, out_dtype="bfloat16")
    assert _dispatch.check("triton", "wo_a", wo_a) == (True, "FP8 chain on triton")
    why = "bfloat16 checkpoint has no scale"
    no_scale = dataclasses.replace(wo_a, extra=(("fp8_unavailable", why),))
    assert _dispatch.check("triton", "wo_a", no_scale) == (False, why)


def test_backend_disabled_by_env(monkeypatch):
    monkeypatch.setenv("WOA_USE_TRITON", "0")
    BACKEND.cache_clear()
    try:
        ok, reason = BACKEND.is_available()
        assert not ok and "WOA_USE_TRITON=0" in reason
    finally:
        BACKEND.cache_clear()


def test_custom_ops_opcheck(rng):
    """The registered ops' fake implementations (torch.compile / CUDA graphs see opaque ops).

    (opcheck's schema test cannot run here: it compares fp8 tensors with ops CPU torch lacks.)"""
    o, pos, cos, sin = rope_tensors(rng, s=2, h=2)
    xq = torch.empty((2, 2, 512), dtype=torch.float8_e4m3fn, device=DEVICE)
    xs = torch.empty((2, 2, 4), dtype=torch.uint8, device=DEVICE)
    torch.library.opcheck(torch.ops.woa_triton.inverse_rope_group_quant.default,
                          (o, pos, cos, sin, xq, xs, 128, 1e-8, 8, 2, 0, False, False, 0),
                          test_utils=("test_faketensor",))
    token_major = quant.token_major_scales((2, 2, 4), 4, torch.device(DEVICE))
    torch.library.opcheck(torch.ops.woa_triton.inverse_rope_group_quant.default,
                          (o, pos, cos, sin, xq, token_major, 128, 1e-8, 1, 1, 1, False, True,
                           4), test_utils=("test_faketensor",))
    x, w, xsc, wsc = gemm_tensors(rng, 2, 2, 64, 128)
    y = torch.empty((2, 2, 64), dtype=torch.bfloat16, device=DEVICE)
    torch.library.opcheck(torch.ops.woa_triton.batched_gemm_a8w8_mxscale.default,
                          (x, w, xsc, wsc, y, 16, 64, 1, False, 4, 3, True, 1, False, False),
                          test_utils=("test_faketensor",))


def test_launchers_bump_version_counters_of_what_they_write(rng):
    """The launchers skip the ADInplaceOrView dispatch step for speed; they must still bump the
    version counters of the tensors they write, so autograd's in-place checks keep working."""
    o, pos, cos, sin = rope_tensors(rng, s=2, h=2)
    xq = torch.empty((2, 2, 512), dtype=torch.float8_e4m3fn, device=DEVICE)
    xs = torch.empty((2, 2, 4), dtype=torch.uint8, device=DEVICE)
    before = (xq._version, xs._version)
    launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, x_fp8=xq, x_scale=xs)
    assert (xq._version, xs._version) == (before[0] + 1, before[1] + 1)
    x, w, xsc, wsc = gemm_tensors(rng, 2, 2, 128, 256)
    y = torch.empty((2, 2, 128), dtype=torch.bfloat16, device=DEVICE)
    v = y._version
    launch.batched_gemm_a8w8_mxscale(x, w, xsc, wsc, out=y, config=launch.GemmConfig(16, 64))
    assert y._version == v + 1
    t = o.clone()
    scale = torch.ones((), dtype=torch.bfloat16, requires_grad=True)
    total = (t * scale).sum()  # the product saves t for scale's gradient
    launch.inverse_rope(t, pos, cos, sin, overwrite_o=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        total.backward()


def test_eager_calls_launch_directly_and_fake_tensors_take_the_op(rng, monkeypatch):
    """Plain eager calls skip the custom op's dispatch (host time) and launch the kernel
    function themselves; under a dispatch mode (here fake tensors) the op and its fake
    implementation run and nothing launches."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = quant._inverse_rope_group_quant_op
    launched = []
    real = op.launch_fn
    monkeypatch.setattr(op, "launch_fn", lambda *a: (launched.append(a[0]), real(*a)))
    o, pos, cos, sin = rope_tensors(rng, s=2, h=2)
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
    assert len(launched) == 1 and launched[0] is o
    assert_quant_equal(q, sc, *woa_jax.inverse_rope_group_quant(*jx(o, pos, cos, sin), 2, 128))
    with FakeTensorMode() as mode:
        fq, fs = launch.inverse_rope_group_quant(*(mode.from_tensor(t) for t in (o, pos, cos, sin)),
                                                 2, 128)
    assert len(launched) == 1
    assert tuple(fq.shape) == (2, 2, 512) and tuple(fs.shape) == (2, 2, 4)


def test_launchers_trace_under_torch_compile_without_graph_breaks(rng):
    """``fullgraph=True`` fails on any graph break: the launchers' eager fast path must not be
    traced (``torch.compiler.is_compiling()`` routes to the plain op call)."""
    o, pos, cos, sin = rope_tensors(rng, s=2, h=2)
    x, w, xsc, wsc = gemm_tensors(rng, 2, 2, 128, 256)

    def chain(o, x):
        q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
        y = launch.batched_gemm_a8w8_mxscale(x, w, xsc, wsc, config=launch.GemmConfig(16, 64))
        return q.view(torch.uint8), sc, y

    compiled = torch.compile(chain, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(o, x), chain(o, x), strict=True):
        assert torch.equal(got, want)


def test_jax_entry_points_oracle_and_callback(rng, monkeypatch):
    """On CPU the JAX ops return the oracle unless a backend is named; ``backend="triton"`` runs
    the same kernels through ``buffer_callback`` under ``jax.jit``, bit-exact for the quant."""
    if DEVICE != "cpu":
        pytest.skip("the CPU oracle fallback exists only on a CPU-only JAX")
    from torch_bridge import jax_ops

    monkeypatch.delenv("WOA_BACKEND", raising=False)
    o, pos, cos, sin = jx(*rope_tensors(rng))
    ref = woa_jax.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
    for backend in (None, "triton"):
        q, sc = jax.jit(lambda *a, b=backend: jax_ops.inverse_rope_group_quant(
            *a, 2, 128, backend=b))(o, pos, cos, sin)
        assert q.dtype == jnp.float8_e4m3fn and sc.dtype == jnp.float8_e8m0fnu
        assert_quant_equal(q, sc, *ref)
    w = jnp.asarray(rng.standard_normal((2, 128, 1024)).astype(np.float32)).astype(
        jnp.float8_e4m3fn)
    ws = jnp.asarray(rng.integers(118, 124, (2, 1, 8)).astype(np.uint8))
    y = jax.jit(lambda *a: jax_ops.wo_a_fp8(*a, 2, backend="triton"))(o, pos, cos, sin, w, ws)
    gref = woa_jax.batched_gemm_a8w8_mxscale(ref[0], w, ref[1], ws, dtype=jnp.float32)
    assert y.dtype == jnp.bfloat16
    assert_close(y, gref, tolerance="gemm_bf16")
    monkeypatch.setenv("WOA_JAX_COMMAND_BUFFER", "yes")
    with pytest.raises(ValueError, match="WOA_JAX_COMMAND_BUFFER"):
        jax_ops.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, backend="triton")


def test_jax_ops_wo_a_bf16_runs_the_bf16_chain_under_jit(rng, monkeypatch):
    """``jax_ops.wo_a_bf16``: the oracle on a CPU JAX by default; with ``WOA_BACKEND=bf16``
    the BF16 chain's kernels through ``buffer_callback`` under ``jax.jit``, within the BF16
    GEMM's tolerance of the oracle; a bad group count gives the oracle's error."""
    if DEVICE != "cpu":
        pytest.skip("the CPU oracle fallback exists only on a CPU-only JAX")
    from torch_bridge import jax_ops

    o, pos, cos, sin = jx(*rope_tensors(rng, rope_dtype=torch.float32))
    w = jnp.asarray(rng.standard_normal((256, 1024)).astype(np.float32)).astype(
        jnp.float8_e4m3fn)
    ws = jnp.asarray(rng.integers(118, 124, (2, 8)).astype(np.uint8))
    ref = woa_jax.wo_a_bf16(o, pos, cos, sin, w, ws, 2)
    monkeypatch.delenv("WOA_BACKEND", raising=False)
    assert np.array_equal(to_numpy(jax_ops.wo_a_bf16(o, pos, cos, sin, w, ws, 2)),
                          to_numpy(ref))
    monkeypatch.setenv("WOA_BACKEND", "bf16")
    y = jax.jit(lambda *a: jax_ops.wo_a_bf16(*a, 2))(o, pos, cos, sin, w, ws)
    assert y.dtype == jnp.bfloat16 and y.shape == (3, 2, 128)
    assert_close(y, ref, tolerance="gemm_bf16")
    with pytest.raises(ValueError, match="num_groups"):
        jax_ops.wo_a_bf16(o, pos, cos, sin, w, ws, 4)


def test_command_buffer_default(monkeypatch):
    """Unset, ``WOA_JAX_COMMAND_BUFFER`` asks for recording (where safe: ``jax_ops._records``);
    set, it decides; an explicit argument beats it."""
    from torch_bridge import jax_ops

    monkeypatch.delenv("WOA_JAX_COMMAND_BUFFER", raising=False)
    assert jax_ops._command_buffer(None) is True
    assert jax_ops._command_buffer(False) is False
    monkeypatch.setenv("WOA_JAX_COMMAND_BUFFER", "0")
    assert jax_ops._command_buffer(None) is False
    assert jax_ops._command_buffer(True) is True
