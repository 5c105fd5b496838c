"""``batched_gemm_a8w8_mxscale`` (block-scaled fp8 batched GEMM) on the Triton kernels against
the ``woa_jax`` oracle: the pointer kernel's tiles, split-K, the TMA and Hopper wgmma kernels,
fp32 output and V4.1's 32 x 32 blocks.

Interpreter axis: tiny shapes (about 1e6 FLOP per call), CPU under ``TRITON_INTERPRET=1``
(tests/conftest.py sets it; on a GPU machine these run on the GPU), within the bf16 output
rounding of the fp32 reference. GPU axis (``pytest -m gpu``): DeepSeek V4 sizes, the built-in
launch shapes and the wgmma kernel at explicit shapes. The kernels compiled for sm_90 and AMD:
``test_codegen.py``; the launch rules: ``tests/triton/test_configs.py``.
"""

from __future__ import annotations

import dataclasses
import logging

import jax.numpy as jnp
import pytest

import woa_jax
from woa_jax.testing import TOLERANCES, assert_close

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import (  # noqa: E402, F401
    DEVICE,
    DH,
    FP32_OUT_ON_GPU,
    GROUPS,
    HPG,
    TOKENS,
    N,
    capture,
    gemm_inputs,
    gemm_oracle,
    gemm_tensors,
    jx,
    new_seed,
    relerr,
    xla_memory,
)

from torch_bridge.backends.triton import _common, gemm, kernels, launch, split_k  # noqa: E402

gpu = pytest.mark.gpu

# ---------------------------------------------------------------------------------------------
# Interpreter axis: tiny shapes
# ---------------------------------------------------------------------------------------------


CONFIGS = [
    None,
    launch.GemmConfig(16, 64, swap_ab=True),
    launch.GemmConfig(16, 64, split_k=2),
    launch.GemmConfig(16, 128, swap_ab=True, num_stages=5),
    launch.GemmConfig(32, 64, swap_ab=True),
    launch.GemmConfig(64, 64, num_stages=6),  # the decode tile from 17 tokens without wgmma
    launch.GemmConfig(16, 64, tma=True),
    launch.GemmConfig(16, 64, swap_ab=True, tma=True, programs_per_sm=1),
    launch.GemmConfig(32, 128, tma=True, programs_per_sm=2),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.label() if c else "default")
@pytest.mark.parametrize("m", [1, 5, 33])
def test_gemm_against_oracle(rng, m, config):
    x, w, xs, ws = gemm_tensors(rng, m, 2, 128, 256)
    y = torch.full((m, 2, 128), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    out = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y, config=config)
    assert out is y
    ref = woa_jax.batched_gemm_a8w8_mxscale(*jx(x, w, xs, ws), dtype=jnp.float32)
    assert_close(y, ref, tolerance="gemm_bf16")


def test_gemm_fp32_out_ragged_n_transposed_x_and_32_blocks(rng):
    x, w, xs, ws = gemm_tensors(rng, 6, 2, 96, 256)  # N = 96: a ragged last 128-row weight block
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    y = launch.batched_gemm_a8w8_mxscale(xt, w, xs.view(torch.float8_e8m0fnu), ws,
                                         dtype=torch.float32)
    ref = woa_jax.batched_gemm_a8w8_mxscale(*jx(x, w, xs, ws), dtype=jnp.float32)
    assert y.dtype == torch.float32
    assert_close(y, ref, tolerance="gemm_fp32")
    x, w, xs, ws = gemm_tensors(rng, 3, 2, 64, 128, block=32)  # V4.1: 32 x 32 blocks
    y = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    ref = woa_jax.batched_gemm_a8w8_mxscale(*jx(x, w, xs, ws), dtype=jnp.float32)
    assert_close(y, ref, tolerance="gemm_bf16")


