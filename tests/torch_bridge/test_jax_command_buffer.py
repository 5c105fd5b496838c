"""What XLA may record into its command buffers (CUDA graphs), and what it may not.

A recorded launch replays with the buffer addresses it saw while recording, without re-entering
the handler or the callback. So a launch may be recorded only if it writes nothing but the
buffers XLA hands it, and decides nothing on the host from values.

On CPU: the native handler's stages and trait (read from the built library as XLA reads them)
and its registration; which callbacks record by default, and why the others do not; the
callback GEMM never splitting K while recorded (split-K's scratch is torch's). On the GPU
(``pytest -m gpu``): jitted multi-layer steps replayed with new values at the same addresses,
bit for bit against torch's ``WoAProjection``, on both routes, across two executables and a
re-trace.
"""

from __future__ import annotations

import ctypes
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torch_bridge import jax_ops
from torch_bridge.backends.triton import configs, xla_ffi

# ---------------------------------------------------------------------------------------------
# The native route: the handler's stages and trait (CPU)
# ---------------------------------------------------------------------------------------------

#: XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE (xla/ffi/api/c_api.h).
_CMD_BUFFER_TRAIT = 1
_METADATA_EXTENSION = 1  # XLA_FFI_Extension_Metadata


class _ExtensionBase(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                ("next", ctypes.c_void_p)]


class _ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major", ctypes.c_int), ("minor", ctypes.c_int)]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _ApiVersion),
                ("traits", ctypes.c_uint32), ("state_type_id", ctypes.c_void_p)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("base", _ExtensionBase), ("metadata", ctypes.POINTER(_Metadata))]


class _Sequence(ctypes.Structure):  # XLA_FFI_Args / XLA_FFI_Rets
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.c_void_p), ("items", ctypes.c_void_p)]


class _Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.c_void_p), ("names", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p)]


class _CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("api", ctypes.c_void_p), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int),
                ("args", _Sequence), ("rets", _Sequence), ("attrs", _Attrs),
                ("future", ctypes.c_void_p)]


def _handler_traits(lib, symbol: str) -> int:
    """The traits a handler symbol reports to XLA: XLA registers a handler by calling it with
    the metadata extension (``GetMetadata``), which is where the command-buffer trait is read."""
    md = _Metadata(struct_size=_Metadata.traits.offset + ctypes.sizeof(ctypes.c_uint32))
    ext = _MetadataExtension(
        _ExtensionBase(_MetadataExtension.metadata.offset + ctypes.sizeof(ctypes.c_void_p),
                       _METADATA_EXTENSION, None), ctypes.pointer(md))
    frame = _CallFrame(struct_size=_CallFrame.future.offset,
                       extension_start=ctypes.addressof(ext))
    fn = getattr(lib, symbol)
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    assert fn(ctypes.addressof(frame)) is None, f"{symbol} refused the metadata query"
    assert md.api_version.major == 0 and md.api_version.minor >= 1
    return md.traits


@pytest.fixture
def handler(tmp_path, monkeypatch):
    """The built handler library (in a fresh cache); skipped without a C++ compiler."""
    monkeypatch.setenv("WOA_CACHE_DIR", str(tmp_path / "cache"))
    if xla_ffi._compiler() is None:
        pytest.skip("no C++ compiler to build the handler")
    return xla_ffi.build()


def test_execute_stage_is_command_buffer_compatible_and_initialize_loads(handler):
    """XLA records a custom call only if its execute handler reports the trait (the CUDA plugin
    takes no traits at registration); the initialize stage, which loads the module outside
    stream capture, is a second symbol of the same library."""
    lib = ctypes.CDLL(str(handler))
    assert set(xla_ffi.STAGES) == {"initialize", "execute"}
    assert _handler_traits(lib, xla_ffi.STAGES["execute"]) & _CMD_BUFFER_TRAIT
    assert _handler_traits(lib, xla_ffi.STAGES["initialize"]) == 0


def test_registration_passes_both_stages_and_no_traits(handler, monkeypatch):
    """One registration for platform CUDA with ``{"initialize", "execute"}`` capsules and no
    ``traits=`` (the CUDA plugin raises on any)."""
    seen = []
    monkeypatch.setattr(jax.ffi, "register_ffi_target",
                        lambda *args, **kwargs: seen.append((args, kwargs)))
    xla_ffi._registered.cache_clear()
    try:
        xla_ffi._registered()
    finally:
        xla_ffi._registered.cache_clear()
    [(args, kwargs)] = seen
    name, bundle = args
    assert name == xla_ffi.TARGET == "woa_triton_launch"
    assert kwargs == {"platform": "CUDA"}
    assert set(bundle) == {"initialize", "execute"}
    assert all(type(c).__name__ == "PyCapsule" for c in bundle.values())


# ---------------------------------------------------------------------------------------------
# The callback route: what records by default, and why the rest does not (CPU)
# ---------------------------------------------------------------------------------------------

