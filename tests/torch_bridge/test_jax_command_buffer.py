"""What XLA may record into its command buffers (CUDA graphs), and what it may not.

A recorded launch replays with the buffer addresses it saw while recording, without re-entering
the handler or the callback. So a launch may be recorded only if it writes nothing but the
buffers XLA hands it, and decides nothing on the host from values.

On CPU: the native handler's stages and trait (read from the built library as XLA reads them)
and its registration; which callbacks record by default, and why the others do not; the
callback GEMM splitting K as torch does on XLA's scratch, never torch's. On the GPU
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
from torch_bridge.backends.triton import configs, native_build, xla_ffi

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
    if native_build.compiler() is None:
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
    """Recorded by default: the Triton backend's quant, GEMM and fused chain, whose launchers
    write only the buffers XLA hands them. Not recorded, each with its reason: AITER (torch
    temporaries, a GEMM without ``out=``), the BF16 chain, any backend not audited."""
    for op in ("inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a_fp8"):
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
def test_callback_gemm_scratch_follows_the_launchers_config(g, wgmma, monkeypatch):
    """The callback hands the launcher XLA scratch for exactly its own config's split: parts
    for ``split_k`` K parts and one counter per output tile."""
    monkeypatch.setattr(jax_ops, "_torch_wgmma", lambda: wgmma)
    n, k, block = 1024, 4096, 128
    splits = 0
    for m in (1, 3, 16, 64, 256, 1024, 8192):
        own = configs.gemm_config(m, g, n, k, block, wgmma=wgmma)
        assert jax_ops._split_scratch(m, g, n, k, block) == (
            own.split_k, configs.programs(own, m, g, n)), m
        splits += own.split_k > 1
    assert splits or g != 2  # at G = 2 the table splits K at small M


@pytest.mark.parametrize("recorded", [True, False])
def test_callback_gemm_splits_on_xla_scratch(monkeypatch, recorded):
    """At a shape where the torch launcher splits K, the callback, recorded or not, splits it
    the same way on XLA's parts and counters: torch's counter pool is never created, and the
    bits are those of the torch launcher's own split launch (the reduction order is fixed)."""
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
    f = jax.jit(lambda *a: jax_ops.batched_gemm_a8w8_mxscale(
        *a, backend="triton", command_buffer=recorded))
    ys = [np.asarray(f(x, w, xs, ws)).view(np.uint16) for _ in range(2)]  # counters back at 0
    assert pools == {}, "the callback took split-K scratch from torch's pool"
    tx, tw, txs, tws = (np_to_torch(a).to(launch_device()) for a in operands)
    want = launch.batched_gemm_a8w8_mxscale(tx, tw, txs, tws)
    assert len(pools) == 1  # the torch launcher's own split launch
    for y in ys:
        np.testing.assert_array_equal(y, want.view(torch.int16).cpu().numpy().view(np.uint16))


def _callback_chain(monkeypatch, s: int, g: int, n: int):
    """Run ``jax_ops.wo_a_fp8`` twice on the callback route (the split counters must be back
    at 0 for the second) -> ``(torch inputs, each callback's output count, outputs as
    uint16)``; fails if a callback took split-K scratch from torch's counter pool."""
    from inputs import chain_tensors, jx

    from torch_bridge.backends.triton import split_k

    monkeypatch.setenv("WOA_JAX_NATIVE", "0")
    tensors = chain_tensors(np.random.default_rng(s), s, g=g, n=n)
    callbacks = []
    real_callback = jax_ops._callback

    def spy(fn, out_types, *args, **kwargs):
        callbacks.append(len(out_types))
        return real_callback(fn, out_types, *args, **kwargs)

    monkeypatch.setattr(jax_ops, "_callback", spy)
    pools: dict = {}
    monkeypatch.setattr(split_k, "COUNTER_POOLS", pools)
    o, pos, cos, sin, w, ws = tensors
    args = jx(o, pos.int(), cos, sin, w, ws)
    f = jax.jit(lambda *a: jax_ops.wo_a_fp8(*a, g, backend="triton"))
    ys = [np.asarray(f(*args)).view(np.uint16) for _ in range(2)]
    assert pools == {}, "the callback took split-K scratch from torch's pool"
    return tensors, callbacks, ys


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("s", [1, 3])
def test_callback_chain_is_one_fused_launch_on_xla_scratch(monkeypatch, s, split):
    """Where the torch launcher fuses the chain, the callback route makes one callback, to the
    fused launcher, on XLA's buffers for the prologue's activations and split-K's parts and
    counters: torch's counter pool is never created, and the bits are the torch launcher's
    (fused, and the same as quant + GEMM)."""
    import dataclasses

    import torch

    from torch_bridge.backends.triton import launch

    g, n, k = 2, 128, 1024
    # Fused by default on any device: a GPU's dependent GEMM would take these few tiles.
    monkeypatch.setattr(configs, "dependent_streams_weight", lambda *a: False)
    if not split:  # the launch shape of a chain with enough tiles to leave K whole
        fused_config = configs.wo_a_fp8_config
        monkeypatch.setattr(configs, "wo_a_fp8_config", lambda *a, **kw: dataclasses.replace(
            fused_config(*a, **kw), split_k=1, num_stages=5))
    assert configs.wo_a_fp8_chosen(s, g, n, k, 128, dependent=True)
    assert (configs.wo_a_fp8_config(s, g, n, k, 128).split_k > 1) == split
    (o, pos, cos, sin, w, ws), callbacks, ys = _callback_chain(monkeypatch, s, g, n)
    assert callbacks == [5 if split else 3], "not one callback to the fused launcher"
    fused = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=True)
    two_steps = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=False)
    for want in (fused, two_steps):
        for y in ys:
            np.testing.assert_array_equal(y, want.view(torch.int16).cpu().numpy().view(np.uint16))