def test_gemm_config_splits_k_for_few_programs(rng, monkeypatch):
    """Few programs (G = 2 decode) split K; the kernel adds the parts in K order, so the bits
    are the same on every call (deterministic mode included) and the counters end at zero."""
    seen = []
    real = gemm._batched_gemm_a8w8_mxscale_op
    monkeypatch.setattr(gemm, "_batched_gemm_a8w8_mxscale_op",
                        lambda *a: (seen.append(a[7]), real(*a)))
    x, w, xs, ws = gemm_tensors(rng, 1, 2, 128, 256)
    ref = woa_jax.batched_gemm_a8w8_mxscale(*jx(x, w, xs, ws), dtype=jnp.float32)
    first = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    assert_close(first, ref, tolerance="gemm_bf16")
    torch.use_deterministic_algorithms(True)
    try:
        again = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    finally:
        torch.use_deterministic_algorithms(False)
    assert seen == [2, 2]  # K / B = 2 blocks caps the split at 2
    assert torch.equal(first.view(torch.int16), again.view(torch.int16))
    assert int(split_k.COUNTER_POOLS[x.device].counters.count_nonzero()) == 0


def test_split_k_counter_pool_ranges():
    """Eager launches on one stream share a range (grown when a launch needs more tiles);
    captured launches get ranges of their own; an exhausted pool says so with None."""
    pool = split_k.CounterPool(torch.device(DEVICE))
    eager = pool.take(8, stream=7)
    assert pool.take(8, stream=7).data_ptr() == eager.data_ptr()
    assert pool.take(4, stream=7).data_ptr() == eager.data_ptr()
    other = pool.take(8, stream=9)
    captured = [pool.take(8, stream=None) for _ in range(2)]
    starts = {t.data_ptr() for t in (eager, other, *captured)}
    assert len(starts) == 4
    grown = pool.take(16, stream=7)
    assert grown.numel() == 16 and grown.data_ptr() not in starts
    odd = pool.take(3, stream=None)  # ranges start 16-byte aligned (one kernel specialization)
    assert odd.numel() == 3 and pool.take(5, stream=None).data_ptr() - odd.data_ptr() == 16
    assert all(t.data_ptr() % 16 == 0 for t in (eager, other, *captured, grown, odd))
    assert pool.take(split_k.SPLIT_COUNTERS, stream=None) is None


def test_split_k_counters_are_rearmed_for_launches_of_other_shapes(rng):
    """Launches on one stream share counters: each leaves them at zero for the next, whatever
    its tile count (2 groups x 2, 4 and 1 N tiles; 2 and 4 K parts)."""
    x, w, xs, ws = gemm_tensors(rng, 3, 2, 128, 512)
    ref = woa_jax.batched_gemm_a8w8_mxscale(*jx(x, w, xs, ws), dtype=jnp.float32)
    for bn, split in ((64, 2), (32, 4), (128, 2), (64, 4)):
        cfg = launch.GemmConfig(16, bn, split_k=split, swap_ab=True)
        y = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, config=cfg, dtype=torch.float32)
        assert_close(y, ref, tolerance="gemm_fp32")
        assert int(split_k.COUNTER_POOLS[x.device].counters.count_nonzero()) == 0


def test_split_k_without_counters_runs_unsplit_and_logs_why(rng, monkeypatch, caplog):
    monkeypatch.setattr(split_k, "SPLIT_COUNTERS", 4)
    monkeypatch.setattr(split_k, "COUNTER_POOLS", {})
    monkeypatch.setattr(split_k, "_FALLBACK_LOGGED", set())
    x, w, xs, ws = gemm_tensors(rng, 3, 2, 128, 256)  # 2 groups x 2 N tiles of 64 = 4 counters
    ref = woa_jax.batched_gemm_a8w8_mxscale(*jx(x, w, xs, ws), dtype=jnp.float32)
    cfg = launch.GemmConfig(16, 64, split_k=2, swap_ab=True)
    with caplog.at_level(logging.WARNING, logger="woa"):
        assert_close(launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, config=cfg), ref,
                     tolerance="gemm_bf16")
        assert not caplog.records  # 4 tiles: the pool holds them
        cfg = launch.GemmConfig(16, 32, split_k=2, swap_ab=True)  # 8 tiles: more than the pool
        assert_close(launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, config=cfg), ref,
                     tolerance="gemm_bf16")
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, config=cfg)
    assert [r.getMessage() for r in caplog.records] == [
        "triton GEMM runs without split-K (slower at small M): its 4 counters are taken "
        "(each captured split launch keeps its own)"]


def test_gemm_rejects_bad_out_and_split(rng):
    x, w, xs, ws = gemm_tensors(rng, 2, 2, 128, 256)
    with pytest.raises(ValueError, match="out must be"):
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=torch.empty(
            (2, 2, 64), dtype=torch.bfloat16, device=DEVICE))
    with pytest.raises(ValueError, match="split_k=3"):
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, config=launch.GemmConfig(16, 64, 3))


