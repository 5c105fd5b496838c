"""Inputs of the op tests, and the oracles and checks they share (``from inputs import ...``;
``tests/conftest.py`` puts ``tests/`` on the import path).

Three kinds of inputs, one recipe each:

* numpy cases (``rope_case``, ``gemm_operands``, ``wo_a_checkpoint``): one set of bytes as
  numpy, torch and JAX, for the entry points and backends (``tests/torch_bridge``);
* tiny torch tensors on ``DEVICE`` (``rope_tensors``, ``gemm_tensors``, ``chain_tensors``,
  ``checkpoint_tensors``): the interpreter axis of ``tests/ops`` (CPU under
  ``TRITON_INTERPRET=1``, else the GPU);
* seeded GPU tensors at DeepSeek V4 sizes (``rope_inputs``, ``gemm_inputs``, ``checkpoint``):
  the GPU axis (``pytest -m gpu``). Every case draws fresh random inputs (seeded from the OS,
  printed on failure), poisons the outputs before the launch and checks that every element was
  written; NaN never passes (a NaN output makes the relative error infinite, a NaN fp8 byte
  differs from the oracle's).

Last, ``run_compile_script`` compiles kernels for GPU targets on a machine without one.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import woa_jax
from torch_bridge import interop
from woa_jax.testing import assert_bitwise_equal, to_numpy

# ---------------------------------------------------------------------------------------------
# numpy cases: one set of bytes as numpy, torch and JAX
# ---------------------------------------------------------------------------------------------


def np_to_torch(a: np.ndarray) -> torch.Tensor:
    """Same bytes as a torch tensor of its own (ml_dtypes types go through their raw bits)."""
    return interop.numpy_to_torch(np.array(a))


@dataclasses.dataclass
class RopeCase:
    o: np.ndarray
    positions: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    num_groups: int
    gs: int

    def torch(self):
        return tuple(np_to_torch(a) for a in (self.o, self.positions, self.cos, self.sin))

    def jax(self):
        return tuple(jnp.asarray(a) for a in (self.o, self.positions, self.cos, self.sin))


def rope_case(rng: np.random.Generator, *, s: int, h: int, dh: int, rd: int, num_groups: int,
              gs: int = 128, p: int = 64, act: str = "bfloat16", rope: str = "float32",
              pos_dtype=np.int64, scale: float = 0.1) -> RopeCase:
    o = (rng.standard_normal((s, h, dh)) * scale).astype(getattr(ml_dtypes, act, act))
    angles = rng.standard_normal((p, rd // 2)).astype(np.float32) * 3
    cos = np.cos(angles).astype(getattr(ml_dtypes, rope, rope))
    sin = np.sin(angles).astype(getattr(ml_dtypes, rope, rope))
    positions = rng.integers(0, p, size=s).astype(pos_dtype)
    return RopeCase(o, positions, cos, sin, num_groups, gs)


def gemm_operands(rng: np.random.Generator, *, m: int, g: int, n: int, k: int, block: int = 128,
                  fp8: str = "float8_e4m3fn"):
    """``(x, w, x_scale, w_scale)`` numpy: signed randn payloads, scales 2**randint(-4, 4)."""
    fdt = getattr(ml_dtypes, fp8)
    x = rng.standard_normal((m, g, k)).astype(np.float32).astype(fdt)
    w = rng.standard_normal((g, n, k)).astype(np.float32).astype(fdt)
    xs = (127 + rng.integers(-4, 5, size=(m, g, k // block))).astype(np.uint8)
    ws = (127 + rng.integers(-4, 5, size=(g, -(-n // block), k // block))).astype(np.uint8)
    return x, w, xs, ws


def wo_a_checkpoint(rng: np.random.Generator, *, g: int, n: int, k: int, block: int = 128,
                    fp8: str = "float8_e4m3fn"):
    """A checkpoint-style ``([G*N, K] fp8, [G*N/B, K/B] e8m0)`` pair, numpy."""
    fdt = getattr(ml_dtypes, fp8)
    w = (rng.standard_normal((g * n, k)) * 0.5).astype(np.float32).astype(fdt)
    sbytes = (120 + rng.integers(-3, 4, size=(-(-g * n // block), k // block))).astype(np.uint8)
    return w, sbytes.view(ml_dtypes.float8_e8m0fnu)


# One XLA computation per shape compiles much faster than op-by-op eager dispatch.
_oracle_quant = jax.jit(woa_jax.inverse_rope_group_quant, static_argnums=(4, 5),
                        static_argnames=("fp8_dtype", "amax_floor"))


def oracle_rope_quant(c: RopeCase, *, fp8=jnp.float8_e4m3fn, amax_floor=woa_jax.AITER_AMAX_FLOOR):
    return _oracle_quant(*c.jax(), c.num_groups, c.gs, fp8_dtype=fp8, amax_floor=amax_floor)


# ---------------------------------------------------------------------------------------------
# Interpreter axis: tiny torch tensors on DEVICE
# ---------------------------------------------------------------------------------------------

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rope_tensors(rng, s=3, h=4, dh=512, rd=64, p=64, *, rope_dtype=torch.bfloat16,
                 pos_dtype=torch.int64, o_dtype=torch.bfloat16):
    """``(o [S, H, Dh], positions [S], cos, sin [P, rd / 2])`` with random angles."""
    o = torch.from_numpy(rng.standard_normal((s, h, dh)).astype(np.float32) / 10).to(o_dtype)
    pos = torch.from_numpy(rng.integers(0, p, s)).to(pos_dtype)
    ang = rng.uniform(0, 6.3, (p, rd // 2)).astype(np.float32)
    cos = torch.from_numpy(np.cos(ang)).to(rope_dtype)
    sin = torch.from_numpy(np.sin(ang)).to(rope_dtype)
    return [t.to(DEVICE) for t in (o, pos, cos, sin)]


def gemm_tensors(rng, m, g, n, k, block=128):
    """``(x [M, G, K], w [G, N, K], x_scale, w_scale)``: e4m3fn operands, E8M0 byte scales."""
    x = rng.standard_normal((m, g, k)).astype(np.float32) * 30
    w = rng.standard_normal((g, n, k)).astype(np.float32) * 30
    xs = rng.integers(122, 131, (m, g, k // block)).astype(np.uint8)
    ws = rng.integers(112, 120, (g, -(-n // block), k // block)).astype(np.uint8)
    ts = (torch.from_numpy(x).to(torch.float8_e4m3fn), torch.from_numpy(w).to(torch.float8_e4m3fn),
          torch.from_numpy(xs), torch.from_numpy(ws))
    return [t.to(DEVICE) for t in ts]


def chain_tensors(rng, s, *, g=2, h=4, dh=512, rd=64, n=128, block=128, p=64,
                  rope_dtype=torch.bfloat16, pos_dtype=torch.int64):
    """``rope_tensors`` and the FP8 chain's ``w [G, N, K]`` fp8 with its ``[G, N / B, K / B]``
    scale bytes (K = H * Dh / G)."""
    k = h * dh // g
    rope = rope_tensors(rng, s, h, dh, rd, p, rope_dtype=rope_dtype, pos_dtype=pos_dtype)
    w = torch.from_numpy(rng.standard_normal((g, n, k)).astype(np.float32) * 30).to(
        torch.float8_e4m3fn)
    ws = torch.from_numpy(rng.integers(112, 120, (g, -(-n // block), k // block)).astype(
        np.uint8))
    return rope + [t.to(DEVICE) for t in (w, ws)]


def checkpoint_tensors(rng, g, n, k):
    """``(weight [G*N, K] fp8, scale bytes, w_bf16 [G, N, K])``: the oracle's inputs and the
    exact bf16 weight the BF16 chain's launcher takes."""
    weight = torch.from_numpy(rng.standard_normal((g * n, k)).astype(np.float32)).to(
        torch.float8_e4m3fn).to(DEVICE)
    scale = torch.from_numpy(rng.integers(118, 124, (-(-g * n // 128), k // 128)).astype(
        np.uint8)).to(DEVICE)
    w_bf16 = woa_jax.dequant_wo_a_weight(*jx(weight, scale), g).astype(np.float32)
    return weight, scale, torch.from_numpy(np.array(w_bf16)).to(torch.bfloat16).to(DEVICE)


def jx(*ts):
    """The tensors as JAX arrays (for the oracle)."""
    return [jnp.asarray(to_numpy(t)) for t in ts]


def assert_quant_equal(q, sc, rq, rs):
    assert_bitwise_equal(to_numpy(sc).view(np.uint8), np.asarray(rs).view(np.uint8),
                         name="scale bytes")
    assert_bitwise_equal(to_numpy(q).view(np.uint8), np.asarray(rq).view(np.uint8),
                         name="fp8 bytes")


# ---------------------------------------------------------------------------------------------
# GPU axis: seeded tensors at DeepSeek V4 sizes (pytest -m gpu)
# ---------------------------------------------------------------------------------------------

GROUPS = (1, 2, 8, 16)
TOKENS = (1, 7, 64, 128, 1000, 4096, 8192)
HPG, DH, RD, N, P = 8, 512, 64, 1024, 65536
FP8_POISON = 0x7F  # e4m3fn NaN: the kernel never writes it for finite inputs
SCALE_POISON = 0  # never written: finite groups give bytes >= 92

#: fp32 output on Hopper: Triton's fp8 wgmma accumulates each 128-K block in reduced precision
#: (the fp32 promotion happens per block), so the fp32 result is not fp32-exact. 1e-3 is below
#: the bf16 output rounding (1.7e-3) and far below one wrong E8M0 step (a 2x error). The
#: interpreter axis (tests/ops/test_gemm.py) holds the fp32 path to 1e-5.
FP32_OUT_ON_GPU = 1e-3


@pytest.fixture(autouse=True)
def xla_memory():
    """Import it into a test module to keep JAX from taking the GPU's memory up front there."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def capture(graph: torch.cuda.CUDAGraph, **kwargs):
    """``torch.cuda.graph`` in thread-local mode: the oracle's JAX runtime threads (alive in any
    worker that ran a JAX test) call the driver at any time, which invalidates a global-mode
    capture; this thread's own calls are checked either way."""
    return torch.cuda.graph(graph, capture_error_mode="thread_local", **kwargs)


def oracle(name: str):
    """The ``woa_jax`` function ``name`` under ``jax.jit`` (one compile per shape, not per op)."""
    static = {"inverse_rope_group_quant": (4, 5), "wo_a_fp8": (6,), "wo_a_bf16": (6,),
              "batched_gemm_a8w8_mxscale": ()}[name]
    return jax.jit(getattr(woa_jax, name), static_argnums=static, static_argnames=(
        ("dtype",) if name in ("wo_a_fp8", "batched_gemm_a8w8_mxscale") else ()))


def quant_oracle(o, pos, cos, sin, g, gs=128):
    """``woa_jax.inverse_rope_group_quant`` under ``jax.jit`` on views of the GPU tensors."""
    return oracle("inverse_rope_group_quant")(*map(jax_view, (o, pos, cos, sin)), g, gs)


def gemm_oracle(x, w, xs, ws):
    """``woa_jax.batched_gemm_a8w8_mxscale`` under ``jax.jit`` on views of the GPU tensors,
    fp32 out."""
    return oracle("batched_gemm_a8w8_mxscale")(*map(jax_view, (x, w, xs, ws)), dtype=jnp.float32)


def chain_oracle(o, pos, cos, sin, weight, scale, g):
    """``woa_jax.wo_a_fp8`` as two jitted steps (quant, then GEMM), fp32 out.

    One jit of the whole ``wo_a_fp8`` on XLA:GPU differed from the eager chain by 2.7e-2
    (relative), as if the fp8 rounding were dropped; each step alone matches the eager oracle.
    """
    q, sc = quant_oracle(o, pos, cos, sin, g)
    w = jax_view(weight).reshape(g, -1, weight.shape[1])
    ws = jax_view(scale).reshape(g, -1, scale.shape[1])
    return oracle("batched_gemm_a8w8_mxscale")(q, w, sc, ws, dtype=jnp.float32)


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def jax_view(t):
    """A JAX view of a tensor (for the oracle), sharing its GPU memory."""
    return interop.to_jax(t)


def as_torch(a):
    """A torch view (on the GPU) of a JAX or torch array; 1-byte types as uint8."""
    t = interop.to_torch(a)
    return t.view(torch.uint8) if t.element_size() == 1 else t


def as_bits(a):
    """A torch view (on the GPU) of a JAX or torch array; 1- and 2-byte types as unsigned ints."""
    t = interop.to_torch(a)
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def count_differing(actual, expected) -> int:
    """How many elements of ``actual`` differ from ``expected`` in their bits."""
    return int((as_bits(actual) != as_bits(expected)).sum())


def assert_bytes_equal(actual, expected, what: str, seed: int) -> None:
    a, e = as_torch(actual), as_torch(expected)
    bad = int((a != e).sum())
    assert bad == 0, f"seed {seed}: {bad} of {a.numel()} {what} bytes differ from the oracle"


def rope_inputs(s, g, seed, *, pos_dtype=torch.int64, rope_dtype=torch.bfloat16,
                table="random"):
    """``o [S, G * 8, 512]`` bf16, positions in ``[0, P)`` and cos/sin ``[P, 32]``.

    ``seed``: an int, or a CUDA ``torch.Generator`` that draws more after. ``table``:
    ``"random"`` angles, or a DeepSeek V4 table (``woa_jax.rope_cos_sin``, e.g. ``"v4-flash"``).
    """
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator(
        device="cuda").manual_seed(seed)
    o = (torch.randn((s, g * HPG, DH), generator=gen, device="cuda") / 10).to(torch.bfloat16)
    pos = torch.randint(0, P, (s,), generator=gen, device="cuda").to(pos_dtype)
    ang = torch.rand((P, RD // 2), generator=gen, device="cuda") * 6.3
    cos, sin = torch.cos(ang), torch.sin(ang)
    if table != "random":
        cos, sin = (interop.numpy_to_torch(np.asarray(t)).cuda()
                    for t in woa_jax.rope_cos_sin(table, "compress", max_positions=P))
    return o, pos, cos.to(rope_dtype), sin.to(rope_dtype)


def poisoned(s, g, d, gs=128):
    q = torch.full((s, g, d), FP8_POISON, dtype=torch.uint8, device="cuda").view(
        torch.float8_e4m3fn)
    sc = torch.full((s, g, d // gs), SCALE_POISON, dtype=torch.uint8, device="cuda")
    return q, sc


def gemm_inputs(m, g, n, k, seed, block=128):
    """AITER-style data: signed randn, each K block scaled by a random power of two."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((m, g, k), generator=gen, device="cuda").mul(40).clamp(-448, 448)
    w = torch.randn((g, n, k), generator=gen, device="cuda").mul(40).clamp(-448, 448)
    xs = torch.randint(123, 132, (m, g, k // block), generator=gen, device="cuda",
                       dtype=torch.int32).to(torch.uint8)
    ws = torch.randint(110, 118, (g, -(-n // block), k // block), generator=gen, device="cuda",
                       dtype=torch.int32).to(torch.uint8)
    return x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), xs, ws


#: fp32 and bf16 rope tables, random and DeepSeek V4's own (``rope_inputs(table=...)``). The
#: oracle rounds each product of the rotation to fp32 before the sum; with fp32 tables a compiled
#: multiply-add would round once, so these cases catch a contraction the kernels let back in.
#: bf16 tables give exact products, so they pin that nothing changed there.
ROPE_TABLES = [("random", torch.float32), ("random", torch.bfloat16),
               ("v4-flash", torch.float32), ("v4-flash", torch.bfloat16)]
#: ``(S, G)`` of the rope-table cases of the rotating kernels.
TABLE_SHAPES = ((1024, 16), (8192, 16), (1024, 2), (8192, 2))


def relerr(a, e) -> float:
    """Relative Frobenius error in float64 on the GPU; inf when anything is not finite."""
    a, e = as_torch(a).double(), as_torch(e).double()
    if not bool(a.isfinite().all()):
        return float("inf")
    return float((a - e).norm() / e.norm())


def checkpoint(g, seed):
    x, w, _, ws = gemm_inputs(1, g, N, HPG * DH, seed)
    return w.flatten(0, 1), ws.flatten(0, 1)


# ---------------------------------------------------------------------------------------------
# Code generation for GPU targets, on a machine without one
# ---------------------------------------------------------------------------------------------


def run_compile_script(script: str, cache_dir) -> list[str]:
    """Run ``script`` (Python source) with Triton's cache in ``cache_dir``; its stdout lines.

    The test process interprets the Triton kernels, so compiling them for a GPU target needs a
    fresh Python without ``TRITON_INTERPRET``; no GPU is needed to compile. Fails the calling
    test with the end of stderr when the script exits non-zero.
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_dir), TRITON_DEFAULT_FP_FUSION="1",
               JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().split("\n")
