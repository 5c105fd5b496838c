"""``wo_a_fp8``, the FP8 chain (quant, then the GEMM; at decode one fused launch,
``wo_a_fp8_kernel``) on the Triton kernels against the ``woa_jax`` oracle.

The fused kernel must give the bits of the two-kernel chain (quant, then the pointer GEMM with
the same tiles) and stay within the bf16 output rounding of the oracle. Interpreter axis: tiny
shapes, CPU under ``TRITON_INTERPRET=1`` (on a GPU machine these run on the GPU). GPU axis
(``pytest -m gpu``): DeepSeek V4 sizes through the public API, the fused decode kernel, CUDA
graphs, ``torch.compile`` and the JAX path. The kernels compiled for sm_90 and AMD:
``test_codegen.py``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import woa_jax
from woa_jax.testing import TOLERANCES, assert_close, to_numpy

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import (  # noqa: E402, F401
    DEVICE,
    DH,
    GROUPS,
    HPG,
    ROPE_TABLES,
    N,
    assert_bytes_equal,
    capture,
    chain_oracle,
    chain_tensors,
    checkpoint,
    checkpoint_tensors,
    count_differing,
    jax_view,
    jx,
    new_seed,
    oracle,
    poisoned,
    quant_oracle,
    relerr,
    rope_inputs,
    rope_tensors,
    xla_memory,
)

from torch_bridge.backends.triton import chain, configs, gemm, launch  # noqa: E402

gpu = pytest.mark.gpu

# ---------------------------------------------------------------------------------------------
# Interpreter axis: tiny shapes
# ---------------------------------------------------------------------------------------------


def test_whole_chain_through_public_api(rng):
    from torch_bridge import WoAProjection

    o, pos, cos, sin = rope_tensors(rng)
    g, n = 2, 128
    weight, scale, _ = checkpoint_tensors(rng, g, n, 1024)
    proj = WoAProjection(weight, scale.view(torch.float8_e8m0fnu), g, cos, sin, backend="triton")
    y = proj(o, pos)
    ref = woa_jax.wo_a_fp8(*jx(o, pos, cos, sin, weight, scale), g, dtype=jnp.float32)
    assert proj.path == "triton"
    assert y.dtype == torch.bfloat16
    assert_close(y, ref, tolerance="gemm_bf16")


def _oracle(o, pos, cos, sin, w, ws, g, block):
    """The oracle's two steps (quant, then GEMM), fp32 out."""
    args = [jnp.asarray(to_numpy(t)) for t in (o, pos, cos, sin)]
    q, sc = woa_jax.inverse_rope_group_quant(*args, g, block)
    return woa_jax.batched_gemm_a8w8_mxscale(q, jnp.asarray(to_numpy(w)), sc,
                                             jnp.asarray(to_numpy(ws)), dtype=jnp.float32)


def _bits(y: torch.Tensor) -> np.ndarray:
    return to_numpy(y.view(torch.int16) if y.dtype == torch.bfloat16 else y.view(torch.int32))


@pytest.mark.parametrize("s,block,rope_dtype,pos_dtype", [
    (1, 128, torch.bfloat16, torch.int64),
    (3, 128, torch.float32, torch.int32),  # QUANT_M = 4 rows tiled up to the MMA's 16
    (16, 128, torch.bfloat16, torch.int32),
    (5, 32, torch.bfloat16, torch.int64),  # V4.1: 1 x 32 groups, 32 x 32 weight blocks
    (20, 64, torch.float32, torch.int64),  # two M tiles of 16 rows
])
def test_fused_gives_the_two_kernel_bits(rng, s, block, rope_dtype, pos_dtype):
    o, pos, cos, sin, w, ws = chain_tensors(rng, s, block=block, rope_dtype=rope_dtype,
                                            pos_dtype=pos_dtype)
    cfg = launch.GemmConfig(16, 64, swap_ab=True)
    y = torch.full((s, 2, 128), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    assert launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, out=y, single_kernel=True, config=cfg) is y
    two = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, single_kernel=False, config=cfg)
    np.testing.assert_array_equal(_bits(y), _bits(two))
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 2, block), tolerance="gemm_bf16")


