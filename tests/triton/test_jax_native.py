"""The native route of ``torch_bridge.jax_ops``: our ``woa_triton_launch`` XLA custom call.

On CPU: route selection, ``WOA_JAX_NATIVE``, building the handler, the launch specs against
the torch launcher's, the specialization and parameter map. The lowering and the sm_90
compiles are in ``test_jax_lowering.py``, the GPU tests in ``test_gpu_jax_native.py``.
"""

from __future__ import annotations

import ctypes
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from inputs import DH, HPG, RD, N, P

import woa_jax
from torch_bridge import jax_ops
from torch_bridge.backends.triton import (
    configs,
    jax_launch,
    kernels,
    launch,
    plans,
    quant_kernels,
    xla_ffi,
)
from torch_bridge.backends.triton.xla_ffi import Ref
from woa_jax.testing import assert_bitwise_equal


@pytest.fixture
def native_ok(monkeypatch):
    """A CUDA JAX with the custom call's handler built, as far as route selection can tell."""
    monkeypatch.delenv("WOA_JAX_NATIVE", raising=False)
    monkeypatch.setattr(jax_ops, "jax_gpu_platform", lambda: "cuda")
    monkeypatch.setattr(jax_launch, "unavailable_reason", lambda: None)


# ---------------------------------------------------------------------------------------------
# Route selection (CPU)
# ---------------------------------------------------------------------------------------------

def test_native_route_when_triton_on_cuda(native_ok):
    assert jax_ops.native_route_reason("triton") is None


def test_other_backends_keep_buffer_callback(native_ok):
    for name in ("aiter", "torch"):
        assert f"backend {name!r}" in jax_ops.native_route_reason(name)


def test_env_switch(native_ok, monkeypatch):
    monkeypatch.setenv("WOA_JAX_NATIVE", "0")
    assert jax_ops.native_route_reason("triton") == "disabled by WOA_JAX_NATIVE=0"
    monkeypatch.setenv("WOA_JAX_NATIVE", "1")
    assert jax_ops.native_route_reason("triton") is None
    monkeypatch.setenv("WOA_JAX_NATIVE", "off")
    with pytest.raises(ValueError, match="WOA_JAX_NATIVE='off' is not a valid switch"):
        jax_ops.native_route_reason("triton")


def test_env_var_is_registered():
    from torch_bridge._capability import ENV_VARS

    assert "WOA_JAX_NATIVE" in ENV_VARS and "WOA_CACHE_DIR" in ENV_VARS


@pytest.mark.parametrize("platform", ["cpu", "rocm"])
def test_non_cuda_platforms_keep_buffer_callback(native_ok, monkeypatch, platform):
    monkeypatch.setattr(jax_ops, "jax_gpu_platform", lambda: platform)
    assert jax_ops.native_route_reason("triton") == (
        f"JAX's default backend is {platform}; the native route needs cuda")


def test_handler_failure_is_the_reason(native_ok, monkeypatch):
    monkeypatch.setattr(jax_launch, "unavailable_reason",
                        lambda: "RuntimeError: no C++ compiler found (set CXX, or install g++)")
    assert jax_ops.native_route_reason("triton") == (
        "the woa_triton_launch custom call is unavailable (RuntimeError: no C++ compiler found "
        "(set CXX, or install g++))")


cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu",
                              reason="checks the route of a CPU-only JAX")


@cpu_only
def test_this_cpu_box_has_no_native_route():
    assert jax_ops.jax_gpu_platform() == "cpu"
    assert jax_ops.native_route_reason("triton") == (
        "JAX's default backend is cpu; the native route needs cuda")


def test_route_logged_once_per_reason(native_ok, monkeypatch, caplog):
    monkeypatch.setattr(jax_ops, "_route_logged", set())
    with caplog.at_level(logging.INFO, logger="woa"):
        assert jax_ops._native("op", "triton")
        assert jax_ops._native("op", "triton")
        assert not jax_ops._native("op", "aiter")
        assert not jax_ops._native("op", "aiter")
        monkeypatch.setenv("WOA_JAX_NATIVE", "0")
        assert not jax_ops._native("op", "triton")
    msgs = [r.getMessage() for r in caplog.records if "jax_ops" in r.getMessage()]
    assert msgs == [
        "jax_ops: op runs natively through the woa_triton_launch custom call",
        "jax_ops: op runs through buffer_callback: the dispatcher picked backend 'aiter'; "
        "only triton has a native route",
        "jax_ops: op runs through buffer_callback: disabled by WOA_JAX_NATIVE=0",
    ]