def test_only_the_triton_launchers_record_by_default():
    """Recorded by default: the Triton backend's quant and GEMM, whose launchers write only the
    buffers XLA hands them. Not recorded, each with its reason: AITER (torch temporaries, a
    GEMM without ``out=``), the BF16 chain, any backend not audited."""
    for op in ("inverse_rope_group_quant", "batched_gemm_a8w8_mxscale"):
        assert jax_ops.command_buffer_blocker(op, "triton") is None
        assert jax_ops._records(None, op, "triton") is True
    blocked = {
        ("inverse_rope_group_quant", "aiter"): "int64",
        ("batched_gemm_a8w8_mxscale", "aiter"): "no out=",
        ("wo_a_bf16", "bf16"): "torch allocations",
        ("batched_gemm_a8w8_mxscale", "torch"): "not known to write only",
    }
    for (op, backend), why in blocked.items():
        assert why in jax_ops.command_buffer_blocker(op, backend), (op, backend)
        assert jax_ops._records(None, op, backend) is False
        assert jax_ops._records(False, op, backend) is False


def test_command_buffer_switch_opts_out_and_refuses_unsafe_requests(monkeypatch):
    """``WOA_JAX_COMMAND_BUFFER`` defaults to on and ``0`` turns recording off everywhere; an
    explicit argument beats it; ``command_buffer=True`` where recording is unsafe raises."""
    monkeypatch.delenv("WOA_JAX_COMMAND_BUFFER", raising=False)
    assert jax_ops._command_buffer(None) is True
    monkeypatch.setenv("WOA_JAX_COMMAND_BUFFER", "0")
    assert jax_ops._records(None, "batched_gemm_a8w8_mxscale", "triton") is False
    assert jax_ops._records(True, "batched_gemm_a8w8_mxscale", "triton") is True
    monkeypatch.setenv("WOA_JAX_COMMAND_BUFFER", "1")
    assert jax_ops._records(False, "inverse_rope_group_quant", "triton") is False
    with pytest.raises(ValueError, match="AITER's GEMM has no out="):
        jax_ops._records(True, "batched_gemm_a8w8_mxscale", "aiter")


@pytest.mark.parametrize("wgmma", [False, True])
@pytest.mark.parametrize("g", [2, 8, 16])
def test_recorded_callback_gemm_never_splits_k(g, wgmma):
    """Recorded, the callback GEMM runs the launcher's own tile with K unsplit (split-K's parts
    and counters are torch's); unrecorded, the launcher chooses (``None``)."""
    n, k, block = 1024, 4096, 128
    splits = 0
    for m in (1, 3, 16, 64, 256, 1024, 8192):
        own = configs.gemm_config(m, g, n, k, block, wgmma=wgmma)
        got = jax_ops.callback_gemm_config(m, g, n, k, block, wgmma=wgmma, recorded=True)
        assert jax_ops.callback_gemm_config(m, g, n, k, block, wgmma=wgmma,
                                            recorded=False) is None
        if own.split_k == 1:
            assert got is None, m
            continue
        splits += 1
        assert got.split_k == 1 and got == dataclasses.replace(own, split_k=1), m
    assert splits or g != 2  # at G = 2 the table splits K at small M: the rule bites


def test_recorded_callback_gemm_takes_no_torch_scratch(monkeypatch):
    """At a shape where the torch launcher splits K, the recorded callback takes no split-K
    scratch from torch's counter pool and gives the bits of the launcher's tile unsplit; the
    unrecorded callback splits as the launcher does."""
    import torch
    from inputs import gemm_operands, np_to_torch

    from torch_bridge.backends.triton import launch, split_k

    monkeypatch.setenv("WOA_JAX_NATIVE", "0")
    m, g, n, k = 3, 2, 128, 1024
    assert configs.gemm_config(m, g, n, k, 128).split_k > 1
    operands = gemm_operands(np.random.default_rng(0), m=m, g=g, n=n, k=k)
    x, w, xs, ws = (jnp.asarray(a) for a in operands)
    pools: dict = {}
    monkeypatch.setattr(split_k, "COUNTER_POOLS", pools)

    def gemm(cb):
        return jax.jit(lambda *a: jax_ops.batched_gemm_a8w8_mxscale(
            *a, backend="triton", command_buffer=cb))(x, w, xs, ws)

    y = gemm(True)
    assert pools == {}, "a recorded callback took split-K scratch from torch"
    cfg = jax_ops.callback_gemm_config(m, g, n, k, 128, wgmma=jax_ops._torch_wgmma(),
                                       recorded=True)
    tx, tw, txs, tws = (np_to_torch(a).to(launch_device()) for a in operands)
    want = launch.batched_gemm_a8w8_mxscale(tx, tw, txs, tws, config=cfg)
    np.testing.assert_array_equal(np.asarray(y).view(np.uint16),
                                  want.view(torch.int16).cpu().numpy().view(np.uint16))
    gemm(False)
    assert len(pools) == 1, "the unrecorded callback should split K as the launcher does"


def launch_device() -> str:
    return "cpu" if jax.default_backend() == "cpu" else "cuda"