def test_fused_groups_that_start_inside_a_head(rng):
    """G = 4 groups over H = 2 heads: group 1 is the second half of head 0, so its last block
    holds that head's rope tail; the prologue must find it from the lane's place in the head."""
    o, pos, cos, sin, w, ws = chain_tensors(rng, 3, g=4, h=2)
    cfg = launch.GemmConfig(16, 64, swap_ab=True)
    y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 4, single_kernel=True, config=cfg)
    two = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 4, single_kernel=False, config=cfg)
    np.testing.assert_array_equal(_bits(y), _bits(two))
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 4, 128), tolerance="gemm_bf16")


def test_fused_split_k_fp32_out_padded_tokens_and_clamped_positions(rng):
    """Split-K (parts reduced in the kernel), an fp32 ``out``, ``o`` with a padded token
    stride and positions outside ``[0, P)`` (clamped, as AITER does)."""
    o, pos, cos, sin, w, ws = chain_tensors(rng, 4)
    padded = torch.zeros((4, 4, 640), dtype=o.dtype, device=DEVICE)[:, :, :512]
    padded.copy_(o)
    pos = torch.tensor([-5, 0, 63, 1000], dtype=torch.int64, device=DEVICE)
    cfg = launch.GemmConfig(16, 64, split_k=2, swap_ab=True)
    ref = _oracle(o, pos, cos, sin, w, ws, 2, 128)
    y32 = launch.wo_a_fp8(padded, pos, cos, sin, w, ws, 2, dtype=torch.float32, single_kernel=True,
                          config=cfg)
    assert y32.dtype == torch.float32
    assert_close(y32, ref, tolerance="gemm_fp32")
    y = launch.wo_a_fp8(padded, pos, cos, sin, w, ws, 2, single_kernel=True, config=cfg)
    assert y.dtype == torch.bfloat16
    assert_close(y, ref, tolerance="gemm_bf16")


def test_default_fuses_where_the_prologue_is_one_step(rng, monkeypatch):
    """``single_kernel=None`` runs the one-kernel chain when each program quantizes at most 4096
    activations first (DeepSeek V4 on a CPU: M = 1 at G = 16, M <= 8 at G = 2), quant + GEMM
    otherwise; the public ``WoAProjection`` takes the same road."""
    from torch_bridge import WoAProjection

    calls = []
    for module, name in ((chain, "_wo_a_fp8_op"), (gemm, "_batched_gemm_a8w8_mxscale_op")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, real=real, name=name: (calls.append(name), real(*a)))
    # K = 1024 in 8 blocks, split 8 ways: one prologue step up to 32 tokens.
    for s, want in ((1, ["_wo_a_fp8_op"]), (32, ["_wo_a_fp8_op"]),
                    (33, ["_batched_gemm_a8w8_mxscale_op"])):
        calls.clear()
        o, pos, cos, sin, w, ws = chain_tensors(rng, s)
        y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2)
        assert calls == want, s
        assert_close(y, _oracle(o, pos, cos, sin, w, ws, 2, 128), tolerance="gemm_bf16")
    calls.clear()
    o, pos, cos, sin, w, ws = chain_tensors(rng, 2)
    proj = WoAProjection(w.flatten(0, 1), ws.flatten(0, 1).view(torch.float8_e8m0fnu), 2, cos,
                         sin, backend="triton")
    y = proj(o, pos)
    assert calls == ["_wo_a_fp8_op"] and proj.path == "triton"
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 2, 128), tolerance="gemm_bf16")