@pytest.mark.parametrize("s", [3, 16])
def test_callback_unfused_chain_is_one_callback_on_xla_scratch(monkeypatch, s):
    """Where the torch launcher runs quant + GEMM, the callback route still makes one callback
    (a recorded step updates one command per layer, not two), to the chain's launcher, on
    XLA's buffers for the quantized activations and the GEMM's split-K parts and counters:
    torch's counter pool is never created, and the bits are the torch launcher's."""
    import torch

    from torch_bridge.backends.triton import jax_launch, launch

    monkeypatch.setattr(jax_launch, "wo_a_fp8_fits", lambda *a: False)
    g, n, k = 2, 128, 1024
    split = configs.gemm_config(s, g, n, k, 128).split_k > 1
    (o, pos, cos, sin, w, ws), callbacks, ys = _callback_chain(monkeypatch, s, g, n)
    assert callbacks == [5 if split else 3], "not one callback to the chain's launcher"
    want = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=False)
    for y in ys:
        np.testing.assert_array_equal(y, want.view(torch.int16).cpu().numpy().view(np.uint16))


@pytest.mark.parametrize("single_kernel", [True, False])
def test_chain_scratch_is_checked(single_kernel):
    """The chain launcher's ``scratch=`` must fit its launch, fused or quant + GEMM: the
    quantized activations' two buffers in the right dtype and shape, split-K's two more where
    K splits. A fitting one is written in place, with the launcher's own bits (and, on the
    two-kernel route, the quant's bytes)."""
    import torch
    from inputs import chain_tensors

    from torch_bridge.backends.triton import launch

    s, g, n, k = (1 if single_kernel else 3), 2, 128, 1024
    o, pos, cos, sin, w, ws = chain_tensors(np.random.default_rng(0), s, g=g, n=n)
    cfg = (configs.wo_a_fp8_config if single_kernel else configs.gemm_config)(s, g, n, k, 128)
    assert cfg.split_k > 1
    x = torch.empty((s, g, k), dtype=w.dtype, device=o.device)
    xs = torch.empty((s, g, k // 128), dtype=torch.uint8, device=o.device)
    parts = torch.empty((cfg.split_k, s, g, n), dtype=torch.float32, device=o.device)
    counters = torch.zeros(configs.programs(cfg, s, g, n), dtype=torch.int32, device=o.device)

    def call(scratch):
        return launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=single_kernel,
                               scratch=scratch)

    with pytest.raises(ValueError, match=f"splits K {cfg.split_k} ways, so it takes 4 tensors"):
        call((x, xs))
    with pytest.raises(ValueError, match="x_scale must be contiguous torch.uint8"):
        call((x, xs.view(torch.float8_e8m0fnu), parts, counters))
    with pytest.raises(ValueError, match="x_fp8 must be contiguous"):
        call((x[:, :1], xs, parts, counters))
    with pytest.raises(ValueError, match="split-K scratch must be"):
        call((x, xs, parts[:2], counters))
    want = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=single_kernel)
    torch.testing.assert_close(call((x, xs, parts, counters)), want, rtol=0, atol=0)
    assert not counters.any()  # the split launch leaves its counters at zero
    if not single_kernel:
        quant = launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
        assert torch.equal(x.view(torch.uint8), quant[0].view(torch.uint8))
        assert torch.equal(xs, quant[1].view(torch.uint8))


