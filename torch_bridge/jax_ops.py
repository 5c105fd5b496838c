"""JAX entry points that run the torch backends' kernels inside ``jax.jit``, zero-copy.

Each op picks its backend with the same dispatcher as ``torch_bridge`` (``backend=`` argument,
else ``WOA_BACKEND``, else the ``auto`` walk: AITER on gfx950, the Triton kernels elsewhere) and
launches it by one of two routes, chosen at trace time and logged once (logger ``woa``):

* native (the Triton backend on a CUDA JAX, unless ``WOA_JAX_NATIVE=0``): the same Triton
  kernels, compiled at trace time, lowered to our XLA FFI custom call ``woa_triton_launch``
  (``backends/triton/xla_ffi.py``); XLA launches them on its stream with no Python at run
  time. ``wo_a_fp8`` is one custom call there: the fused launch where the torch launcher fuses
  the chain, else the quant and the GEMM, the GEMM its programmatic dependent where torch's
  launcher makes it one; split-K's scratch is XLA's (``jax_launch``).
* ``jax.experimental.buffer_callback`` (every other case: AITER, the Triton interpreter on CPU,
  ROCm, a machine where the custom call's handler cannot be built): XLA hands the callback its
  device buffers and its stream, the buffers are wrapped as torch tensors with DLPack (no copy)
  and the backend launches on XLA's stream, writing the outputs in place. One-byte dtypes (fp8,
  E8M0) cross the boundary as ``uint8`` and are re-viewed on each side, so the exchange does
  not depend on DLPack's fp8 support. XLA records the callback into its command buffers (CUDA
  graphs) and replays it without Python wherever that is safe (``command_buffer_blocker``):
  by default, the Triton backend's quant, GEMM and chain (``wo_a_fp8`` is one callback, to
  the fused kernel or to the quant and the GEMM); ``WOA_JAX_COMMAND_BUFFER=0`` opts out. A
  split-K launch gets its parts and counters from XLA too (``_split_scratch``,
  ``_wo_a_fp8_callback``).

On a CPU-only JAX with no backend asked for, the ops return the ``woa_jax`` oracle (pure JAX);
pass ``backend="triton"`` with ``TRITON_INTERPRET=1`` to run the callback route on CPU.
``wo_a_bf16`` (the BF16 fallback) always takes the callback route to the ``bf16`` backend.

Limits: no autodiff (forward only) and no ``vmap``. Cost: the native route adds one kernel
launch per op to XLA's own dispatch; where K is split, XLA zeroes the counters (one fusion for
all the layers of a step). The callback route re-enters Python on every call that is not
recorded (DLPack wrapping, a torch stream object, the torch launcher).
``benchmarks/RESULTS.md`` has the figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

import woa_jax
from woa_jax import AITER_AMAX_FLOOR, checks
from woa_jax.checks import check_fp8_dtype

from . import _dispatch
from ._capability import env_flag, jax_gpu_platform
from ._dispatch import BackendName

__all__ = ["FP8Weight", "batched_gemm_a8w8_mxscale", "inverse_rope_group_quant", "pack_weight",
           "wo_a_bf16", "wo_a_fp8"]

log = logging.getLogger("woa")

#: The routes already logged: ``(route, reason)``.
_route_logged: set[tuple[str, str]] = set()


def _device_type() -> str:
    """The torch device type of the buffers XLA will hand over (``cpu`` or ``cuda``)."""
    return "cpu" if jax.default_backend() == "cpu" else "cuda"


def native_route_reason(backend_name: str) -> str | None:
    """``None`` when an op on backend ``backend_name`` takes the native route;
    else why it goes through ``buffer_callback``."""
    if backend_name != "triton":
        return f"the dispatcher picked backend {backend_name!r}; only triton has a native route"
    if not env_flag("WOA_JAX_NATIVE", True):
        return "disabled by WOA_JAX_NATIVE=0"
    platform = jax_gpu_platform()
    if platform != "cuda":
        return f"JAX's default backend is {platform}; the native route needs cuda"
    from .backends.triton import jax_launch

    error = jax_launch.unavailable_reason()
    if error is not None:
        return f"the woa_triton_launch custom call is unavailable ({error})"
    return None


def _native(op: str, backend_name: str) -> bool:
    """Whether ``op`` takes the native route; logs each distinct decision once."""
    reason = native_route_reason(backend_name)
    key = ("native", "") if reason is None else ("buffer_callback", reason)
    if key not in _route_logged:
        _route_logged.add(key)
        if reason is None:
            log.info("jax_ops: %s runs natively through the woa_triton_launch custom call",
                     op)
        else:
            log.info("jax_ops: %s runs through buffer_callback: %s", op, reason)
    return reason is None


def _check_out_dtype(dtype) -> None:
    if np.dtype(dtype) not in (np.dtype(jnp.bfloat16), np.dtype(jnp.float32)):
        raise TypeError(f"dtype must be bfloat16 or float32, got {np.dtype(dtype).name}")


def _wo_a_fp8_on_triton(o, positions, cos_cache, sin_cache, w, w_scale, block: int,
                        num_groups: int, amax_floor: float, dtype,
                        backend: str | None) -> tuple[bool, bool]:
    """``(on_triton, fused)`` of ``wo_a_fp8``: whether the dispatcher picks triton for both the
    quant and the GEMM, and whether the torch launcher then fuses this chain into one launch
    (``jax_launch.wo_a_fp8_fits``)."""
    if _use_oracle(backend):
        return False, False
    # The two-step path's checks, so that both paths reject the same inputs the same way.
    s, h, dh, rd = checks.check_rope_inputs(o, positions, cos_cache, sin_cache)
    d = checks.check_group_split(s, h, dh, num_groups, block)
    check_fp8_dtype(w.dtype)
    _check_out_dtype(dtype)
    _, g, n, k, _ = checks.check_gemm_inputs(
        jax.ShapeDtypeStruct((s, num_groups, d), w.dtype), w,
        jax.ShapeDtypeStruct((s, num_groups, d // block), jnp.float8_e8m0fnu), w_scale)
    rope = _dispatch.rope_case(o, cos_cache, block, np.dtype(w.dtype), num_groups=num_groups,
                               amax_floor=amax_floor, device_type=_device_type())
    gemm = _dispatch.gemm_case(jax.ShapeDtypeStruct((s, g, k), w.dtype), w, block,
                               np.dtype(dtype), device_type=_device_type(), x_k_contiguous=True)
    if (_dispatch.select("inverse_rope_group_quant", rope, backend).name != "triton"
            or _dispatch.select("batched_gemm_a8w8_mxscale", gemm, backend).name != "triton"):
        return False, False
    from .backends.triton import jax_launch

    return True, jax_launch.wo_a_fp8_fits(s, g, n, k, block, dh, rd)


def _torch_wgmma() -> bool:
    """Whether the torch GEMM launcher may pick the wgmma kernel for XLA's buffers (as its
    default config asks ``gemm.wgmma_available`` of the tensors' device)."""
    if _device_type() != "cuda":
        return False
    from .backends.triton import gemm

    return gemm.wgmma_available(None)[0]