def test_fused_split_k_is_the_same_in_deterministic_mode(rng, monkeypatch):
    """Split-K parts are added in K order in the kernel: deterministic mode keeps the split."""
    seen = []
    real = chain._wo_a_fp8_op
    monkeypatch.setattr(chain, "_wo_a_fp8_op", lambda *a: (seen.append(a[12]), real(*a)))
    o, pos, cos, sin, w, ws = chain_tensors(rng, 1, g=1, h=2)
    split = launch.wo_a_fp8_config(1, 1, 128, 1024, 128).split_k
    assert split > 1
    y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 1)
    torch.use_deterministic_algorithms(True)
    try:
        again = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 1)
    finally:
        torch.use_deterministic_algorithms(False)
    assert seen == [split, split]
    np.testing.assert_array_equal(_bits(y), _bits(again))
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 1, 128), tolerance="gemm_bf16")


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_groups=3), "num_groups = 3"),
    (dict(single_kernel=True, config=launch.GemmConfig(16, 64, tma=True, swap_ab=True)),
     "take swapped tiles, one per program"),
    (dict(single_kernel=True, config=launch.GemmConfig(16, 64)),
     "take swapped tiles, one per program"),
    (dict(single_kernel=True, config=launch.GemmConfig(16, 64, split_k=3, swap_ab=True)),
     "split_k=3 does not divide"),
    (dict(out="short"), r"out must be \[M, G, N\] = \[2, 2, 128\]"),
])
def test_bad_chain_arguments_raise(rng, kwargs, match):
    o, pos, cos, sin, w, ws = chain_tensors(rng, 2)
    g = kwargs.pop("num_groups", 2)
    if kwargs.get("out") == "short":
        kwargs["out"] = torch.empty((1, 2, 128), dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, **kwargs)


@pytest.mark.skipif(DEVICE != "cpu", reason="a CPU tensor's refusal")
def test_fused_wgmma_config_refuses_a_cpu_tensor(rng):
    """The fused wgmma kernel is Hopper's: asked for on a CPU tensor, it raises and says so."""
    o, pos, cos, sin, w, ws = chain_tensors(rng, 2)
    cfg = launch.GemmConfig(8, 64, swap_ab=True, wgmma=True)
    with pytest.raises(ValueError, match="fused wgmma kernel cannot run here: it needs a CUDA "
                                         "Hopper GPU, o is on cpu"):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, single_kernel=True, config=cfg)


def test_fused_true_refuses_a_head_dim_the_block_does_not_divide(rng):
    """Dh = 96 with 64-wide scale blocks: a block would straddle two heads' rope tails."""
    o, pos, cos, sin, w, ws = chain_tensors(rng, 2, g=1, h=4, dh=96, rd=32, n=64, block=64)
    with pytest.raises(ValueError, match="head_dim 96 is not a multiple of the scale block 64"):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, 1, single_kernel=True)
    y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 1)  # the default runs the two kernels
    assert_close(y, _oracle(o, pos, cos, sin, w, ws, 1, 64), tolerance="gemm_bf16")


def test_fused_op_is_opaque_to_torch_compile(rng):
    """Fake implementation, version counter of ``out``, and a graph-break-free trace."""
    o, pos, cos, sin, w, ws = chain_tensors(rng, 2)
    y = torch.empty((2, 2, 128), dtype=torch.bfloat16, device=DEVICE)
    xq = torch.empty((2, 2, 1024), dtype=torch.float8_e4m3fn, device=DEVICE)
    xs = torch.empty((2, 2, 8), dtype=torch.uint8, device=DEVICE)
    torch.library.opcheck(torch.ops.woa_triton.wo_a_fp8.default,
                          (o, pos, cos, sin, w, ws, xq, xs, y, 1e-8, 16, 64, 1, 4, 3, False, False),
                          test_utils=("test_faketensor",))
    v = y._version
    launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, out=y)
    assert y._version == v + 1
    compiled = torch.compile(lambda o: launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2),
                             backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(o), y)


