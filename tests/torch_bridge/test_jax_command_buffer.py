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