def _use_oracle(backend: BackendName | None) -> bool:
    return _device_type() == "cpu" and _dispatch.requested_backend(backend) == "auto"


def _torch_dtype(dtype):
    import torch

    return getattr(torch, np.dtype(dtype).name)


def _to_torch(buf, dtype=None):
    """A torch view of a buffer_callback buffer (uint8 buffers re-viewed as ``dtype``)."""
    import torch

    t = torch.from_dlpack(buf)
    return t.view(dtype) if dtype is not None and t.dtype != dtype else t


@contextlib.contextmanager
def _on_xla_stream(ctx):
    """Make XLA's compute stream torch's current stream for the launch (GPU only)."""
    import torch

    if _device_type() == "cpu":  # ctx.stream raises on CPU
        yield
        return
    with torch.cuda.stream(torch.cuda.ExternalStream(ctx.stream)):
        yield


def _fp8_bytes(x):
    """fp8 data as uint8 for DLPack (which has no fp8 dtypes); torch views it back."""
    return jax.lax.bitcast_convert_type(x, jnp.uint8)


def _command_buffer(flag: bool | None) -> bool:
    """Whether the caller asks for command buffers: ``flag``, else ``WOA_JAX_COMMAND_BUFFER``
    (default on)."""
    return flag if flag is not None else env_flag("WOA_JAX_COMMAND_BUFFER", True)