@pytest.mark.parametrize("fused", [None, True, False])
def test_zero_tokens(rng, fused):
    """An empty batch (a rank with no tokens) gives an empty output, fused or not."""
    o, pos, cos, sin, w, ws = chain_tensors(rng, 0)
    y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, single_kernel=fused)
    assert y.shape == (0, 2, 128) and y.dtype == torch.bfloat16
    x = torch.empty((0, 2, 1024), dtype=w.dtype, device=DEVICE)
    xs = torch.empty((0, 2, 8), dtype=torch.uint8, device=DEVICE)
    assert launch.batched_gemm_a8w8_mxscale(x, w, xs, ws).shape == (0, 2, 128)


# ---------------------------------------------------------------------------------------------
# GPU axis: DeepSeek V4 sizes
# ---------------------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("s", (1, 128, 4096))
def test_gpu_whole_chain_public_api_and_bf16_chain(s):
    seed, g = new_seed(), 16
    o, pos, cos, sin = rope_inputs(s, g, seed)
    weight, scale = checkpoint(g, seed)
    ref = chain_oracle(o, pos, cos, sin, weight, scale, g)
    from torch_bridge import WoAProjection

    proj = WoAProjection(weight, scale.view(torch.float8_e8m0fnu), g, cos, sin, backend="triton")
    y = proj(o, pos)
    assert proj.path == "triton"
    assert relerr(y, ref) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}"
    cos32, sin32 = cos.float(), sin.float()
    ref16 = oracle("wo_a_bf16")(*map(jax_view, (o, pos, cos32, sin32, weight, scale)), g)
    w_bf16 = woa_jax.dequant_wo_a_weight(jax_view(weight), jax_view(scale), g)
    from torch_bridge import interop

    y16 = launch.wo_a_bf16(o, pos, cos32, sin32, interop.to_torch(w_bf16), g)
    assert relerr(y16, ref16) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}"


@gpu
@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("s", (1, 7, 16, 64))
def test_gpu_fused_decode_chain(s, g):
    """The one-kernel chain at its default shape against the oracle, and bit for bit against
    the two-kernel chain with the same tiles (without split-K, whose atomics reorder sums)."""
    seed = new_seed()
    o, pos, cos, sin = rope_inputs(s, g, seed, pos_dtype=torch.int32 if s % 2 else torch.int64)
    weight, scale = checkpoint(g, seed)
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    ref = chain_oracle(o, pos, cos, sin, weight, scale, g)
    y = torch.full((s, g, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, out=y, single_kernel=True)
    err = relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"
    cfg = dataclasses.replace(launch.wo_a_fp8_config(s, g, N, HPG * DH, 128), split_k=1)
    one = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=True, config=cfg)
    two = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=False, config=cfg)
    bad = int((one.view(torch.int16) != two.view(torch.int16)).sum())
    assert bad == 0, f"seed {seed}: {bad} of {one.numel()} outputs differ from the two kernels"


@gpu
@pytest.mark.parametrize("s,g", ((12, 2), (16, 2), (16, 4), (17, 2), (64, 2), (256, 2), (64, 4),
                                 (128, 4), (64, 8), (16, 16), (64, 16), (256, 16), (1024, 4)))
