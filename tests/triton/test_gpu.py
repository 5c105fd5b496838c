"""Triton backend on a GPU (``pytest -m gpu``): DeepSeek V4 shapes against the ``woa_jax`` oracle.

Every case draws fresh random inputs (seeded from the OS, printed on failure), poisons the
outputs before the launch and checks that every element was written; NaN never passes (a NaN
output makes the relative error infinite, a NaN fp8 byte differs from the oracle's).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.gpu

GROUPS = (1, 2, 8, 16)
TOKENS = (1, 7, 64, 128, 1000, 4096, 8192)
HPG, DH, RD, N, P = 8, 512, 64, 1024, 65536
FP8_POISON = 0x7F  # e4m3fn NaN: the kernel never writes it for finite inputs
SCALE_POISON = 0  # never written: finite groups give bytes >= 92


@pytest.fixture(autouse=True)
def _xla_memory():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _oracle(name: str):
    """The ``woa_jax`` function ``name`` under ``jax.jit`` (one compile per shape, not per op)."""
    import jax

    import woa_jax

    static = {"inverse_rope_group_quant": (4, 5), "wo_a_fp8": (6,), "wo_a_bf16": (6,),
              "batched_gemm_a8w8_mxscale": ()}[name]
    return jax.jit(getattr(woa_jax, name), static_argnums=static, static_argnames=(
        ("dtype",) if name in ("wo_a_fp8", "batched_gemm_a8w8_mxscale") else ()))


def _chain_oracle(o, pos, cos, sin, weight, scale, g):
    """``woa_jax.wo_a_fp8`` as two jitted steps (quant, then GEMM), fp32 out.

    One jit of the whole ``wo_a_fp8`` on XLA:GPU differed from the eager chain by 2.7e-2
    (relative), as if the fp8 rounding were dropped; each step alone matches the eager oracle.
    """
    import jax.numpy as jnp

    q, sc = _oracle("inverse_rope_group_quant")(_j(o), _j(pos), _j(cos), _j(sin), g, 128)
    w = _j(weight).reshape(g, -1, weight.shape[1])
    ws = _j(scale).reshape(g, -1, scale.shape[1])
    return _oracle("batched_gemm_a8w8_mxscale")(q, w, sc, ws, dtype=jnp.float32)


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _j(t):
    from torch_bridge import interop

    return interop.to_jax(t)


def _np(a):
    from woa_jax.testing import to_numpy

    return to_numpy(a)


def _t(a):
    """A torch view (on the GPU) of a JAX or torch array; 1-byte types as uint8."""
    from torch_bridge import interop

    t = interop.to_torch(a)
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _assert_bytes_equal(actual, expected, what: str, seed: int) -> None:
    a, e = _t(actual), _t(expected)
    bad = int((a != e).sum())
    assert bad == 0, f"seed {seed}: {bad} of {a.numel()} {what} bytes differ from the oracle"


def _rope_inputs(s, g, seed, *, pos_dtype=torch.int64, rope_dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    o = (torch.randn((s, g * HPG, DH), generator=gen, device="cuda") / 10).to(torch.bfloat16)
    pos = torch.randint(0, P, (s,), generator=gen, device="cuda").to(pos_dtype)
    ang = torch.rand((P, RD // 2), generator=gen, device="cuda") * 6.3
    return o, pos, torch.cos(ang).to(rope_dtype), torch.sin(ang).to(rope_dtype)


def _poisoned(s, g, d, gs=128):
    q = torch.full((s, g, d), FP8_POISON, dtype=torch.uint8, device="cuda").view(
        torch.float8_e4m3fn)
    sc = torch.full((s, g, d // gs), SCALE_POISON, dtype=torch.uint8, device="cuda")
    return q, sc


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("s", TOKENS)
def test_quant_bytes_exact(s, g):
    from torch_bridge.backends.triton import launch

    seed = _seed()
    pos_dtype = torch.int32 if (s + g) % 2 else torch.int64
    o, pos, cos, sin = _rope_inputs(s, g, seed, pos_dtype=pos_dtype)
    q, sc = _poisoned(s, g, HPG * DH)
    launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128, x_fp8=q, x_scale=sc)
    rq, rs = _oracle("inverse_rope_group_quant")(_j(o), _j(pos), _j(cos), _j(sin), g, 128)
    assert bool((sc != SCALE_POISON).all()), f"seed {seed}: scale bytes left unwritten"
    _assert_bytes_equal(sc, rs, "scale", seed)
    _assert_bytes_equal(q, rq, "fp8", seed)


def test_quant_fp32_rope_fma_differences_are_rare():
    """With fp32 cos/sin the GPU may contract ``a*c + b*s`` into an FMA (one fp32 ulp apart from the
    oracle's separately rounded products). Against the oracle on XLA:CPU (no contraction), such
    fp8 bytes must be at most 1e-5 of all bytes and each one fp8 step away; scale bytes too must
    differ in at most 1e-5 of the groups."""
    import jax

    import woa_jax
    from torch_bridge.backends.triton import launch

    seed = _seed()
    s, g = 1024, 16
    o, pos, cos, sin = _rope_inputs(s, g, seed, rope_dtype=torch.float32)
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
    cpu = jax.devices("cpu")[0]
    args = [jax.device_put(np.asarray(_np(t)), cpu) for t in (o, pos, cos, sin)]
    with jax.default_device(cpu):
        rq, rs = jax.jit(woa_jax.inverse_rope_group_quant, static_argnums=(4, 5))(*args, g, 128)
    sb, rsb = _t(sc).cpu(), torch.from_numpy(np.array(rs).view(np.uint8))
    qa, qe = _t(q).cpu(), torch.from_numpy(np.array(rq).view(np.uint8))
    scale_diff = int((sb != rsb).sum())
    diff = (qa != qe) & (sb == rsb).repeat_interleave(128, dim=-1)
    frac = int(diff.sum()) / qa.numel()
    da, de = qa[diff].int(), qe[diff].int()
    info = (f"seed {seed}: {int(diff.sum())} of {qa.numel()} fp8 bytes differ ({frac:.2e}), "
            f"{scale_diff} of {sb.numel()} scale bytes; first pairs "
            f"{list(zip(da[:8].tolist(), de[:8].tolist(), strict=True))}")
    print(info)
    assert scale_diff <= 1e-5 * sb.numel(), info
    assert frac <= 1e-5, info
    # e4m3 bytes are monotone in magnitude within a sign: one step is a byte difference of 1.
    assert bool((((da ^ de) & 0x80) == 0).all()), info
    assert bool(((da & 0x7F) - (de & 0x7F)).abs().eq(1).all()), info


def test_quant_clamps_positions_like_aiter():
    from torch_bridge.backends.triton import launch

    o, _, cos, sin = _rope_inputs(6, 2, _seed())
    pos = torch.tensor([-5, 0, P - 1, P, P + 100, 7], device="cuda")
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
    rq, rs = _oracle("inverse_rope_group_quant")(_j(o), _j(pos), _j(cos), _j(sin), 2, 128)
    _assert_bytes_equal(q, rq, "fp8", 0)
    _assert_bytes_equal(sc, rs, "scale", 0)


def _gemm_inputs(m, g, n, k, seed, block=128):
    """AITER-style data: signed randn, each K block scaled by a random power of two."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((m, g, k), generator=gen, device="cuda").mul(40).clamp(-448, 448)
    w = torch.randn((g, n, k), generator=gen, device="cuda").mul(40).clamp(-448, 448)
    xs = torch.randint(123, 132, (m, g, k // block), generator=gen, device="cuda",
                       dtype=torch.int32).to(torch.uint8)
    ws = torch.randint(110, 118, (g, -(-n // block), k // block), generator=gen, device="cuda",
                       dtype=torch.int32).to(torch.uint8)
    return x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), xs, ws


def _relerr(a, e) -> float:
    """Relative Frobenius error in float64 on the GPU; inf when anything is not finite."""
    a, e = _t(a).double(), _t(e).double()
    if not bool(a.isfinite().all()):
        return float("inf")
    return float((a - e).norm() / e.norm())


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("m", TOKENS)
def test_gemm_against_oracle(m, g):
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    seed = _seed()
    x, w, xs, ws = _gemm_inputs(m, g, N, HPG * DH, seed)
    y = torch.full((m, g, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y)
    ref = _oracle("batched_gemm_a8w8_mxscale")(_j(x), _j(w), _j(xs), _j(ws), dtype=jnp.float32)
    err = _relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"


@pytest.mark.parametrize("m", (1, 16, 64, 128))
def test_split_k_gemm_bits_never_depend_on_timing(m):
    """G = 2 decode splits K over up to 8 parts per tile. Whatever order the parts arrive in,
    the kernel adds them in K order: 20 eager launches, a launch on another stream and a CUDA
    graph replay all give the same bits, and every tile counter is back at zero after each."""
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch, split_k
    from woa_jax.testing import TOLERANCES

    g = 2
    assert launch.gemm_config(m, g, N, HPG * DH, 128).split_k > 1
    seed = _seed()
    x, w, xs, ws = _gemm_inputs(m, g, N, HPG * DH, seed)
    ref = _oracle("batched_gemm_a8w8_mxscale")(_j(x), _j(w), _j(xs), _j(ws), dtype=jnp.float32)
    first = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    err = _relerr(first, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"
    runs = [launch.batched_gemm_a8w8_mxscale(x, w, xs, ws) for _ in range(20)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        runs.append(launch.batched_gemm_a8w8_mxscale(x, w, xs, ws))
    torch.cuda.current_stream().wait_stream(side)
    y = torch.empty_like(first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y)
    for _ in range(3):
        y.fill_(float("nan"))
        graph.replay()
        runs.append(y.clone())
    torch.cuda.synchronize()
    for i, r in enumerate(runs):
        assert torch.equal(r.view(torch.int16), first.view(torch.int16)), f"seed {seed}: run {i}"
    assert int(split_k.COUNTER_POOLS[x.device].counters.count_nonzero()) == 0


def test_split_k_captured_before_any_eager_launch_runs_unsplit(monkeypatch, caplog):
    """A split GEMM first met inside a CUDA-graph capture has no counters yet: it runs unsplit
    (correct, logged once) rather than allocating and zeroing them inside the graph."""
    import logging

    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch, split_k
    from woa_jax.testing import TOLERANCES

    monkeypatch.setattr(split_k, "COUNTER_POOLS", {})
    monkeypatch.setattr(split_k, "_FALLBACK_LOGGED", set())
    seed = _seed()
    x, w, xs, ws = _gemm_inputs(16, 2, N, HPG * DH, seed)
    y = torch.full((16, 2, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y,
                                     config=launch.GemmConfig(16, 64, swap_ab=True))  # compile
    monkeypatch.setattr(split_k, "COUNTER_POOLS", {})
    graph = torch.cuda.CUDAGraph()
    with caplog.at_level(logging.WARNING, logger="woa"), torch.cuda.graph(graph):
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y,
                                         config=launch.GemmConfig(16, 64, 8, swap_ab=True))
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert any("run once before capturing" in r.getMessage() for r in caplog.records)
    ref = _oracle("batched_gemm_a8w8_mxscale")(_j(x), _j(w), _j(xs), _j(ws), dtype=jnp.float32)
    err = _relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"


@pytest.mark.parametrize("cfg", ((128, 4, 1), (128, 5, 0), (64, 4, 2), (64, 6, 0)),
                         ids=lambda c: f"m{c[0]}st{c[1]}p{c[2]}")
@pytest.mark.parametrize("m,g,dtype,k", ((33, 8, torch.bfloat16, HPG * DH),
                                         (65, 16, torch.bfloat16, HPG * DH),
                                         (1000, 2, torch.float32, HPG * DH),
                                         (8192, 16, torch.bfloat16, HPG * DH),
                                         (300, 3, torch.bfloat16, 31 * 128),
                                         (200, 4, torch.bfloat16, 128)))
def test_gemm_wgmma_kernel(m, g, dtype, k, cfg):
    """The wgmma kernel itself (explicit config; ragged M tiles, and decode-size M below one
    tile, clip on the TMA store; persistent programs carry the K pipeline across tiles; an odd
    number of K blocks ends on the other register set, and one K block leaves the unrolled loop
    empty)."""
    from torch_bridge.backends.triton import launch

    _check_wgmma(m, g, dtype, k, launch.GemmConfig(
        cfg[0], 128, num_warps=cfg[0] // 16, num_stages=cfg[1], wgmma=True,
        programs_per_sm=cfg[2]))


def _check_wgmma(m, g, dtype, k, config):
    """Run the wgmma kernel at ``config`` on fresh inputs, check it against the oracle and
    return ``(inputs, output, seed)``."""
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    ok, why = launch.wgmma_available(torch.cuda.current_device())
    if not ok:
        pytest.skip(why)
    seed = _seed()
    x, w, xs, ws = _gemm_inputs(m, g, N, k, seed)
    y = torch.full((m, g, N), float("nan"), dtype=dtype, device="cuda")
    launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=dtype, out=y, config=config)
    ref = _oracle("batched_gemm_a8w8_mxscale")(_j(x), _j(w), _j(xs), _j(ws), dtype=jnp.float32)
    err = _relerr(y, ref)
    tol = TOLERANCES["gemm_bf16"].rel if dtype == torch.bfloat16 else FP32_OUT_ON_GPU
    assert err <= tol, f"seed {seed}: relerr {err:.3g}"
    return (x, w, xs, ws), y, seed


@pytest.mark.parametrize("cfg", ((8, 64, 8, 0), (16, 64, 6, 0), (16, 128, 6, 1), (32, 128, 6, 0)),
                         ids=lambda c: f"t{c[0]}n{c[1]}st{c[2]}p{c[3]}")
@pytest.mark.parametrize("m,g,dtype,k", ((1, 16, torch.bfloat16, HPG * DH),
                                         (5, 8, torch.float32, HPG * DH),
                                         (16, 2, torch.bfloat16, 31 * 128),
                                         (40, 3, torch.bfloat16, 128)))
def test_gemm_wgmma_swapped_kernel(m, g, dtype, k, cfg):
    """The wgmma kernel's swapped decode tile (tokens on the MMA's N side): fewer tokens than
    the tile (the TMA load zero-fills, the store clips), several token tiles (walked by
    persistent programs too), odd and single K block counts, fp32 output. Within the oracle's
    tolerance, and bit-equal to the pointer kernel's swapped tile, which promotes the same
    K blocks in the same order."""
    from torch_bridge.backends.triton import launch

    (x, w, xs, ws), y, seed = _check_wgmma(m, g, dtype, k, launch.GemmConfig(
        cfg[0], cfg[1], swap_ab=True, num_warps=4, num_stages=cfg[2], wgmma=True,
        programs_per_sm=cfg[3]))
    pointer = launch.batched_gemm_a8w8_mxscale(
        x, w, xs, ws, dtype=dtype, config=launch.GemmConfig(16, 64, swap_ab=True))
    assert torch.equal(y, pointer), f"seed {seed}"


def test_gemm_wgmma_relaunch_goes_straight_to_the_compiled_kernel():
    """After its first launch, a specialization of the wgmma kernel launches without Triton's
    dispatch: M 1024, 2048 and 1040 share one compiled kernel (M % 16 == 0, same grid), M 1000
    gets its own, and every launch is right with fresh inputs."""
    import jax.numpy as jnp

    from torch_bridge.backends.triton import gemm, launch
    from woa_jax.testing import TOLERANCES

    ok, why = launch.wgmma_available(torch.cuda.current_device())
    if not ok:
        pytest.skip(why)
    config = launch.GemmConfig(128, 128, num_warps=8, num_stages=4, wgmma=True,
                               programs_per_sm=1)
    gemm.COMPILED_WGMMA.clear()
    for m in (1024, 2048, 1040, 1000, 1000):
        seed = _seed()
        x, w, xs, ws = _gemm_inputs(m, 16, N, HPG * DH, seed)
        y = torch.full((m, 16, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y, config=config)
        ref = _oracle("batched_gemm_a8w8_mxscale")(_j(x), _j(w), _j(xs), _j(ws),
                                                   dtype=jnp.float32)
        err = _relerr(y, ref)
        assert err <= TOLERANCES["gemm_bf16"].rel, f"M {m}, seed {seed}: relerr {err:.3g}"
    assert len(gemm.COMPILED_WGMMA) == 2


def test_operands_on_a_gpu_that_is_not_the_current_device():
    """Triton launches on torch's current device; the launchers switch to the operands' GPU
    (and back). Quant, the decode GEMM (split-K at G = 2 included: its counters are cuda:1's)
    and the wgmma GEMM on cuda:1 while cuda:0 is current give the bytes they give on cuda:0
    (all are deterministic)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from torch_bridge.backends.triton import launch

    other = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    seed = _seed()
    rope = _rope_inputs(64, 16, seed)
    here = launch.inverse_rope_group_quant(*rope, 16, 128)
    there = launch.inverse_rope_group_quant(*(t.to(other) for t in rope), 16, 128)
    for a, b in zip(here, there, strict=True):
        assert b.device == other
        assert torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8).cpu()), f"seed {seed}"
    for m, g in ((1, 16), (16, 2), (1024, 16)):
        gemm = _gemm_inputs(m, g, N, HPG * DH, seed)
        y = launch.batched_gemm_a8w8_mxscale(*gemm)
        y_other = launch.batched_gemm_a8w8_mxscale(*(t.to(other) for t in gemm))
        assert torch.equal(y.cpu(), y_other.cpu()), f"M {m}, G {g}, seed {seed}"
    assert torch.cuda.current_device() == 0


def test_first_jax_export_on_a_two_gpu_host():
    """Starting JAX's GPU backend makes its last GPU current; the first ``to_jax`` of a process
    (which starts it) must still export tensors from cuda:0 and cuda:1."""
    import subprocess
    import sys

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    script = ("import torch\n"
              "from torch_bridge import interop\n"
              "for d in (0, 1, 0):\n"
              "    t = torch.arange(6, dtype=torch.bfloat16, device=f'cuda:{d}')\n"
              "    j = interop.to_jax(t)\n"
              "    assert j.tolist() == t.tolist() and j.devices().pop().id == d, (d, j)\n"
              "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


#: fp32 output on Hopper: Triton's fp8 wgmma accumulates each 128-K block in reduced precision
#: (the fp32 promotion happens per block), so the fp32 result is not fp32-exact. 1e-3 is below
#: the bf16 output rounding (1.7e-3) and far below one wrong E8M0 step (a 2x error). The
#: interpreter test (tests/triton/test_interpreter.py) holds the fp32 path to 1e-5.
FP32_OUT_ON_GPU = 1e-3


@pytest.mark.parametrize("m", (1, 64, 1000, 8192))
def test_gemm_fp32_out_from_transposed_x(m):
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch

    seed = _seed()
    g, k = 8, HPG * DH
    x, w, xs, ws = _gemm_inputs(m, g, N, k, seed)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # [M, G, K] view of a [G, M, K] buffer
    y = torch.full((m, g, N), float("nan"), dtype=torch.float32, device="cuda")
    launch.batched_gemm_a8w8_mxscale(xt, w, xs, ws, dtype=torch.float32, out=y)
    ref = _oracle("batched_gemm_a8w8_mxscale")(_j(x), _j(w), _j(xs), _j(ws), dtype=jnp.float32)
    err = _relerr(y, ref)
    assert err <= FP32_OUT_ON_GPU, f"seed {seed}: relerr {err:.3g}"


@pytest.mark.parametrize("m", (1, 64, 1000, 8192))
def test_gemm_v41_32x32_blocks(m):
    """DeepSeek V4.1: 32 x 32 weight blocks with 1 x 32 activation groups."""
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    seed = _seed()
    x, w, xs, ws = _gemm_inputs(m, 8, N, HPG * DH, seed, block=32)
    y = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    ref = _oracle("batched_gemm_a8w8_mxscale")(_j(x), _j(w), _j(xs), _j(ws), dtype=jnp.float32)
    err = _relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"


def _checkpoint(g, seed):
    x, w, _, ws = _gemm_inputs(1, g, N, HPG * DH, seed)
    return w.flatten(0, 1), ws.flatten(0, 1)


@pytest.mark.parametrize("s", (1, 128, 4096))
def test_whole_chain_public_api_and_bf16_chain(s):

    import woa_jax
    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    seed, g = _seed(), 16
    o, pos, cos, sin = _rope_inputs(s, g, seed)
    weight, scale = _checkpoint(g, seed)
    ref = _chain_oracle(o, pos, cos, sin, weight, scale, g)
    from torch_bridge import WoAProjection

    proj = WoAProjection(weight, scale.view(torch.float8_e8m0fnu), g, cos, sin, backend="triton")
    y = proj(o, pos)
    assert proj.path == "triton"
    assert _relerr(y, ref) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}"
    cos32, sin32 = cos.float(), sin.float()
    ref16 = _oracle("wo_a_bf16")(_j(o), _j(pos), _j(cos32), _j(sin32), _j(weight), _j(scale), g)
    w_bf16 = woa_jax.dequant_wo_a_weight(_j(weight), _j(scale), g)
    from torch_bridge import interop

    y16 = launch.wo_a_bf16(o, pos, cos32, sin32, interop.to_torch(w_bf16), g)
    assert _relerr(y16, ref16) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}"


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("s", (1, 7, 16, 64))
def test_fused_decode_chain(s, g):
    """The one-kernel chain at its default shape against the oracle, and bit for bit against
    the two-kernel chain with the same tiles (without split-K, whose atomics reorder sums)."""
    import dataclasses

    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    seed = _seed()
    o, pos, cos, sin = _rope_inputs(s, g, seed, pos_dtype=torch.int32 if s % 2 else torch.int64)
    weight, scale = _checkpoint(g, seed)
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    ref = _chain_oracle(o, pos, cos, sin, weight, scale, g)
    y = torch.full((s, g, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, out=y, fused=True)
    err = _relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"
    cfg = dataclasses.replace(launch.fused_config(s, g, N, HPG * DH, 128), split_k=1)
    one = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, fused=True, config=cfg)
    two = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, fused=False, config=cfg)
    bad = int((one.view(torch.int16) != two.view(torch.int16)).sum())
    assert bad == 0, f"seed {seed}: {bad} of {one.numel()} outputs differ from the two kernels"


@pytest.mark.parametrize("s,g", ((1, 2), (1, 16)))  # (1, 2): split-K, its buffer in the pool
def test_fused_chain_cuda_graph_and_torch_compile(s, g):
    from torch_bridge.backends.triton import launch

    assert launch.fused_chosen(s, g, N, HPG * DH, 128)

    o, pos, cos, sin = _rope_inputs(s, g, _seed(), pos_dtype=torch.int32)
    weight, scale = _checkpoint(g, _seed())
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    y = torch.empty((s, g, N), dtype=torch.bfloat16, device="cuda")
    launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, out=y)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()  # split-K (G = 2): the fp32 parts come from the pool
    with torch.cuda.graph(graph):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, out=y)
    o2, pos2, _, _ = _rope_inputs(s, g, _seed(), pos_dtype=torch.int32)
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
    from woa_jax.testing import TOLERANCES

    ref = _chain_oracle(o, pos, cos, sin, weight, scale, g)
    assert _relerr(got, ref) <= TOLERANCES["gemm_bf16"].rel


@pytest.mark.parametrize("s", (1, 64, 8192))
def test_jax_jit_path(s):
    import jax
    import jax.numpy as jnp

    import woa_jax
    from torch_bridge import jax_ops
    from woa_jax.testing import TOLERANCES

    seed, g = _seed(), 16
    o, pos, cos, sin = _rope_inputs(s, g, seed)
    weight, scale = _checkpoint(g, seed)
    args = [_j(t) for t in (o, pos, cos, sin)]
    w, ws = woa_jax.wo_a_weight_e8m0(_j(weight), _j(scale), g)
    q, sc = jax.jit(lambda *a: jax_ops.inverse_rope_group_quant(*a, g, 128))(*args)
    rq, rs = _oracle("inverse_rope_group_quant")(*args, g, 128)
    _assert_bytes_equal(q, rq, "fp8", seed)
    _assert_bytes_equal(sc, rs, "scale", seed)
    ref = _chain_oracle(o, pos, cos, sin, weight, scale, g)
    for cb in (None, False, True):  # None: on for the wgmma GEMM (s = 8192), else off
        fn = jax.jit(lambda *a, cb=cb: jax_ops.wo_a_fp8(*a, g, command_buffer=cb))
        y = fn(*args, w, ws)
        assert y.dtype == jnp.bfloat16
        assert _relerr(y, ref) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}, command_buffer={cb}"
        # a second input through the same executable (a command-buffer replay must see it)
        o2, pos2, _, _ = _rope_inputs(s, g, seed + 1)
        args2 = [_j(o2), _j(pos2), *args[2:]]
        ref2 = _chain_oracle(o2, pos2, cos, sin, weight, scale, g)
        y2 = fn(*args2, w, ws)
        assert _relerr(y2, ref2) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}, replay cb={cb}"


# On Hopper every GEMM here the wgmma kernel's: the swapped tile at 4, 64- and 128-row tiles above.
@pytest.mark.parametrize("s", (4, 64, 256))
def test_cuda_graph_and_torch_compile(s):
    from torch_bridge.backends.triton import launch

    g = 16
    o, pos, cos, sin = _rope_inputs(s, g, _seed(), pos_dtype=torch.int32)
    weight, scale = _checkpoint(g, _seed())
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    xq, xs = _poisoned(s, g, HPG * DH)
    y = torch.empty((s, g, N), dtype=torch.bfloat16, device="cuda")

    def chain():
        launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128, x_fp8=xq, x_scale=xs)
        launch.batched_gemm_a8w8_mxscale(xq, w, xs, ws, out=y)

    chain()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    o2, pos2, _, _ = _rope_inputs(s, g, _seed(), pos_dtype=torch.int32)
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