#: The callbacks XLA may record, ``(op, backend)``, and why their launches touch only XLA's
#: buffers. Anything else stays unrecorded (``command_buffer_blocker`` says why).
RECORDABLE = {
    ("inverse_rope_group_quant", "triton"):
        "the launcher writes only the two outputs XLA hands it, and XLA's dense inputs need no "
        "repacking",
    ("batched_gemm_a8w8_mxscale", "triton"):
        "the launcher writes only the output XLA hands it and, split, the parts and counters "
        "XLA hands it (_split_scratch)",
    ("wo_a_fp8", "triton"):
        "the chain's launcher writes only the output, the quantized activations and, split, "
        "the parts and counters XLA hands it (_wo_a_fp8_callback)",
}

#: Why a known callback may not be recorded: it launches into memory torch allocates.
_NOT_RECORDABLE = {
    ("inverse_rope_group_quant", "aiter"):
        "the AITER adapter converts positions to int64 and cos/sin to o's dtype in torch "
        "temporaries",
    ("batched_gemm_a8w8_mxscale", "aiter"):
        "AITER's GEMM has no out=: it writes a new torch tensor, then copies it into XLA's",
    ("wo_a_bf16", "bf16"):
        "the BF16 chain writes its rotated activations and its output into torch allocations",
}


def command_buffer_blocker(op: str, backend_name: str) -> str | None:
    """``None`` when ``op``'s callback on backend ``backend_name`` may be recorded into XLA's
    command buffers; else why not.

    A recorded callback is not called on replay: its launches rerun with the addresses seen
    while recording. Memory torch allocated inside the callback (outputs, temporaries, split-K
    parts and counters) is back in torch's pool by then, so a launch may be recorded only if
    it writes nothing but XLA's buffers (``RECORDABLE``; host decisions there depend on shapes
    and dtypes only, XLA's buffers being 16-byte aligned).
    """
    if (op, backend_name) in RECORDABLE:
        return None
    return _NOT_RECORDABLE.get(
        (op, backend_name),
        f"backend {backend_name!r}'s {op} is not known to write only the buffers XLA hands it")


def _records(flag: bool | None, op: str, backend_name: str) -> bool:
    """Whether ``op``'s callback is recorded: asked for (``_command_buffer``) and safe
    (``command_buffer_blocker``). Asking explicitly where it is not safe is a ``ValueError``."""
    blocker = command_buffer_blocker(op, backend_name)
    if flag and blocker is not None:
        raise ValueError(f"command_buffer=True: {op} on backend {backend_name!r} cannot be "
                         f"recorded in XLA command buffers: {blocker}")
    return blocker is None and _command_buffer(flag)


def _split_scratch(m: int, g: int, n: int, k: int, block: int):
    """``(split_k, tiles)`` of the Triton GEMM launcher's own config for XLA's buffers
    (``configs.gemm_config``); the callback route hands it XLA's fp32 parts
    ``[split_k, M, G, N]`` and ``tiles`` zeroed counters where ``split_k > 1``, so that a
    split launch, recorded or not, writes only XLA's memory (none from torch's counter pool)."""
    from .backends.triton import configs

    cfg = configs.gemm_config(m, g, n, k, block, wgmma=_torch_wgmma())
    return cfg.split_k, configs.programs(cfg, m, g, n)