def test_gpu_chain_with_a_dependent_gemm_gives_the_plain_launches_bits(s, g):
    """Where the unfused chain launches its wgmma GEMM as the quant's programmatic dependent
    (weight tiles requested before the quant has finished), its bits are those of the quant
    and the GEMM launched plainly, eager and replayed from a CUDA graph on new values."""
    from torch_bridge.backends.triton import _common

    seed = new_seed()
    o, pos, cos, sin = rope_inputs(s, g, seed)
    weight, scale = checkpoint(g, seed)
    k = HPG * DH
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    expected = _common.pdl_capable(0) and gemm.wgmma_chosen(s, g, N, k, 128)
    assert gemm.chain_dependent(s, g, N, k, 128, o.device) == expected
    chained = gemm.default_config(s, g, N, k, 128, o.device, True)
    assert chained.pdl == expected

    def plain():
        x, xs = launch.inverse_rope_group_quant(
            o, pos, cos, sin, g, 128, x_fp8=torch.empty((s, g, k), dtype=w.dtype, device="cuda"),
            config=configs.quant_config(s))
        return launch.batched_gemm_a8w8_mxscale(x, w, xs, ws,
                                                config=dataclasses.replace(chained, pdl=False))

    y = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=False)
    bad = int((y.view(torch.int16) != plain().view(torch.int16)).sum())
    assert bad == 0, f"seed {seed}: {bad} of {y.numel()} outputs differ"
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=False, out=y)
    for step in range(3):
        o2, pos2, _, _ = rope_inputs(s, g, seed + 1 + step)
        o.copy_(o2)
        pos.copy_(pos2)
        graph.replay()
        torch.cuda.synchronize()
        bad = int((y.view(torch.int16) != plain().view(torch.int16)).sum())
        assert bad == 0, f"seed {seed}, replay {step}: {bad} of {y.numel()} outputs differ"


@gpu
@pytest.mark.parametrize("s,g", ((1, 4), (1, 16)))  # (1, 4): split-K, its buffer in the pool
def test_gpu_fused_chain_cuda_graph_and_torch_compile(s, g):
    from torch_bridge.backends.triton import gemm

    assert launch.wo_a_fp8_chosen(s, g, N, HPG * DH, 128, dependent=gemm.chain_dependent(
        s, g, N, HPG * DH, 128, torch.device("cuda")))

    o, pos, cos, sin = rope_inputs(s, g, new_seed(), pos_dtype=torch.int32)
    weight, scale = checkpoint(g, new_seed())
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    y = torch.empty((s, g, N), dtype=torch.bfloat16, device="cuda")
    launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, out=y)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()  # split-K (G = 4): the fp32 parts come from the pool
    with capture(graph):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, out=y)
    o2, pos2, _, _ = rope_inputs(s, g, new_seed(), pos_dtype=torch.int32)
    o.copy_(o2)
    pos.copy_(pos2)
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    got = y.clone()
    want = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g)
    assert torch.equal(got, want)  # split-K too: its parts are added in K order
    compiled = torch.compile(lambda o, pos: launch.wo_a_fp8(o, pos, cos, sin, w, ws, g),
                             fullgraph=True)
    assert torch.equal(compiled(o, pos), want)

    ref = chain_oracle(o, pos, cos, sin, weight, scale, g)
    assert relerr(got, ref) <= TOLERANCES["gemm_bf16"].rel


@gpu
@pytest.mark.parametrize("s", (1, 64, 8192))
def test_gpu_jax_jit_path(s):
    import jax

    from torch_bridge import jax_ops

    seed, g = new_seed(), 16
    o, pos, cos, sin = rope_inputs(s, g, seed)
    weight, scale = checkpoint(g, seed)
    args = [jax_view(t) for t in (o, pos, cos, sin)]
    w, ws = woa_jax.wo_a_weight_e8m0(jax_view(weight), jax_view(scale), g)
    q, sc = jax.jit(lambda *a: jax_ops.inverse_rope_group_quant(*a, g, 128))(*args)
    rq, rs = oracle("inverse_rope_group_quant")(*args, g, 128)
    assert_bytes_equal(q, rq, "fp8", seed)
    assert_bytes_equal(sc, rs, "scale", seed)
    ref = chain_oracle(o, pos, cos, sin, weight, scale, g)
    for cb in (None, False, True):  # None: WOA_JAX_COMMAND_BUFFER's default (on where safe)
        fn = jax.jit(lambda *a, cb=cb: jax_ops.wo_a_fp8(*a, g, command_buffer=cb))
        y = fn(*args, w, ws)
        assert y.dtype == jnp.bfloat16
        assert relerr(y, ref) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}, command_buffer={cb}"
        # a second input through the same executable (a command-buffer replay must see it)
        o2, pos2, _, _ = rope_inputs(s, g, seed + 1)
        args2 = [jax_view(o2), jax_view(pos2), *args[2:]]
        ref2 = chain_oracle(o2, pos2, cos, sin, weight, scale, g)
        y2 = fn(*args2, w, ws)
        assert relerr(y2, ref2) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}, replay cb={cb}"