@cpu_only
def test_interpreter_call_logs_the_callback_route(monkeypatch, caplog, rng):
    """On CPU an explicit triton request runs (interpreter) through buffer_callback, and says so."""
    monkeypatch.setattr(jax_ops, "_route_logged", set())
    o = jnp.asarray(rng.standard_normal((1, 2, 128)).astype(np.float32)).astype(jnp.bfloat16)
    cos = jnp.ones((4, 16), jnp.bfloat16)
    pos = jnp.zeros((1,), jnp.int32)
    with caplog.at_level(logging.INFO, logger="woa"):
        q, sc = jax_ops.inverse_rope_group_quant(o, pos, cos, 0 * cos, 1, 128, backend="triton")
    rq, rs = woa_jax.inverse_rope_group_quant(o, pos, cos, 0 * cos, 1, 128)
    assert_bitwise_equal(q, rq, name="fp8")
    assert_bitwise_equal(sc, rs, name="scale")
    assert any("runs through buffer_callback: JAX's default backend is cpu" in r.getMessage()
               for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# Building the handler (CPU)
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WOA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_handler_builds_once_into_the_cache(cache):
    """The handler library exports the FFI symbol; a second build reuses it. Without a
    compiler the error says which one is missing, as the route's reason does."""
    if xla_ffi.native_build.compiler() is None:
        with pytest.raises(RuntimeError, match=r"no C\+\+ compiler found \(set CXX"):
            xla_ffi.build()
        return
    path = xla_ffi.build()
    assert path.parent == cache and path.name.startswith("xla_launch-")
    assert hasattr(ctypes.CDLL(str(path)), "WoaTritonLaunch")
    stamp = path.stat().st_mtime_ns
    assert xla_ffi.build() == path and path.stat().st_mtime_ns == stamp
    assert list(cache.iterdir()) == [path]  # no temporaries left behind


def test_handler_build_errors_are_reported(cache, monkeypatch):
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(RuntimeError, match=r"building xla_launch.cc failed \(false -O2"):
        xla_ffi.build()
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(xla_ffi.native_build.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"no C\+\+ compiler found \(set CXX, or install"):
        xla_ffi.build()


def test_unavailable_reason_is_one_line(cache, monkeypatch):
    monkeypatch.setenv("CXX", "false")
    xla_ffi._registered.cache_clear()
    try:
        reason = xla_ffi.unavailable_reason()
    finally:
        xla_ffi._registered.cache_clear()
    assert reason.startswith("RuntimeError: building xla_launch.cc failed") and "\n" not in reason


# ---------------------------------------------------------------------------------------------
# Specialization and the handler's parameter map (CPU)
# ---------------------------------------------------------------------------------------------

def test_specialize_follows_tritons_launcher():
    """Pointers typed by their operand and marked divisible by 16, integers that are multiples
    of 16 marked too, integers equal to 1 made constexprs (as Triton's launcher does)."""
    from triton.runtime.jit import JITFunction

    gemm = JITFunction(kernels.batched_gemm_a8w8_mxscale_kernel.fn)  # this process interprets
    args = (Ref(0), Ref(1), Ref(2), Ref(3), 1, Ref(4), Ref(4), Ref(4))
    dtypes = ("float8_e4m3fn", "float8_e4m3fn", "uint8", "uint8", "bfloat16")
    sig, attrs, cx = xla_ffi._specialize(gemm, args, dtypes, {"SPLIT_K": 1})
    assert sig["x_ptr"] == "*fp8e4nv" and sig["xs_ptr"] == "*u8" and sig["y_ptr"] == "*bf16"
    assert sig["M"] == "constexpr" and cx == {"SPLIT_K": 1, "M": 1}
    names = gemm.arg_names
    assert set(attrs) == {(names.index(p),) for p in (
        "x_ptr", "w_ptr", "xs_ptr", "ws_ptr", "y_ptr", "part_ptr", "count_ptr")}
    sig, attrs, _ = xla_ffi._specialize(gemm, args[:4] + (48,) + args[5:], dtypes, {})
    assert sig["M"] == "i32" and (names.index("M"),) in attrs
    sig, attrs, _ = xla_ffi._specialize(gemm, args[:4] + (7,) + args[5:], dtypes, {})
    assert sig["M"] == "i32" and (names.index("M"),) not in attrs
    with pytest.raises(TypeError, match="takes 8 runtime arguments"):
        xla_ffi._specialize(gemm, args[:7], dtypes, {})


def test_parameter_map():
    """Operands by index, scalars (but those specialized away) in order, and a descriptor as
    its tensor map, shape and strides, with the encoding Triton chose."""
    desc = xla_ffi.Desc(4, (7, 2048), 2048, (64, 128), layout=None)
    params, scalars, tmaps = xla_ffi.params(
        (Ref(0), desc, 1, 7, Ref(5)), ((9, 2, 3, (64, 64)),))
    assert params.tolist() == [0, -2, -1, -1, -1, -1, -1, 5]
    assert scalars.tolist() == [7, 2048, 2048, 1, 7]
    assert tmaps.tolist() == [4, 9, 2, 3, 0, 2, 64, 64, 7, 2048, 2048, 1]


# ---------------------------------------------------------------------------------------------
# Launch specs against the torch launcher (CPU)
# ---------------------------------------------------------------------------------------------

def test_quant_constants_are_one_plan_for_both_launchers():
    """``plans.quant`` makes the constexprs of both launchers: the compiled CUDA kernel's
    values here."""
    def constants(fp8, amax_floor, rope_dtype):
        return plans.quant(7, 16, DH, RD, 128, configs.quant_config(7), fp8=fp8,
                           amax_floor=amax_floor, o_dtype="bfloat16", rope_dtype=rope_dtype,
                           target="cuda").constexprs

    c = constants("float8_e4m3fn", woa_jax.CUDA_AMAX_FLOOR, "bfloat16")
    assert c.items() >= dict(INV_FP8_MAX=float(np.float32(1 / 448)), FP8_MAX=448.0,
                             FP8_MIN_NORMAL_EXP=-6, AMAX_FLOOR=float(np.float32(1e-10)),
                             HW_CAST=True, ROUND_PRODUCTS=0).items()
    fnuz = constants("float8_e4m3fnuz", 1e-8, "float32")
    assert (fnuz["FP8_MAX"], fnuz["FP8_MIN_NORMAL_EXP"], fnuz["HW_CAST"]) == (240.0, -7, False)
    # fp32 tables: each product of the rotation rounded by PTX mul.rn (as the oracle rounds it)
    assert fnuz["ROUND_PRODUCTS"] == 1


def _quant_call(s, g, gs=128, dh=DH):
    return jax_launch.quant_call(s, g * HPG, dh, RD, P, g, gs, fp8_dtype=jnp.float8_e4m3fn,
                                 amax_floor=1e-8, o_dtype=jnp.bfloat16, rope_dtype=jnp.bfloat16)


def test_quant_spec_rows_kernel(monkeypatch):
    monkeypatch.setattr(configs, "quant_config", lambda s, **_: launch.QuantConfig(16, 2))
    call = _quant_call(7, 2)
    nq = 2 * HPG * DH // 128
    assert call.kernel is quant_kernels.inverse_rope_group_quant_kernel
    assert call.args == (*map(Ref, range(4)), 7 * nq, P, 16 * DH, 32, 32, Ref(4), Ref(5))
    assert call.grid == (-(-7 * nq // 16),) and call.num_warps == 2
    cx = dict(call.constexprs)
    assert (cx["NQ"], cx["BLOCK_R"], cx["DH"], cx["RD"]) == (nq, 16, DH, RD)
    assert [(t.shape, t.dtype) for t in call.out_shape] == [
        ((7, 2, HPG * DH), jnp.float8_e4m3fn), ((7, 2, HPG * DH // 128), jnp.uint8)]


def test_quant_spec_head_kernel(monkeypatch):
    monkeypatch.setattr(configs, "quant_config", lambda s, **_: launch.QuantConfig(4, block_h=6))
    call = _quant_call(9, 2)  # H = 16: BLOCK_H = gcd(16, 6) = 2
    assert call.kernel is quant_kernels.inverse_rope_group_quant_head_kernel
    assert call.grid == (3 * 8,)  # token blocks x head blocks
    assert call.scalars == (9, P, 16 * DH, 32, 32)
    cx = dict(call.constexprs)
    assert (cx["H"], cx["BLOCK_T"], cx["BLOCK_H"]) == (16, 4, 2)
    # GS not dividing Dh falls back to the rows kernel, as in the torch launcher
    assert _quant_call(9, 1, gs=128, dh=192).kernel is quant_kernels.inverse_rope_group_quant_kernel


def _up(nbytes: int) -> int:
    """``nbytes`` rounded up to a scratch piece's alignment (128 bytes)."""
    return -(-nbytes // 128) * 128


def _assert_split(call, y, parts, counters, split, m, g, n, *, n_in, at, tiles):
    """Unsplit, ``y`` stands in for split-K's parts and counters (never touched). Split, the
    counters come in last (input ``n_in``, zeros from ``run``), which shifts ``y`` by one, and
    go out last, aliased (``KernelCall.counters``); the fp32 parts are the scratch's piece at
    byte ``at``, the scratch the output after ``y``."""
    if split == 1:
        assert parts == counters == y == Ref(n_in) and call.counters == 0
        return
    assert y == Ref(n_in + 1) and counters == Ref(n_in) and call.counters == tiles
    assert parts == Ref(n_in + 2, at, "float32")
    assert [(t.shape, t.dtype) for t in call.out_shape[-2:]] == [
        ((at + _up(4 * split * m * g * n),), jnp.uint8), ((tiles,), jnp.int32)]


def test_scratch_lays_out_its_pieces_aligned_in_order():
    sc = jax_launch.Scratch.of(7, a=((3, 5), jnp.float8_e4m3fn), b=((2,), jnp.int32),
                               c=((40,), jnp.float32))
    assert sc.refs == {"a": Ref(7, 0, "float8_e4m3fn"), "b": Ref(7, 128, "int32"),
                       "c": Ref(7, 256, "float32")}
    assert (sc.nbytes, sc.shape.shape, sc.shape.dtype) == (512, (512,), jnp.uint8)


@pytest.mark.parametrize("m,g", [(1, 2), (16, 2), (64, 2), (1000, 2), (32, 8), (64, 16)])
def test_gemm_spec_follows_gemm_config(m, g):
    n, k = 1024, 4096
    call = jax_launch.gemm_call(m, g, n, k, 128, n // 128, dtype=jnp.bfloat16)
    cfg = launch.gemm_config(m, g, n, k, 128)
    cx = dict(call.constexprs)
    strides = {name: [s // a.itemsize for s in a.strides[:-1]] for name, a in (
        ("x", np.empty((m, g, k), np.uint8)), ("xs", np.empty((m, g, k // 128), np.uint8)),
        ("w", np.empty((g, n, k), np.uint8)), ("ws", np.empty((g, n // 128, k // 128), np.uint8)),
        ("y", np.empty((m, g, n), np.uint16)))}
    assert strides == {"x": [cx["SXM"], cx["SXG"]], "xs": [cx["SXSM"], cx["SXSG"]],
                       "w": [cx["SWG"], cx["SWN"]], "ws": [cx["SWSG"], cx["SWSN"]],
                       "y": [cx["SYM"], cx["SYG"]]}
    assert (cx["BLOCK_M"], cx["BLOCK_N"], cx["SWAP_AB"]) == (cfg.block_m, cfg.block_n,
                                                              cfg.swap_ab)
    assert call.kernel is kernels.batched_gemm_a8w8_mxscale_kernel
    assert cx["SPLIT_K"] == cfg.split_k and (cfg.split_k > 1) == (g == 2 and m <= 64)
    assert call.args[:5] == (*map(Ref, range(4)), m) and call.results == 1
    _assert_split(call, *call.args[5:], cfg.split_k, m, g, n, n_in=4, at=0,
                  tiles=configs.programs(cfg, m, g, n))
    assert cx["OUT_BF16"] and (call.num_warps, call.num_stages) == (cfg.num_warps,
                                                                    cfg.num_stages)
    if g > 2 and 16 < m <= 64:  # the unswapped 64 x 64 pointer tile, 6 stages
        assert (cfg.block_m, cfg.block_n, cfg.swap_ab, cfg.num_stages) == (64, 64, False, 6)
    assert call.grid == (-(-m // cfg.block_m) * (n // cfg.block_n), g, cfg.split_k)
    fp32 = jax_launch.gemm_call(m, g, n, k, 128, n // 128, dtype=jnp.float32)
    assert not dict(fp32.constexprs)["OUT_BF16"] and fp32.out_shape[0].dtype == jnp.float32


@pytest.mark.parametrize("m,g", [(1, 16), (64, 16), (1024, 2), (8192, 16), (64, 2), (64, 1)])
def test_wgmma_spec_follows_the_torch_launcher(m, g):
    """Where ``gemm_config(wgmma=True)`` picks the wgmma kernel: its tile, grid and stages,
    descriptors over x [M, G * K], w [G * N, K] and y [M, G * N]; K split as the torch launcher
    splits it (G = 1 at M = 64), into XLA's parts and counters."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from torch_bridge.backends.triton import wgmma_kernels, wgmma_ws_kernels

    n, k = 1024, 4096
    cfg = launch.gemm_config(m, g, n, k, 128, wgmma=True)
    assert cfg.wgmma and (cfg.split_k > 1) == (g == 1 and m == 64)
    call = jax_launch.gemm_call(m, g, n, k, 128, n // 128, dtype=jnp.bfloat16, wgmma=True,
                                sms=132)
    assert call.kernel is (wgmma_ws_kernels.batched_gemm_a8w8_mxscale_wgmma_ws_kernel
                           if configs.warp_specialized(cfg)
                           else wgmma_kernels.batched_gemm_a8w8_mxscale_wgmma_kernel)
    assert ("PRODUCER_NUM_REGS" in dict(call.constexprs)) == configs.warp_specialized(cfg)
    programs = configs.tile_programs(m, g, n, cfg.block_m, cfg.block_n, cfg.programs_per_sm,
                                     132, cfg.split_k)
    assert call.grid == (programs,) and call.num_warps == cfg.num_warps
    x, w, y, xs, ws, m_arg, programs_arg, parts, counters = call.args
    assert (x.index, x.shape, x.row_stride, x.block) == (0, (m, g * k), g * k, (cfg.block_m, 128))
    assert (w.index, w.shape, w.row_stride, w.block) == (1, (g * n, k), k, (cfg.block_n, 128))
    split = cfg.split_k > 1
    assert (y.index, y.shape, y.block) == (4 + split, (m, g * n), (cfg.block_m, cfg.block_n))
    assert (xs, ws, m_arg, programs_arg) == (Ref(2), Ref(3), m, programs)
    _assert_split(call, Ref(y.index), parts, counters, cfg.split_k, m, g, n, n_in=4, at=0,
                  tiles=configs.programs(cfg, m, g, n))
    cx = dict(call.constexprs)
    assert cx["SPLIT_K"] == cfg.split_k
    assert cx["STAGES"] == configs.wgmma_stages(
        cfg.num_stages, k // 128 // cfg.split_k, cfg.block_m, cfg.block_n, 128, 2,
        staged_scales=configs.warp_specialized(cfg))
    assert (cx["SWAP_AB"], cx["G"], cx["SXSM"]) == (cfg.swap_ab, g, g * k // 128)
    assert jax_launch.gemm_call(m, g, n, k, 128, n // 128, dtype=jnp.bfloat16).kernel is (
        kernels.batched_gemm_a8w8_mxscale_kernel)  # without wgmma: the pointer kernel


def _chain_shapes(s, g):
    """Real rope inputs (small) and shape-only weights for the chain's route decision."""
    o = jnp.zeros((s, g * HPG, DH), jnp.bfloat16)
    pos = jnp.zeros((s,), jnp.int32)
    cos = sin = jnp.zeros((64, RD // 2), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((g, N, HPG * DH), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct((g, N // 128, HPG * DH // 128), jnp.float8_e8m0fnu)
    return o, pos, cos, sin, w, ws


@pytest.mark.parametrize("platform, version, reported, want", [
    ("gpu", "cuda 13.0", "9.0", 90), ("gpu", "rocm 6.4", "9.4", 0), ("cpu", "<unknown>", "", 0)])
def test_capability_is_cudas_only(monkeypatch, platform, version, reported, want):
    """The capability the wgmma and PDL rules read is CUDA's; any other device reports 0."""
    import types

    device = types.SimpleNamespace(platform=platform, compute_capability=reported,
                                   client=types.SimpleNamespace(platform_version=version))
    monkeypatch.setattr(jax, "devices", lambda *a: [device])
    monkeypatch.setattr(jax, "default_backend", lambda: platform)
    jax_launch.capability.cache_clear()
    try:
        assert jax_launch.capability() == want
    finally:
        jax_launch.capability.cache_clear()


def _dependent_here(s: int, g: int, n: int, k: int) -> bool:
    """Whether the JAX launcher's unfused chain makes its GEMM the quant's dependent here."""
    return jax_launch.chain_dependent(s, g, n, k, 128, wgmma=jax_launch.wgmma_ok())


def test_chain_fuses_as_torch_would_on_hopper_with_pdl(monkeypatch):
    """Where the GEMM may take the wgmma kernel and launch as the quant's dependent (an H100 or
    H200), the one-launch chain gives way at G = 2 from 2 tokens, whose dependent GEMM requests
    its whole weight during the quant, and stays at G = 4 and 16 for the fewest tokens; one
    token at G = 2 fuses on the wgmma tile; with ``WOA_PDL=0`` G = 2 fuses again."""
    k = HPG * DH
    monkeypatch.setattr(jax_launch, "capability", lambda: 90)
    monkeypatch.setattr(jax_launch, "wgmma_ok", lambda: True)
    monkeypatch.setattr(jax_launch, "interpreter_on", lambda: False)
    monkeypatch.setenv("WOA_PDL", "1")
    assert _dependent_here(1, 2, N, k)
    assert not any(jax_launch.wo_a_fp8_fits(s, 2, N, k, 128, DH, RD) for s in (2, 4, 8))
    assert all(jax_launch.wo_a_fp8_fits(s, g, N, k, 128, DH, RD)
               for s, g in ((1, 2), (1, 4), (4, 4), (1, 16)))
    assert configs.wo_a_fp8_config(1, 2, N, k, 128, wgmma=True).wgmma
    monkeypatch.setenv("WOA_PDL", "0")
    assert all(jax_launch.wo_a_fp8_fits(s, 2, N, k, 128, DH, RD) for s in (1, 2))


def test_chain_fuses_where_the_torch_launcher_fuses(native_ok):
    """Exactly where ``wo_a_fp8_chosen`` fuses, split K included (M <= 8 at G = 2 unless the
    unfused chain's GEMM is the quant's dependent here, M <= 4 at G = 4, M = 1 at G = 16);
    another backend never fuses natively."""
    def fused(s, g, backend="triton", dtype=jnp.bfloat16):
        o, pos, cos, sin, w, ws = _chain_shapes(s, g)
        on_triton, one_launch = jax_ops._wo_a_fp8_on_triton(o, pos, cos, sin, w, ws, 128, g,
                                                             1e-8, dtype, backend)
        assert on_triton == (backend == "triton")
        return one_launch

    assert fused(1, 16) and fused(1, 16, dtype=jnp.float32)
    assert launch.wo_a_fp8_config(1, 2, N, HPG * DH, 128).split_k > 1
    for g in (2, 4, 16):
        for s in (1, 2, 8, 16, 64, 256):
            assert fused(s, g) == launch.wo_a_fp8_chosen(
                s, g, N, HPG * DH, 128,
                dependent=_dependent_here(s, g, N, HPG * DH)), (s, g)
    assert fused(1, 2) != _dependent_here(1, 2, N, HPG * DH)
    assert fused(4, 4) and not fused(8, 4) and not fused(16, 2)
    assert not fused(2, 16)
    assert not fused(1, 16, backend="torch")
    assert jax_launch.wo_a_fp8_fits(1, 16, N, HPG * DH, 128, DH, RD)
    assert not jax_launch.wo_a_fp8_fits(1, 16, N, HPG * DH, 128, 192, RD)  # Dh % B != 0


def test_fused_chain_checks_inputs_like_the_two_steps(native_ok):
    o, pos, cos, sin, w, _ = _chain_shapes(1, 16)
    bad = jax.ShapeDtypeStruct((16, 4, HPG * DH // 128), jnp.float8_e8m0fnu)
    with pytest.raises(ValueError, match=r"w_scale must be \[G, ceil\(N / 128\), K / 128\]"):
        jax_ops._wo_a_fp8_on_triton(o, pos, cos, sin, w, bad, 128, 16, 1e-8, jnp.bfloat16,
                                    "triton")
    ws = jax.ShapeDtypeStruct((16, N // 128, HPG * DH // 128), jnp.float8_e8m0fnu)
    with pytest.raises(TypeError, match="dtype must be bfloat16 or float32, got float16"):
        jax_ops._wo_a_fp8_on_triton(o, pos, cos, sin, w, ws, 128, 16, 1e-8, jnp.float16,
                                    "triton")


@pytest.mark.parametrize("s", [1, 16])
def test_chain_is_one_native_call_fused_or_not(native_ok, monkeypatch, s):
    """The native route runs the chain as one call whether the torch launcher fuses it (M = 1)
    or not (M = 16), never as the quant op then the GEMM op."""
    calls = []

    def fake(o, positions, cos, sin, w, ws, g, *, amax_floor, dtype, packed):
        calls.append((positions.shape, g, amax_floor, np.dtype(dtype).name))
        return jnp.zeros((o.shape[0], g, N), dtype)

    monkeypatch.setattr(jax_launch, "wo_a_fp8", fake)
    monkeypatch.setattr(jax_launch, "inverse_rope_group_quant", None)
    monkeypatch.setattr(jax_launch, "batched_gemm_a8w8_mxscale", None)
    o, pos, cos, sin, w, ws = _chain_shapes(s, 16)
    y = jax_ops.wo_a_fp8(o, jnp.zeros((s + 4,), jnp.int32), cos, sin, w, ws, 16,
                         backend="triton", dtype=jnp.float32)
    assert y.shape == (s, 16, N) and calls == [((s,), 16, woa_jax.AITER_AMAX_FLOOR, "float32")]


@pytest.mark.parametrize("m,g", [(64, 2), (16, 4), (64, 16), (256, 2)])
@pytest.mark.parametrize("pdl", [True, False])
def test_unfused_chain_is_the_quant_then_the_gemm_on_its_outputs(monkeypatch, m, g, pdl):
    """The unfused chain's call: the quant writes its outputs into the call's scratch
    (``x_fp8`` first, then ``x_scale``), the GEMM reads them there and writes y, its parts
    (split K) the scratch's last piece and its counters the call's; the GEMM is the quant's
    programmatic dependent exactly where torch's launcher makes it one."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    monkeypatch.setattr(jax_launch, "pdl_ok", lambda: pdl)
    n, k = N, HPG * DH
    chain = jax_launch.wo_a_fp8_chain_call(
        m, g * HPG, DH, RD, P, g, n, k, 128, n // 128, fp8_dtype=jnp.float8_e4m3fn,
        amax_floor=1e-8, dtype=jnp.bfloat16, o_dtype=jnp.bfloat16, rope_dtype=jnp.bfloat16,
        wgmma=True, sms=132)
    cfg = launch.gemm_config(m, g, n, k, 128, wgmma=True)
    dependent = pdl and cfg.wgmma
    assert dependent == (pdl and configs.chain_dependent(m, g, n, k, 128, wgmma=True))
    quant, gemm = chain.launches
    alone = jax_launch.gemm_call(m, g, n, k, 128, n // 128, dtype=jnp.bfloat16, wgmma=True,
                                 sms=132)
    assert gemm.kernel is alone.kernel and chain.counters == alone.counters
    split = bool(chain.counters)
    assert split == (cfg.split_k > 1) and chain.results == 1
    y = 6 + split  # the counters come in after w_scale
    x, xs = Ref(y + 1, 0, "float8_e4m3fn"), Ref(y + 1, _up(m * g * k), "uint8")
    gemm_at = xs.offset + _up(m * g * k // 128)
    parts = alone.out_shape[1].shape[0] if split else 0
    assert [(t.shape, t.dtype) for t in chain.out_shape] == [
        ((m, g, n), jnp.bfloat16), ((gemm_at + parts,), jnp.uint8),
        *([((chain.counters,), jnp.int32)] if split else [])]
    assert [a for a in quant.args if isinstance(a, Ref)] == [*map(Ref, range(4)), x, xs]
    where = (x, Ref(4), xs, Ref(5), *((Ref(6),) if split else ()), Ref(y),
             *((Ref(y + 1, gemm_at, "uint8"), Ref(y + 2)) if split else ()))
    assert gemm.args == alone.renumbered(where).args
    assert dict(gemm.constexprs).get("PDL", False) == dependent
    assert dict(quant.constexprs)["PDL"] == (
        pdl and configs.quant_config(m, heads=g * HPG, dependent=dependent).pdl)


def test_fused_spec_follows_fused_config():
    call = jax_launch.wo_a_fp8_call(1, 16 * HPG, DH, RD, P, 16, N, HPG * DH, 128, N // 128,
                                 fp8_dtype=jnp.float8_e4m3fn, amax_floor=1e-8,
                                 dtype=jnp.bfloat16, o_dtype=jnp.bfloat16,
                                 rope_dtype=jnp.bfloat16)
    cfg = launch.wo_a_fp8_config(1, 16, N, HPG * DH, 128)
    cx = dict(call.constexprs)
    assert call.kernel is kernels.wo_a_fp8_kernel and call.scalars == (1, P)
    k = HPG * DH
    x, xs = Ref(7, 0, "float8_e4m3fn"), Ref(7, 16 * k, "uint8")
    assert call.args[8:] == (x, xs, Ref(6), Ref(6), Ref(6))  # y stands in for split-K's
    assert call.counters == 0 and call.results == 1
    assert call.grid == (N // cfg.block_n, 16, 1)
    assert (call.num_warps, call.num_stages) == (cfg.num_warps, cfg.num_stages)
    assert (cx["BLOCK_M"], cx["BLOCK_N"], cx["SOM"], cx["SWSG"], cx["SYM"]) == (
        cfg.block_m, cfg.block_n, 16 * HPG * DH, N // 128 * HPG * DH // 128, 16 * N)
    assert cx["QUANT_ROWS"] == configs.WO_A_FP8_QUANT_LANES // 128 and cx["OUT_BF16"]
    assert [(t.shape, t.dtype) for t in call.out_shape] == [
        ((1, 16, N), jnp.bfloat16), ((16 * k + _up(16 * k // 128),), jnp.uint8)]


def test_fused_spec_splits_like_the_torch_launcher():
    """G = 2 at M = 1: the fused kernel splits K as ``wo_a_fp8_config`` says; the counters
    input (6) shifts the outputs by one; the parts follow the activations in the scratch."""
    call = jax_launch.wo_a_fp8_call(1, 2 * HPG, DH, RD, P, 2, N, HPG * DH, 128, N // 128,
                                    fp8_dtype=jnp.float8_e4m3fn, amax_floor=1e-8,
                                    dtype=jnp.bfloat16, o_dtype=jnp.bfloat16,
                                    rope_dtype=jnp.bfloat16)
    cfg = launch.wo_a_fp8_config(1, 2, N, HPG * DH, 128)
    assert cfg.split_k > 1 and dict(call.constexprs)["SPLIT_K"] == cfg.split_k
    assert call.grid == (N // cfg.block_n, 2, cfg.split_k)
    k = HPG * DH
    assert call.args[8:10] == (Ref(8, 0, "float8_e4m3fn"), Ref(8, 2 * k, "uint8"))
    tiles = configs.programs(cfg, 1, 2, N)
    assert tiles == call.grid[0] * call.grid[1]
    _assert_split(call, *call.args[10:], cfg.split_k, 1, 2, N, n_in=6,
                  at=2 * k + _up(2 * k // 128), tiles=tiles)


@pytest.mark.parametrize("s,g,cfg", [
    (1, 2, configs.GemmConfig(8, 64, 4, True, 4, 8, wgmma=True)),
    (5, 16, configs.GemmConfig(8, 64, 1, True, 4, 8, wgmma=True, pdl=True))])
def test_fused_wgmma_spec_follows_its_tile(monkeypatch, s, g, cfg):
    """A wgmma tile of the fused chain (``--tuned`` may install one): the Gluon kernel, one
    program per tile and K part, descriptors over x (the scratch's first piece, as fp8),
    w (input 4) and y, the activations' scales and split-K's scratch as the pointer kernel's."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from torch_bridge.backends.triton import wgmma_kernels

    monkeypatch.setattr(configs, "wo_a_fp8_config", lambda *a, **kw: cfg)
    k = HPG * DH
    call = jax_launch.wo_a_fp8_call(s, g * HPG, DH, RD, P, g, N, k, 128, N // 128,
                                    fp8_dtype=jnp.float8_e4m3fn, amax_floor=1e-8,
                                    dtype=jnp.bfloat16, o_dtype=jnp.bfloat16,
                                    rope_dtype=jnp.bfloat16)
    tiles = configs.programs(cfg, s, g, N)
    assert call.kernel is wgmma_kernels.wo_a_fp8_wgmma_kernel
    assert call.grid == (tiles * cfg.split_k,) and call.num_warps == cfg.num_warps
    split = cfg.split_k > 1
    x, w, y, *rest = call.args
    scratch = 7 + split
    assert (x.index, x.shape, x.row_stride, x.block, x.dtype) == (
        scratch, (s, g * k), g * k, (cfg.block_m, 128), "float8_e4m3fn")
    assert (w.index, w.shape, w.row_stride, w.block) == (4, (g * N, k), k, (cfg.block_n, 128))
    assert (y.index, y.shape, y.block) == (6 + split, (s, g * N), (cfg.block_m, cfg.block_n))
    assert tuple(rest[:8]) == (Ref(0), Ref(1), Ref(2), Ref(3), Ref(5), s, P, tiles * cfg.split_k)
    assert tuple(rest[8:10]) == (Ref(scratch, 0, "float8_e4m3fn"),
                                 Ref(scratch, s * g * k, "uint8"))
    _assert_split(call, Ref(y.index), *rest[10:], cfg.split_k, s, g, N, n_in=6,
                  at=s * g * k + _up(s * g * k // 128), tiles=tiles)
    cx = dict(call.constexprs)
    assert (cx["SPLIT_K"], cx["PDL"], cx["G"], cx["SOM"]) == (cfg.split_k, cfg.pdl, g, g * k)
    assert cx["STAGES"] == configs.wgmma_stages(8, k // 128 // cfg.split_k, cfg.block_m,
                                                cfg.block_n, 128, 2)


@pytest.mark.parametrize("g", [2, 16])
@pytest.mark.parametrize("m", [1, 16, 64, 256])
@pytest.mark.parametrize("wgmma", [False, True])
def test_jax_launches_what_the_torch_launcher_launches(m, g, wgmma):
    """The GEMM's tile, stages and K split are ``gemm_config``'s, as the torch launcher's
    default; the one-launch chain is taken exactly where the torch launcher fuses."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    n, k = N, HPG * DH
    cfg = launch.gemm_config(m, g, n, k, 128, wgmma=wgmma)
    call = jax_launch.gemm_call(m, g, n, k, 128, n // 128, dtype=jnp.bfloat16, wgmma=wgmma,
                                sms=132)
    cx = dict(call.constexprs)
    block_m, block_n = (cx["BLOCK_M"], cx["BLOCK_N"]) if "BLOCK_M" in cx else (
        call.args[2].block)  # wgmma: the y descriptor's tile
    assert (block_m, block_n, cx["SPLIT_K"]) == (cfg.block_m, cfg.block_n, cfg.split_k)
    assert call.counters == (configs.programs(cfg, m, g, n) if cfg.split_k > 1 else 0)
    assert (cfg.split_k > 1) == (g == 2 and m <= (16 if wgmma else 256))
    assert jax_launch.wo_a_fp8_fits(m, g, n, k, 128, DH, RD) == launch.wo_a_fp8_chosen(
        m, g, n, k, 128, dependent=_dependent_here(m, g, n, k))