def test_launcher_ops_mutate_only_tensors_they_always_get():
    """No custom op of ours declares an optional mutated tensor: torch 2.11's fake tensors
    fail on one left ``None`` under ``torch.compile``. Caller-owned memory (XLA's split-K
    scratch) is launched outside the ops (``_common.run_direct``)."""
    import torch_bridge.backends.triton  # noqa: F401  (registers the ops)

    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith(_common.LIB + "::")]
    assert any(n.endswith("batched_gemm_a8w8_mxscale") for n in names)
    for name in names:
        ns, op = name.split("::")
        schema = getattr(getattr(torch.ops, ns), op).default._schema
        for arg in schema.arguments:
            if arg.alias_info is not None and arg.alias_info.is_write:
                assert str(arg.type) == "Tensor", (name, arg.name, str(arg.type))


def test_gemm_under_fake_tensors_takes_the_op_and_refuses_a_callers_scratch(rng):
    """Fake tensors (what ``torch.compile`` traces with) reach the op's fake implementation;
    scratch a caller owns is for plain eager calls and says so."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, w, xs, ws = gemm_tensors(rng, 2, 2, 128, 256)
    cfg = launch.GemmConfig(16, 64, split_k=2)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fx, fw, fxs, fws = (mode.from_tensor(t) for t in (x, w, xs, ws))
        y = launch.batched_gemm_a8w8_mxscale(fx, fw, fxs, fws, config=cfg)
        assert y.shape == (2, 2, 128) and y.dtype == torch.bfloat16
        scratch = (torch.empty((2 * 2 * 128 * 2,)), torch.zeros((16,), dtype=torch.int32))
        with pytest.raises(ValueError, match="plain eager"):
            launch.batched_gemm_a8w8_mxscale(fx, fw, fxs, fws, config=cfg,
                                             scratch=tuple(mode.from_tensor(t) for t in scratch))


def test_default_wgmma_shape_runs_the_triton_kernels_when_x_has_no_tma_view(rng):
    """A default wgmma shape reaches the launch op before the operands' layout is known; when
    x cannot be viewed as TMA tiles (transposed from [G, M, K]) the op runs the Triton
    kernels' own shape, not the 8-token swapped tile, which ``tl.dot`` cannot take."""
    x, w, xs, ws = gemm_tensors(rng, 3, 2, 128, 256)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    out = torch.full((3, 2, 128), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    swapped = launch.GemmConfig(8, 64, swap_ab=True, num_warps=4, num_stages=8, wgmma=True)
    launcher = gemm._batched_gemm_a8w8_mxscale_op.launch_fn
    launcher(xt, w, xs, ws, out, *dataclasses.astuple(swapped))
    assert torch.equal(out, launch.batched_gemm_a8w8_mxscale(x, w, xs, ws))


def test_wgmma_kernel_is_hopper_only(rng):
    """The wgmma kernel never runs under the interpreter: the default shape avoids it and an
    explicit ``wgmma=True`` says why it cannot run (its tile rules: ``test_configs``)."""
    ok, why = launch.wgmma_available(None)
    assert not ok and why == "TRITON_INTERPRET=1 runs no wgmma (Gluon) kernels"
    assert not launch.wgmma_chosen(8192, 16, 1024, 4096, 128)
    assert not launch.gemm_config(8192, 16, 1024, 4096, 128).wgmma
    x, w, xs, ws = gemm_tensors(rng, 65, 2, 128, 256)
    with pytest.raises(RuntimeError, match="wgmma=True. cannot run here: TRITON_INTERPRET=1"):
        launch.batched_gemm_a8w8_mxscale(
            x, w, xs, ws, config=launch.GemmConfig(64, 128, num_warps=4, wgmma=True))


def test_tma_kernel_runs_only_when_the_operands_allow(rng, monkeypatch):
    """A ``tma=True`` config launches the TMA kernel (persistent: 12 tiles on 1 x 4 interpreter
    "SMs") when the operands view as 2D tiles, and falls back to pointer loads otherwise."""
    grids = []
    real = kernels.batched_gemm_a8w8_mxscale_tma_kernel

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    monkeypatch.setattr(kernels, "batched_gemm_a8w8_mxscale_tma_kernel", Spy())
    cfg = launch.GemmConfig(16, 64, tma=True, programs_per_sm=1)
    x, w, xs, ws = gemm_tensors(rng, 33, 2, 128, 256)
    y = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, config=cfg)
    assert grids == [(4,)]  # min(3 x 2 x 2 tiles, 1 x 4 SMs)
    assert_close(y, woa_jax.batched_gemm_a8w8_mxscale(*jx(x, w, xs, ws), dtype=jnp.float32),
                 tolerance="gemm_bf16")
    assert gemm.tma_ok(x, w, y, 64)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # [M, G, K] view of [G, M, K]
    assert not gemm.tma_ok(xt, w, y, 64)
    assert not gemm.tma_ok(x, w, y, 256)  # N = 128 is not a multiple of BLOCK_N
    shifted = torch.empty(y.numel() + 8, dtype=y.dtype, device=DEVICE)[1:1 + y.numel()]
    assert not gemm.tma_ok(x, w, shifted.view(y.shape), 64)  # base not 16-byte aligned
    y2 = launch.batched_gemm_a8w8_mxscale(xt, w, xs, ws, config=cfg)
    assert grids == [(4,)]
    assert_close(y2, y, tolerance="gemm_bf16")