# On Hopper every GEMM here the wgmma kernel's: the swapped tile at 4, 64- and 128-row tiles above.
@gpu
@pytest.mark.parametrize("s", (4, 64, 256))
def test_gpu_cuda_graph_and_torch_compile(s):
    g = 16
    o, pos, cos, sin = rope_inputs(s, g, new_seed(), pos_dtype=torch.int32)
    weight, scale = checkpoint(g, new_seed())
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    xq, xs = poisoned(s, g, HPG * DH)
    y = torch.empty((s, g, N), dtype=torch.bfloat16, device="cuda")

    def chain():
        launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128, x_fp8=xq, x_scale=xs)
        launch.batched_gemm_a8w8_mxscale(xq, w, xs, ws, out=y)

    chain()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        chain()
    o2, pos2, _, _ = rope_inputs(s, g, new_seed(), pos_dtype=torch.int32)
    o.copy_(o2)
    pos.copy_(pos2)
    graph.replay()
    torch.cuda.synchronize()
    got = (xq.view(torch.uint8).clone(), xs.clone(), y.clone())
    chain()
    torch.cuda.synchronize()
    assert torch.equal(got[0], xq.view(torch.uint8)) and torch.equal(got[1], xs)
    assert torch.equal(got[2], y)

    @torch.compile(fullgraph=True)
    def compiled(o, pos):
        q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
        return launch.batched_gemm_a8w8_mxscale(q, w, sc, ws)

    assert torch.equal(compiled(o, pos), y)