def test_given_scratch_is_checked():
    """The launcher's ``scratch=`` must be what a split launch needs; a wrong one is refused
    before any launch."""
    import torch

    from torch_bridge.backends.triton import split_k

    out = torch.empty((3, 2, 128))
    parts, counters = torch.empty((4, 3, 2, 128)), torch.zeros(8, dtype=torch.int32)
    assert split_k.split_scratch(out, 4, 8, (parts, counters))[1] is parts
    assert split_k.split_scratch(out, 1, 8, (parts, counters)) == (1, out, out)
    for bad in ((parts[:2], counters), (parts, counters[:7]), (parts.double(), counters),
                (parts, counters.long())):
        with pytest.raises(ValueError, match="split-K scratch must be"):
            split_k.split_scratch(out, 4, 8, bad)


def launch_device() -> str:
    return "cpu" if jax.default_backend() == "cpu" else "cuda"


# ---------------------------------------------------------------------------------------------
# Replays on the GPU: new values at the same addresses, every bit against torch
# ---------------------------------------------------------------------------------------------

#: Layers per step (with the input ops, more thunks than XLA's default minimum graph size of
#: 5, so the step is recorded without flags) and steps replayed per executable.
LAYERS, STEPS = 4, 20


def _variant(i: int) -> tuple[int, float, int]:
    """Step ``i``'s arguments: which base ``o``, a power-of-two scale of it (exact in bf16) and
    a shift of the positions; consecutive and every-other steps both see each change."""
    return (i // 2) % 2, (1.0, 2.0, 0.5, 4.0, 0.25)[i % 5], i % 7

ROUTE_ENV = {"native": {"WOA_JAX_NATIVE": "1"},
             "callback": {"WOA_JAX_NATIVE": "0", "WOA_JAX_COMMAND_BUFFER": "1"}}


def _step(g: int, backwards: bool = False):
    """A model step: ``o`` and the positions made inside the jit from step arguments, so every
    step brings new values to the same temporaries; each layer reads them with its own weight
    and tables; the outputs stacked in layer order (each layer's own output stays an XLA
    temporary). ``backwards`` launches the layers in reverse: the same kernels, another
    executable."""
    def step(params, base_a, base_b, base_pos, pick, scale, shift):
        o = jnp.where(pick == 0, base_a, base_b) * scale
        pos = base_pos + shift
        order = range(len(params))
        ys = {j: jax_ops.wo_a_fp8(o, pos, *params[j], g)
              for j in (reversed(order) if backwards else order)}
        return jnp.stack([ys[j] for j in order])

    return step


def _reference(route: str, layer, p, o, pos, on_gpu: bool):
    """Torch's bits for a route's layer: the ``WoAProjection`` where it runs the kernels the
    route runs (split K included), else the torch launcher running the route's kernels
    (``jax_step`` says which: the native GEMM takes the pointer kernel where torch's takes the
    TMA one)."""
    import torch

    from torch_bridge.backends.triton import gemm, launch
    from torch_bridge.bench import jax_step

    m, _, dh = o.shape
    g, n, k = p.w.shape
    block = k // p.ws.shape[2]
    rd = 2 * p.cos_bf16.shape[1]
    fused, cfg = jax_step._route_kernels(route, m, g, n, k, block, dh, rd, on_gpu=on_gpu)
    dependent = gemm.chain_dependent(m, g, n, k, block, torch.device(launch_device()))
    layer_fused = (configs.wo_a_fp8_blocker(dh, rd, block) is None
                   and configs.wo_a_fp8_chosen(m, g, n, k, block, dependent=dependent,
                                               wgmma=gemm.wgmma_available(None)[0]))
    own = configs.gemm_config(m, g, n, k, block, wgmma=gemm.wgmma_available(None)[0])
    same = fused if layer_fused else (not fused and (cfg is None or cfg == own))
    if same:
        return layer(o, pos), "WoAProjection"
    return (launch.wo_a_fp8(o, pos, p.cos_bf16, p.sin_bf16, p.w, p.ws, g, single_kernel=fused,
                            config=cfg), f"torch launch of the {route} route's kernels")


def _check_step(f, i: int, args, route, layers, probs, bases, pos, what: str):
    """Run ``f`` on ``args`` (params, the bases, the positions) and ``_variant(i)``; compare
    every layer's output bits with torch's on the same values."""
    import torch

    from torch_bridge import interop

    pick, scale, shift = _variant(i)
    ys = f(*args, jnp.int32(pick), jnp.asarray(scale, jnp.bfloat16), jnp.int32(shift))
    got = interop.to_torch(jax.block_until_ready(ys))
    o, p_step = bases[pick] * scale, pos + shift
    for j, (layer, p) in enumerate(zip(layers, probs, strict=True)):
        want, ref = _reference(route, layer, p, o, p_step, want_gpu := o.is_cuda)
        if want_gpu:
            torch.cuda.synchronize()
        bad = (got[j].view(torch.int16) != want.view(torch.int16)).sum().item()
        assert bad == 0, (f"{what}, step {i}, layer {j}: {bad} of {want.numel()} outputs "
                          f"differ from the {ref}")


def _replay(route: str, g: int, m: int, *, sweep, device: str, layers: int, steps: int):
    """``steps`` steps of each of two executables in turn (the same layers in two orders: the
    same kernels, two executables), then of a re-traced one, each checked by ``_check_step``."""
    import torch

    from torch_bridge import interop
    from torch_bridge.bench import jax_step, problem

    seed = int(np.random.default_rng().integers(1 << 30))
    lay = jax_step.make_layers(sweep, g, layers, device, seed, bf16=False)
    probs, torch_layers = lay.problems, lay.torch_layers
    inputs = [problem.make_problem(sweep, g, m, device, seed + d) for d in (0, 1)]
    bases = [p.o for p in inputs]
    pos = (inputs[0].pos % (sweep.cache_rows - 8)).to(torch.int32)
    params = tuple(tuple(interop.to_jax(t) for t in (p.cos_bf16, p.sin_bf16, p.w, p.ws))
                   for p in probs)
    args = (params, *(interop.to_jax(b) for b in bases), interop.to_jax(pos))
    marker = "woa_triton_launch" if route == "native" else "xla_buffer_python_"
    lowered = jax.jit(_step(g)).lower(*args, jnp.int32(0), jnp.asarray(1.0, jnp.bfloat16),
                                      jnp.int32(0))
    assert marker in lowered.as_text(), f"seed {seed}: the step does not take the {route} route"
    what = f"seed {seed}, {route}, G={g}, M={m}"
    forward, backward = jax.jit(_step(g)), jax.jit(_step(g, backwards=True))
    for i in range(2 * steps):  # the two executables in turn
        f, name = (forward, "executable 1") if i % 2 == 0 else (backward, "executable 2")
        _check_step(f, i, args, route, torch_layers, probs, bases, pos, f"{what}, {name}")
    jax.clear_caches()
    retraced = jax.jit(_step(g))
    for i in range(steps):
        _check_step(retraced, i, args, route, torch_layers, probs, bases, pos,
                    f"{what}, re-traced")


def test_replay_check_runs_on_the_interpreter(monkeypatch):
    """The replay check of the GPU test below, on the callback route under the Triton
    interpreter (no command buffers on CPU): its steps, executables and references agree."""
    from torch_bridge.bench import problem

    if jax.default_backend() != "cpu":
        pytest.skip("the GPU test covers this on a GPU")
    monkeypatch.setenv("WOA_BACKEND", "triton")
    for name, value in ROUTE_ENV["callback"].items():
        monkeypatch.setenv(name, value)
    _replay("callback", 2, 1, sweep=problem.CPU, device="cpu", layers=2, steps=2)


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    monkeypatch.delenv("WOA_BACKEND", raising=False)
    if jax.default_backend() == "cpu":
        pytest.skip("JAX has no GPU here")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 256])
@pytest.mark.parametrize("g", [2, 4, 16])
@pytest.mark.parametrize("route", ["native", "callback"])
def test_gpu_recorded_steps_replay_new_values_bit_exact(on_gpu, monkeypatch, route, g, m):
    """``_replay`` at DeepSeek V4 sizes: ``STEPS`` steps of each of two executables, then of
    a re-traced one; every layer's output bits equal torch's on the same values. A replay that
    kept a recorded value, wrote a stale address or loaded a module under capture fails here.
    At G = 2 and 4 the launches split K (the fused chain at the fewest tokens, the GEMM
    above) on XLA's scratch, and the layer's reference is torch's ``WoAProjection`` itself.
    """
    from torch_bridge.bench import problem

    for name, value in ROUTE_ENV[route].items():
        monkeypatch.setenv(name, value)
    if route == "native":
        reason = jax_ops.native_route_reason("triton")
        assert reason is None, f"no native route on this GPU machine: {reason}"
    _replay(route, g, m, sweep=problem.GPU, device="cuda", layers=LAYERS, steps=STEPS)