# ---------------------------------------------------------------------------------------------
# GPU axis: DeepSeek V4 sizes
# ---------------------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("m", TOKENS)
def test_gpu_gemm_against_oracle(m, g):
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, HPG * DH, seed)
    y = torch.full((m, g, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y)
    ref = gemm_oracle(x, w, xs, ws)
    err = relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"


def _check_same_bits_elsewhere(first, runs: list, operands: tuple, seed: int,
                               on_side_stream=None) -> None:
    """``runs``, a launch on another stream and three CUDA-graph replays all give ``first``'s
    bits, and every split-K tile counter is back at zero."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        if on_side_stream is not None:
            on_side_stream()
        runs.append(launch.batched_gemm_a8w8_mxscale(*operands))
    torch.cuda.current_stream().wait_stream(side)
    y = torch.empty_like(first)
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        launch.batched_gemm_a8w8_mxscale(*operands, out=y)
    for _ in range(3):
        y.fill_(float("nan"))
        graph.replay()
        runs.append(y.clone())
    torch.cuda.synchronize()
    for i, r in enumerate(runs):
        assert torch.equal(r.view(torch.int16), first.view(torch.int16)), f"seed {seed}: run {i}"
    device = operands[0].device
    assert int(split_k.COUNTER_POOLS[device].counters.count_nonzero()) == 0


@gpu
@pytest.mark.parametrize("m,g", ((1, 2), (16, 2), (32, 1), (64, 1)))
def test_gpu_split_k_gemm_bits_never_depend_on_timing(m, g):
    """Decode grids of few tiles (G = 2 up to 16 tokens, G = 1 up to 64) split K over up to 8
    parts per tile, on either kernel family. Whatever order the parts arrive in, the kernel adds
    them in K order: 20 eager launches, a launch on another stream and a CUDA graph replay all
    give the same bits, and every tile counter is back at zero after each."""
    wgmma = gemm.wgmma_on(torch.device("cuda"))
    assert launch.gemm_config(m, g, N, HPG * DH, 128, wgmma=wgmma).split_k > 1
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, HPG * DH, seed)
    ref = gemm_oracle(x, w, xs, ws)
    first = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    err = relerr(first, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"
    runs = [launch.batched_gemm_a8w8_mxscale(x, w, xs, ws) for _ in range(20)]
    _check_same_bits_elsewhere(first, runs, (x, w, xs, ws), seed)


@gpu
def test_gpu_split_k_captured_before_any_eager_launch_runs_unsplit(monkeypatch, caplog):
    """A split GEMM first met inside a CUDA-graph capture has no counters yet: it runs unsplit
    (correct, logged once) rather than allocating and zeroing them inside the graph."""
    monkeypatch.setattr(split_k, "COUNTER_POOLS", {})
    monkeypatch.setattr(split_k, "_FALLBACK_LOGGED", set())
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(16, 2, N, HPG * DH, seed)
    y = torch.full((16, 2, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y,
                                     config=launch.GemmConfig(16, 64, swap_ab=True))  # compile
    monkeypatch.setattr(split_k, "COUNTER_POOLS", {})
    graph = torch.cuda.CUDAGraph()
    with caplog.at_level(logging.WARNING, logger="woa"), capture(graph):
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y,
                                         config=launch.GemmConfig(16, 64, 8, swap_ab=True))
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert any("run once before capturing" in r.getMessage() for r in caplog.records)
    ref = gemm_oracle(x, w, xs, ws)
    err = relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"


@gpu
@pytest.mark.parametrize("m", (1, 64, 1000, 8192))
def test_gpu_gemm_fp32_out_from_transposed_x(m):
    seed = new_seed()
    g, k = 8, HPG * DH
    x, w, xs, ws = gemm_inputs(m, g, N, k, seed)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # [M, G, K] view of a [G, M, K] buffer
    y = torch.full((m, g, N), float("nan"), dtype=torch.float32, device="cuda")
    launch.batched_gemm_a8w8_mxscale(xt, w, xs, ws, dtype=torch.float32, out=y)
    ref = gemm_oracle(x, w, xs, ws)
    err = relerr(y, ref)
    assert err <= FP32_OUT_ON_GPU, f"seed {seed}: relerr {err:.3g}"


@gpu
@pytest.mark.parametrize("m", (1, 64, 1000, 8192))
def test_gpu_gemm_v41_32x32_blocks(m):
    """DeepSeek V4.1: 32 x 32 weight blocks with 1 x 32 activation groups."""
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, 8, N, HPG * DH, seed, block=32)
    y = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    ref = gemm_oracle(x, w, xs, ws)
    err = relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"


# The Hopper wgmma GEMM kernel at explicit launch shapes.


@gpu
@pytest.mark.parametrize("cfg", ((128, 4, 1), (128, 5, 0), (64, 4, 2), (64, 6, 0)),
                         ids=lambda c: f"m{c[0]}st{c[1]}p{c[2]}")
@pytest.mark.parametrize("m,g,dtype,k", ((33, 8, torch.bfloat16, HPG * DH),
                                         (65, 16, torch.bfloat16, HPG * DH),
                                         (1000, 2, torch.float32, HPG * DH),
                                         (8192, 16, torch.bfloat16, HPG * DH),
                                         (300, 3, torch.bfloat16, 31 * 128),
                                         (200, 4, torch.bfloat16, 128)))
def test_gpu_gemm_wgmma_kernel(m, g, dtype, k, cfg):
    """The wgmma kernel itself (explicit config; ragged M tiles, and decode-size M below one
    tile, clip on the TMA store; persistent programs carry the K pipeline across tiles; an odd
    number of K blocks ends on the other register set, and one K block leaves the unrolled loop
    empty)."""
    _check_wgmma(m, g, dtype, k, launch.GemmConfig(
        cfg[0], 128, num_warps=cfg[0] // 16, num_stages=cfg[1], wgmma=True,
        programs_per_sm=cfg[2]))


@gpu
@pytest.mark.parametrize("m,g,dtype,k,tile", ((1024, 16, torch.bfloat16, HPG * DH, None),
                                              (300, 4, torch.bfloat16, 31 * 128, None),
                                              (200, 4, torch.float32, 128, None),
                                              (8192, 2, torch.bfloat16, HPG * DH, None),
                                              (128, 2, torch.bfloat16, HPG * DH, None),
                                              (256, 2, torch.float32, HPG * DH, None),
                                              (64, 16, torch.bfloat16, HPG * DH, None),
                                              (64, 2, torch.bfloat16, HPG * DH, None),
                                              (100, 4, torch.bfloat16, 31 * 128, (64, 64, 10))))
def test_gpu_gemm_warp_specialized_gives_the_wgmma_kernels_bits(m, g, dtype, k, tile):
    """Persistent tiles run the warp-specialized kernel (``wgmma_ws_kernels``); the plain wgmma
    kernel at the same launch gives the same bits: the rule's 128 x 128 tile (ragged tiles, an
    odd K-block count, one K block with its two-stage ring, fp32 output), its 64-token tiles 16,
    32, 64 and 128 weight rows wide, and ``tile`` (``(block_m, block_n, stages)``, ragged M)."""
    from torch_bridge.backends.triton import configs, wgmma_kernels, wgmma_ws_kernels

    cfg = launch.gemm_config(m, g, N, k, 128, wgmma=True)
    if tile is not None:
        cfg = launch.GemmConfig(tile[0], tile[1], num_warps=tile[0] // 16, num_stages=tile[2],
                                wgmma=True, programs_per_sm=1)
    elif k != HPG * DH:  # the rule's tile at a K it does not see in V4
        cfg = launch.GemmConfig(128, 128, num_warps=8, num_stages=5, wgmma=True,
                                programs_per_sm=1)
    assert configs.warp_specialized(cfg), cfg
    (x, w, xs, ws), y, seed = _check_wgmma(m, g, dtype, k, cfg)
    run, _ = gemm._gemm_launch(x, w, xs, ws, y, gemm._fields(cfg))
    assert run.plan.kernel is wgmma_ws_kernels.batched_gemm_a8w8_mxscale_wgmma_ws_kernel
    plain = _common.Launch(dataclasses.replace(
        run.plan, kernel=wgmma_kernels.batched_gemm_a8w8_mxscale_wgmma_kernel,
        constexprs={c: v for c, v in run.plan.constexprs.items() if c != "PRODUCER_NUM_REGS"}),
        run.extra)
    y_plain = torch.full_like(y, float("nan"))
    plain(gemm._gemm_launch(x, w, xs, ws, y_plain, gemm._fields(cfg))[1])
    torch.cuda.synchronize()
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    bad = int((y.view(bits) != y_plain.view(bits)).sum())
    assert bad == 0, f"seed {seed}: {bad} of {y.numel()} outputs differ"


def _check_wgmma(m, g, dtype, k, config):
    """Run the wgmma kernel at ``config`` on fresh inputs, check it against the oracle and
    return ``(inputs, output, seed)``."""
    ok, why = launch.wgmma_available(torch.cuda.current_device())
    if not ok:
        pytest.skip(why)
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, k, seed)
    y = torch.full((m, g, N), float("nan"), dtype=dtype, device="cuda")
    launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=dtype, out=y, config=config)
    ref = gemm_oracle(x, w, xs, ws)
    err = relerr(y, ref)
    tol = TOLERANCES["gemm_bf16"].rel if dtype == torch.bfloat16 else FP32_OUT_ON_GPU
    assert err <= tol, f"seed {seed}: relerr {err:.3g}"
    return (x, w, xs, ws), y, seed


@gpu
@pytest.mark.parametrize("cfg", ((8, 64, 8, 0), (16, 64, 6, 0), (16, 128, 6, 1), (32, 128, 6, 0)),
                         ids=lambda c: f"t{c[0]}n{c[1]}st{c[2]}p{c[3]}")
@pytest.mark.parametrize("m,g,dtype,k", ((1, 16, torch.bfloat16, HPG * DH),
                                         (5, 8, torch.float32, HPG * DH),
                                         (16, 2, torch.bfloat16, 31 * 128),
                                         (40, 3, torch.bfloat16, 128)))
def test_gpu_gemm_wgmma_swapped_kernel(m, g, dtype, k, cfg):
    """The wgmma kernel's swapped decode tile (tokens on the MMA's N side): fewer tokens than
    the tile (the TMA load zero-fills, the store clips), several token tiles (walked by
    persistent programs too), odd and single K block counts, fp32 output. Within the oracle's
    tolerance, and bit-equal to the pointer kernel's swapped tile, which promotes the same
    K blocks in the same order."""
    (x, w, xs, ws), y, seed = _check_wgmma(m, g, dtype, k, launch.GemmConfig(
        cfg[0], cfg[1], swap_ab=True, num_warps=4, num_stages=cfg[2], wgmma=True,
        programs_per_sm=cfg[3]))
    pointer = launch.batched_gemm_a8w8_mxscale(
        x, w, xs, ws, dtype=dtype, config=launch.GemmConfig(16, 64, swap_ab=True))
    assert torch.equal(y, pointer), f"seed {seed}"


@gpu
@pytest.mark.parametrize("split", (2, 4, 8))
@pytest.mark.parametrize("m,g", [(m, g) for g in (2, 4, 16) for m in (1, 16, 64, 256)])
def test_gpu_gemm_wgmma_split_k(m, g, split):
    """The wgmma kernel split K ways against its unsplit self on the same tile: the fp32 parts
    are added in another order, so close (the oracle's tolerance), not bit-equal; two launches
    and a CUDA-graph replay give the same bits, whatever order the parts arrive in, and every
    tile counter is back at zero."""
    tile = launch.GemmConfig(64, 64, num_warps=4, num_stages=8, wgmma=True)
    if m <= 16:  # the swapped decode tile
        tile = launch.GemmConfig(16, 64, swap_ab=True, num_warps=4, num_stages=8, wgmma=True)
    (x, w, xs, ws), unsplit, seed = _check_wgmma(m, g, torch.bfloat16, HPG * DH, tile)
    config = dataclasses.replace(tile, split_k=split)
    first = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, config=config)
    err = relerr(first, unsplit.float())
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"
    again = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, config=config)
    y = torch.full_like(first, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y, config=config)
    graph.replay()
    torch.cuda.synchronize()
    for i, r in enumerate((again, y)):
        assert torch.equal(r.view(torch.int16), first.view(torch.int16)), f"seed {seed}: run {i}"
    assert int(split_k.COUNTER_POOLS[x.device].counters.count_nonzero()) == 0


@gpu
@pytest.mark.parametrize(("g", "m"), [(2, 1), (2, 16), (1, 17), (1, 40), (1, 64)])
def test_gpu_gemm_default_wgmma_split_bits_never_depend_on_timing(g, m):
    """The default decode shapes of few tiles (G = 2 up to 16 tokens on the swapped tile, G = 1
    up to 64 on 64 x 64 tiles) are the wgmma kernel split K ways: eager launches, the bound
    direct launch, a launch on another stream and a CUDA-graph replay give one set of bits,
    within the oracle's tolerance."""
    ok, why = launch.wgmma_available(torch.cuda.current_device())
    if not ok:
        pytest.skip(why)
    cfg = launch.gemm_config(m, g, N, HPG * DH, 128, wgmma=True)
    assert cfg.wgmma and cfg.split_k > 1, cfg
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, HPG * DH, seed)
    first = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    err = relerr(first, gemm_oracle(x, w, xs, ws))
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"
    runs = [launch.batched_gemm_a8w8_mxscale(x, w, xs, ws) for _ in range(10)]
    go = gemm.eager_gemm(x, w, xs, ws, torch.bfloat16)
    assert isinstance(go, gemm.WgmmaBound)
    runs += [go(x, w, xs, ws) for _ in range(3)]

    def refused_on_the_side_stream():
        assert go(x, w, xs, ws) is None  # its scratch is the other stream's

    _check_same_bits_elsewhere(first, runs, (x, w, xs, ws), seed, refused_on_the_side_stream)