def _callback(fn, out_types, command_buffer: bool, *args, aliases=None):
    return buffer_callback(fn, out_types, command_buffer_compatible=command_buffer,
                           input_output_aliases=aliases)(*args)


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups: int,
                             quant_group_size: int = 128, *, fp8_dtype=jnp.float8_e4m3fn,
                             amax_floor: float = AITER_AMAX_FLOOR,
                             backend: BackendName = "auto",
                             command_buffer: bool | None = None):
    """``woa_jax.inverse_rope_group_quant`` (fused semantics) on a torch backend's kernel.

    ``command_buffer`` (default: ``WOA_JAX_COMMAND_BUFFER``, on) lets XLA record the callback
    route's launch into its CUDA-graph command buffers and replay it without re-entering Python,
    where that is safe (``command_buffer_blocker``; ``True`` where it is not is a
    ``ValueError``). The native route (module docstring) ignores it.

    Args and returns as the oracle: ``(x_fp8 [S, G, D] fp8_dtype, x_scale [S, G, D / GS]
    float8_e8m0fnu)``; bit-identical to it (the backends' quant is bit-exact).
    """
    s, h, dh, rd = checks.check_rope_inputs(o, positions, cos_cache, sin_cache)
    d = checks.check_group_split(s, h, dh, num_groups, quant_group_size)
    check_fp8_dtype(fp8_dtype)
    amax_floor = checks.check_amax_floor(amax_floor)
    if _use_oracle(backend):
        return woa_jax.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups,
                                                quant_group_size, fp8_dtype=fp8_dtype,
                                                amax_floor=amax_floor)
    case = _dispatch.rope_case(o, cos_cache, quant_group_size, np.dtype(fp8_dtype),
                               num_groups=num_groups, amax_floor=amax_floor,
                               device_type=_device_type())
    be = _dispatch.select("inverse_rope_group_quant", case, backend)
    if _native("inverse_rope_group_quant", be.name):
        from .backends.triton import jax_launch

        q, scale = jax_launch.inverse_rope_group_quant(
            o, positions[:s], cos_cache, sin_cache, num_groups, quant_group_size,
            fp8_dtype=fp8_dtype, amax_floor=amax_floor)
        return q, jax.lax.bitcast_convert_type(scale, jnp.float8_e8m0fnu)
    out_types = (jax.ShapeDtypeStruct((s, num_groups, d), jnp.uint8),
                 jax.ShapeDtypeStruct((s, num_groups, d // quant_group_size), jnp.uint8))

    f8 = _torch_dtype(fp8_dtype)

    def launch(ctx, outs, o_b, pos_b, cos_b, sin_b):
        with _on_xla_stream(ctx):
            be.inverse_rope_group_quant(
                _to_torch(o_b), _to_torch(pos_b), _to_torch(cos_b), _to_torch(sin_b),
                num_groups, quant_group_size, amax_floor=amax_floor,
                x_fp8=_to_torch(outs[0], f8), x_scale=_to_torch(outs[1]))

    q, scale = _callback(launch, out_types,
                         _records(command_buffer, "inverse_rope_group_quant", be.name), o,
                         positions[:s], cos_cache, sin_cache)
    return (jax.lax.bitcast_convert_type(q, fp8_dtype),
            jax.lax.bitcast_convert_type(scale, jnp.float8_e8m0fnu))


def batched_gemm_a8w8_mxscale(x, w, x_scale, w_scale, dtype=jnp.bfloat16, *,
                              backend: BackendName = "auto",
                              command_buffer: bool | None = None):
    """``woa_jax.batched_gemm_a8w8_mxscale`` on a torch backend's kernel -> ``[M, G, N]``.

    Agrees with the oracle to the output rounding (summation order is the kernel's).
    ``command_buffer``: as ``inverse_rope_group_quant``'s.
    """
    m, g, n, k, block = checks.check_gemm_inputs(x, w, x_scale, w_scale)
    _check_out_dtype(dtype)
    if _use_oracle(backend):
        return woa_jax.batched_gemm_a8w8_mxscale(x, w, x_scale, w_scale, dtype=dtype)
    # JAX arrays are dense row-major, so x is K-contiguous.
    case = _dispatch.gemm_case(x, w, block, np.dtype(dtype), device_type=_device_type(),
                               x_k_contiguous=True)
    be = _dispatch.select("batched_gemm_a8w8_mxscale", case, backend)
    if _native("batched_gemm_a8w8_mxscale", be.name):
        from .backends.triton import jax_launch

        return jax_launch.batched_gemm_a8w8_mxscale(x, w, x_scale, w_scale, dtype=dtype)
    out_types = (jax.ShapeDtypeStruct((m, g, n), dtype),)
    recorded = _records(command_buffer, "batched_gemm_a8w8_mxscale", be.name)
    split, tiles = _split_scratch(m, g, n, k, block) if be.name == "triton" and m else (1, 0)
    args = (_fp8_bytes(x), _fp8_bytes(w), woa_jax.e8m0_bytes(x_scale),
            woa_jax.e8m0_bytes(w_scale))
    aliases = None
    if split > 1:
        out_types, args, aliases = _split_outputs(out_types, args, split, (m, g, n), tiles)

    f8 = _torch_dtype(x.dtype)

    def launch(ctx, outs, x_b, w_b, xs_b, ws_b, *_):
        scratch = {"scratch": (_to_torch(outs[1]), _to_torch(outs[2]))} if split > 1 else {}
        with _on_xla_stream(ctx):
            be.batched_gemm_a8w8_mxscale(
                _to_torch(x_b, f8), _to_torch(w_b, f8), _to_torch(xs_b), _to_torch(ws_b),
                dtype=_torch_dtype(dtype), out=_to_torch(outs[0]), **scratch)

    return _callback(launch, out_types, recorded, *args, aliases=aliases)[0]


def wo_a_fp8(o, positions, cos_cache, sin_cache, weight, weight_scale, num_groups: int, *,
             amax_floor: float = AITER_AMAX_FLOOR, dtype=jnp.bfloat16,
             backend: BackendName = "auto", command_buffer: bool | None = None):
    """The FP8 chain under ``jax.jit``: fused inverse RoPE + quant, then the block-scaled GEMM.

    Same arguments as ``woa_jax.wo_a_fp8`` and ``torch_bridge.wo_a_fp8``. Where the torch
    launcher runs the chain as one fused kernel (``configs.wo_a_fp8_chosen``: DeepSeek V4 at
    M = 1 for G = 16, M <= 4 at G = 4, M <= 8 at G = 2 where the GEMM cannot launch as the
    quant's dependent, K split there) and the dispatcher
    picks triton, this launches that kernel too, natively or as one callback on XLA's scratch:
    the same bits, one launch. Elsewhere on triton the quant and the GEMM are one custom call
    or one callback, as the torch launcher runs them.

    Args:
      o: ``[S, H, Dh]`` bf16; positions ``[>= S]``; cos/sin ``[P, rd / 2]`` (bf16 for AITER bytes).
      weight: ``[G * N, K]`` fp8 checkpoint weight, or the GEMM's ``[G, N, K]`` view of it, or
        both with their scales as one ``FP8Weight`` (``pack_weight``; one argument of a jitted
        step instead of two; the Triton routes read it in place).
      weight_scale: ``[G * N / B, K / B]`` block scales: E8M0 bytes (uint8 or float8_e8m0fnu),
        or float powers of two when concrete (converted on the host, so not under ``jax.jit``).
        With a 3-D weight: ``[G, N / B, K / B]`` E8M0 bytes (``woa_jax.wo_a_weight_e8m0``
        gives both). ``None`` with an ``FP8Weight``.
      num_groups: G.
      command_buffer: see ``inverse_rope_group_quant``.

    Returns:
      ``[S, G, N]`` in ``dtype``.

    Raises:
      TypeError, ValueError: the oracle's errors for bad shapes, dtypes and scales.
    """
    amax_floor = checks.check_amax_floor(amax_floor)
    w, w_scale, packed = _unpacked_weight(weight, weight_scale, num_groups)
    block = w.shape[2] // w_scale.shape[2]
    on_triton, fused = _wo_a_fp8_on_triton(o, positions, cos_cache, sin_cache, w, w_scale, block,
                                           num_groups, amax_floor, dtype, backend)
    if on_triton and _native("wo_a_fp8", "triton"):
        from .backends.triton import jax_launch

        return jax_launch.wo_a_fp8(o, positions[:o.shape[0]], cos_cache, sin_cache, w, w_scale,
                                   num_groups, amax_floor=amax_floor, dtype=dtype,
                                   packed=packed)
    if on_triton:
        return _wo_a_fp8_callback(o, positions[:o.shape[0]], cos_cache, sin_cache,
                                  (w, woa_jax.e8m0_bytes(w_scale)) if packed is None else packed,
                                  num_groups, amax_floor, dtype, command_buffer, fused=fused)
    if packed is not None:
        w, w_scale = packed.parts()
    x, xs = inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups, block,
                                     fp8_dtype=w.dtype, amax_floor=amax_floor, backend=backend,
                                     command_buffer=command_buffer)
    return batched_gemm_a8w8_mxscale(x, w, xs, w_scale, dtype=dtype, backend=backend,
                                     command_buffer=command_buffer)


#: Byte alignment of the scales inside ``FP8Weight.data`` (kernels take 16-byte-aligned
#: pointers; 128 keeps them on a cache line).
PACK_ALIGN = 128


@dataclasses.dataclass(frozen=True)
class FP8Weight:
    """One layer's FP8 ``wo_a`` weight and its E8M0 block scales as one ``uint8`` array, for
    ``wo_a_fp8`` (``pack_weight`` makes it).

    ``data`` holds ``w [G, N, K]``'s bytes, then, from ``scale_offset``, ``w_scale
    [G, N / B, K / B]``'s. A jitted step pays the host's dispatch per array argument, so a
    layer's weight as one array costs one argument, not two. A pytree of one leaf: pass it
    into ``jax.jit`` like an array. ``fp8`` names the weight's dtype."""

    data: jax.Array
    num_groups: int
    n: int
    k: int
    block: int
    fp8: str

    @property
    def scale_offset(self) -> int:
        """Where the scales start in ``data`` (bytes)."""
        return -(-self.num_groups * self.n * self.k // PACK_ALIGN) * PACK_ALIGN

    @property
    def shapes(self) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
        """``(w, w_scale)`` as shapes and dtypes: ``[G, N, K]`` fp8, ``[G, N / B, K / B]``
        uint8."""
        g, n, k, b = self.num_groups, self.n, self.k, self.block
        return (jax.ShapeDtypeStruct((g, n, k), jnp.dtype(self.fp8)),
                jax.ShapeDtypeStruct((g, n // b, k // b), jnp.uint8))

    def parts(self) -> tuple[jax.Array, jax.Array]:
        """``(w [G, N, K], w_scale [G, N / B, K / B] uint8)`` sliced out of ``data`` (copies
        under ``jax.jit``; the Triton routes read ``data`` in place)."""
        w, ws = self.shapes
        size = self.num_groups * self.n * self.k
        at = self.scale_offset
        return (jax.lax.bitcast_convert_type(self.data[:size], w.dtype).reshape(w.shape),
                self.data[at:at + ws.size].reshape(ws.shape))


jax.tree_util.register_dataclass(FP8Weight, data_fields=["data"],
                                 meta_fields=["num_groups", "n", "k", "block", "fp8"])


def pack_weight(weight, weight_scale, num_groups: int) -> FP8Weight:
    """A checkpoint's ``wo_a`` weight and scales as one ``FP8Weight`` (``wo_a_fp8``'s
    ``weight``, with ``weight_scale=None``); once per layer, at load.

    Args:
      weight, weight_scale: as ``wo_a_fp8`` takes them (``[G * N, K]`` fp8 and
        ``[G * N / B, K / B]`` scales, or ``[G, N, K]`` and ``[G, N / B, K / B]`` E8M0 bytes).
      num_groups: G.

    Raises:
      TypeError, ValueError: the checks ``wo_a_fp8`` makes of a weight and its scales.
    """
    w, w_scale = _gemm_weight(weight, weight_scale, num_groups)
    check_fp8_dtype(w.dtype)
    g, n, k = w.shape
    ws = woa_jax.e8m0_bytes(w_scale)
    packed = FP8Weight(None, g, n, k, k // ws.shape[2], np.dtype(w.dtype).name)
    pad = packed.scale_offset - g * n * k
    data = jnp.concatenate([jax.lax.bitcast_convert_type(w, jnp.uint8).reshape(-1),
                            jnp.zeros(pad, jnp.uint8), ws.reshape(-1)])
    return dataclasses.replace(packed, data=data)


def _gemm_weight(weight, weight_scale, num_groups: int):
    """``(w [G, N, K], w_scale [G, N / B, K / B])`` of a checkpoint weight and its scales, or of
    the GEMM's own 3-D view (checked: its scales tile K)."""
    if len(weight.shape) != 3:
        return woa_jax.wo_a_weight_e8m0(weight, weight_scale, num_groups)
    _, _, ks = checks.check_rank(weight_scale, 3, "weight_scale", "[G, N / B, K / B]")
    if ks < 1 or weight.shape[2] % ks != 0:
        raise ValueError(f"weight_scale [G, N / B, K / B] = {tuple(weight_scale.shape)} does not "
                         f"tile K = {weight.shape[2]} of weight [G, N, K]")
    return weight, weight_scale


def _unpacked_weight(weight, weight_scale, num_groups: int):
    """``(w, w_scale, packed)``: an ``FP8Weight``'s shapes and itself, else the arrays of
    ``_gemm_weight`` and ``None``."""
    if not isinstance(weight, FP8Weight):
        return (*_gemm_weight(weight, weight_scale, num_groups), None)
    if weight_scale is not None:
        raise ValueError("an FP8Weight holds its scales: pass weight_scale=None")
    if num_groups != weight.num_groups:
        raise ValueError(f"num_groups={num_groups} but the FP8Weight was packed for "
                         f"{weight.num_groups} groups")
    return (*weight.shapes, weight)


def _split_outputs(out_types: tuple, args: tuple, split: int, shape: tuple[int, int, int],
                   tiles: int) -> tuple[tuple, tuple, dict[int, int]]:
    """A split callback's scratch as XLA's: the fp32 parts ``[split, M, G, N]`` and ``tiles``
    counters appended to the outputs, the counters an input of zeros made here and aliased to
    the last output (the kernels leave them at zero) -> ``(out_types, args, aliases)``."""
    out_types += (jax.ShapeDtypeStruct((split, *shape), jnp.float32),
                  jax.ShapeDtypeStruct((tiles,), jnp.int32))
    return out_types, args + (jnp.zeros(tiles, jnp.int32),), {len(args): len(out_types) - 1}


def _wo_a_fp8_callback(o, positions, cos_cache, sin_cache, weight, num_groups: int,
                       amax_floor: float, dtype, command_buffer: bool | None, *, fused: bool):
    """The Triton launcher's chain as one callback -> ``y [S, G, N]``; ``weight``: ``(w,
    w_scale)`` (uint8), or an ``FP8Weight``, which the callback views in place. The fused kernel
    (``fused``), else the quant and the GEMM as the torch launcher runs them (the GEMM its
    programmatic dependent where it makes one). One callback, not two: a recorded step updates
    each callback's command on every step its buffers move, so a layer costs one update.
    XLA owns every buffer it writes, the quantized activations and split-K's parts and counters
    included (outputs after ``y``; the counters are zeros aliased to the last), so it may be
    recorded."""
    from .backends.triton import configs, launch

    s = o.shape[0]
    packed = weight if isinstance(weight, FP8Weight) else None
    w, w_scale = weight if packed is None else weight.shapes
    g, n, k = w.shape
    block = k // w_scale.shape[2]
    if fused:
        cfg = configs.wo_a_fp8_config(s, g, n, k, block, wgmma=_torch_wgmma())
        split, tiles = cfg.split_k, configs.programs(cfg, s, g, n)
    else:
        cfg = None  # the launcher's own GEMM shape, and its dependent launch
        split, tiles = _split_scratch(s, g, n, k, block)
    out_types = (jax.ShapeDtypeStruct((s, g, n), dtype),
                 jax.ShapeDtypeStruct((s, g, k), jnp.uint8),
                 jax.ShapeDtypeStruct((s, g, k // block), jnp.uint8))
    weights = (_fp8_bytes(w), w_scale) if packed is None else (packed.data,)
    args = (o, positions, cos_cache, sin_cache, *weights)
    aliases = None
    if split > 1:
        out_types, args, aliases = _split_outputs(out_types, args, split, (s, g, n), tiles)
    f8 = _torch_dtype(w.dtype)

    def weight_views(buffers):
        if packed is None:
            return _to_torch(buffers[0], f8), _to_torch(buffers[1])
        data, at = _to_torch(buffers[0]), packed.scale_offset
        return (data[:w.size].view(f8).view(w.shape),
                data[at:at + w_scale.size].view(w_scale.shape))

    def run(ctx, outs, o_b, pos_b, cos_b, sin_b, *rest_b):
        y, x_fp8, *rest = (_to_torch(b) for b in outs)
        w_t, ws_t = weight_views(rest_b)
        with _on_xla_stream(ctx):
            launch.wo_a_fp8(_to_torch(o_b), _to_torch(pos_b), _to_torch(cos_b), _to_torch(sin_b),
                            w_t, ws_t, num_groups,
                            amax_floor=amax_floor, dtype=_torch_dtype(dtype), out=y,
                            single_kernel=fused, config=cfg,
                            scratch=(x_fp8.view(f8), *rest))

    return _callback(run, out_types, _records(command_buffer, "wo_a_fp8", "triton"), *args,
                     aliases=aliases)[0]


def wo_a_bf16(o, positions, cos_cache, sin_cache, weight, weight_scale, num_groups: int):
    """The BF16 fallback chain under ``jax.jit`` on the ``bf16`` backend's kernels -> ``[S, G, N]``.

    Same arguments as ``woa_jax.wo_a_bf16`` and ``torch_bridge.wo_a_bf16`` (JAX arrays are never
    written, so there is no ``overwrite_o``). XLA dequantizes the weight (exact, every call: a
    function keeps no prepared layer; ``torch_bridge.WoAProjection`` does), then the rotation and
    the BF16 GEMM run as ``torch_bridge``'s BF16 chain runs them, through ``buffer_callback``
    (never recorded in command buffers: ``command_buffer_blocker``). On a CPU JAX with
    ``WOA_BACKEND`` unset or ``auto`` this is the oracle.

    Raises:
      TypeError, ValueError: the oracle's errors for bad shapes, dtypes and scales.
    """
    woa_jax.check_wo_a_weight(weight, weight_scale, num_groups)
    s, h, dh, _ = checks.check_rope_inputs(o, positions, cos_cache, sin_cache)
    if h * dh != num_groups * weight.shape[1]:
        raise ValueError(
            f"o [S, H, Dh] = {tuple(o.shape)} gives G * K = {h * dh}, but the weight expects "
            f"num_groups * K = {num_groups} * {weight.shape[1]} = {num_groups * weight.shape[1]}")
    if _use_oracle(None):
        return woa_jax.wo_a_bf16(o, positions, cos_cache, sin_cache, weight, weight_scale,
                                 num_groups)
    w = woa_jax.dequant_wo_a_weight(weight, weight_scale, num_groups, dtype=jnp.bfloat16)
    g, n, _ = w.shape
    be = _dispatch.get_backend("bf16")

    def launch(ctx, out, o_b, pos_b, cos_b, sin_b, w_b):
        with _on_xla_stream(ctx):
            y = be.wo_a_bf16(_to_torch(o_b), _to_torch(pos_b), _to_torch(cos_b),
                             _to_torch(sin_b), _to_torch(w_b), num_groups)
            _to_torch(out).copy_(y)

    # Not recorded: the chain allocates through torch (_NOT_RECORDABLE).
    return _callback(launch, jax.ShapeDtypeStruct((s, g, n), jnp.bfloat16),
                     _records(False, "wo_a_bf16", be.name), o, positions[:s], cos_cache,
                     sin_cache, w)