@gpu
@pytest.mark.parametrize("table,rope_dtype", ROPE_TABLES)
@pytest.mark.parametrize("s,g", ((1, 16), (1, 2), (8, 2), (64, 16), (1024, 2)))
def test_gpu_fused_chain_prologue_bytes_are_the_oracles(s, g, table, rope_dtype):
    """The fused kernel's quantized activations are the oracle's, and its output the two-kernel
    chain's bits with the same tiles (the rotation's rounding leaves the GEMM alone)."""
    seed = new_seed()
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=rope_dtype, table=table)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k = HPG * DH
    w = (torch.randn((g, N, k), generator=gen, device="cuda") * 64).to(torch.float8_e4m3fn)
    ws = torch.randint(118, 124, (g, N // 128, k // 128), generator=gen, device="cuda",
                       dtype=torch.uint8)
    cfg = dataclasses.replace(configs.wo_a_fp8_config(s, g, N, k, 128), split_k=1)
    x_fp8 = torch.empty((s, g, k), dtype=torch.float8_e4m3fn, device="cuda")
    x_scale = torch.empty((s, g, k // 128), dtype=torch.uint8, device="cuda")
    out = torch.empty((s, g, N), dtype=torch.bfloat16, device="cuda")
    chain._wo_a_fp8_op.launch_fn(
        o, pos, cos, sin, w, ws, x_fp8, x_scale, out, 1e-8, cfg.block_m, cfg.block_n, 1,
        cfg.num_warps, cfg.num_stages, False, False)
    rq, rs = quant_oracle(o, pos, cos, sin, g)
    assert count_differing(x_scale, rs) == 0, f"seed {seed}: scale bytes differ"
    bad = count_differing(x_fp8, rq)
    assert bad == 0, f"seed {seed}: {bad} of {x_fp8.numel()} fp8 bytes differ from the oracle"
    two = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=False, config=cfg)
    assert count_differing(out, two) == 0, (
        f"seed {seed}: the fused GEMM differs from the two kernels")


def _wgmma_fused_shapes():
    """Swapped wgmma tiles of the fused kernel: 8 to 32 tokens, 64 or 128 weight rows, K split
    1 to 8 ways, plain and as a programmatic dependent."""
    C = configs.GemmConfig
    return [C(8, 64, 4, True, 4, 8, wgmma=True), C(8, 64, 4, True, 4, 8, wgmma=True, pdl=True),
            C(8, 128, 8, True, 4, 8, wgmma=True), C(16, 64, 1, True, 4, 6, wgmma=True),
            C(16, 64, 2, True, 4, 8, wgmma=True), C(32, 64, 4, True, 4, 8, wgmma=True),
            C(32, 128, 2, True, 8, 8, wgmma=True)]


@gpu
@pytest.mark.parametrize("cfg", _wgmma_fused_shapes(), ids=lambda c: c.label())
@pytest.mark.parametrize("s,g,table,rope_dtype", ((1, 2, *ROPE_TABLES[0]),
                                                  (5, 4, *ROPE_TABLES[3]),
                                                  (33, 16, *ROPE_TABLES[1])))
def test_gpu_fused_wgmma_chain_is_the_quant_then_the_wgmma_gemm(s, g, table, rope_dtype, cfg):
    """The fused wgmma kernel's scale bytes are the oracle's, and its output the bits of the
    quant followed by the wgmma GEMM with the same tile and K split (the parts are added in K
    order either way): its activations, kept in shared memory, are the quant's. Tiles wider
    than the tokens leave the rest unstored."""
    if not gemm.wgmma_available(0)[0]:
        pytest.skip(gemm.wgmma_available(0)[1])
    seed = new_seed()
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=rope_dtype, table=table)
    weight, scale = checkpoint(g, seed)
    k = HPG * DH
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    x_fp8 = torch.empty((s, g, k), dtype=torch.float8_e4m3fn, device="cuda")
    x_scale = torch.empty((s, g, k // 128), dtype=torch.uint8, device="cuda")
    out = torch.full((s, g, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    chain._wo_a_fp8_op.launch_fn(
        o, pos, cos, sin, w, ws.view(torch.uint8), x_fp8, x_scale, out, 1e-8, cfg.block_m,
        cfg.block_n, cfg.split_k, cfg.num_warps, cfg.num_stages, True, cfg.pdl)
    _, rs = quant_oracle(o, pos, cos, sin, g)
    assert count_differing(x_scale, rs) == 0, f"seed {seed}: scale bytes differ"
    two = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, single_kernel=False,
                          config=dataclasses.replace(cfg, pdl=False))
    assert count_differing(out, two) == 0, (
        f"seed {seed}: the fused wgmma chain differs from the quant and the wgmma GEMM")
    err = relerr(out, chain_oracle(o, pos, cos, sin, weight, scale, g))
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"


@gpu
def test_gpu_fused_wgmma_chain_refuses_an_output_tma_cannot_view():
    """Rows of ``out`` that are not packed ``[G * N]`` cannot be a TMA view: a clear error,
    before any launch."""
    if not gemm.wgmma_available(0)[0]:
        pytest.skip(gemm.wgmma_available(0)[1])
    seed = new_seed()
    o, pos, cos, sin = rope_inputs(1, 2, seed)
    weight, scale = checkpoint(2, seed)
    w, ws = weight.view(2, N, -1), scale.view(2, N // 128, -1)
    out = torch.empty((1, 2, N + 64), dtype=torch.bfloat16, device="cuda")[..., :N]
    with pytest.raises(ValueError, match="through TMA"):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, out=out, single_kernel=True,
                        config=_wgmma_fused_shapes()[0])