@gpu
@pytest.mark.parametrize("programs_per_sm", [0, 1], ids=["plain", "warp_specialized"])
def test_gpu_gemm_wgmma_relaunch_goes_straight_to_the_compiled_kernel(programs_per_sm):
    """After its first launch, a specialization of the wgmma kernel (the plain one, and the
    warp-specialized one its persistent tiles run) launches without Triton's dispatch: M 1024,
    2048 and 1040 share one compiled kernel (M % 16 == 0), M 1000 gets its own, and every
    launch is right with fresh inputs."""
    ok, why = launch.wgmma_available(torch.cuda.current_device())
    if not ok:
        pytest.skip(why)
    config = launch.GemmConfig(128, 128, num_warps=8, num_stages=4, wgmma=True,
                               programs_per_sm=programs_per_sm)
    from torch_bridge.backends.triton import configs, wgmma_kernels, wgmma_ws_kernels

    _common.LAUNCHES.clear()
    for m in (1024, 2048, 1040, 1000, 1000):
        seed = new_seed()
        x, w, xs, ws = gemm_inputs(m, 16, N, HPG * DH, seed)
        y = torch.full((m, 16, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y, config=config)
        ref = gemm_oracle(x, w, xs, ws)
        err = relerr(y, ref)
        assert err <= TOLERANCES["gemm_bf16"].rel, f"M {m}, seed {seed}: relerr {err:.3g}"
    # One launch per M; Triton compiled two specializations (M % 16 == 0 or not).
    kernel = (wgmma_ws_kernels.batched_gemm_a8w8_mxscale_wgmma_ws_kernel
              if configs.warp_specialized(config)
              else wgmma_kernels.batched_gemm_a8w8_mxscale_wgmma_kernel)
    assert configs.warp_specialized(config) == bool(programs_per_sm)
    compiled = {id(c) for run in _common.LAUNCHES.values() if run.kernel is kernel
                for c, _ in run._compiled.values()}
    assert len(compiled) == 2
