"""Benchmark problems: shapes, input sets, and the ``woa_jax`` oracle every provider is checked by.

Input sets follow ``woa_jax.example_inputs``' rules (``woa_jax.draw_rules``: an attention output
``o [M, H, Dh]``, sorted positions below ``cache_rows``, the model's rope table, a real weight
quantized into 128 x 128 E8M0 blocks), drawn on the device with a torch generator and made into
inputs there by ``woa_jax.inputs_from_draws``. The quantized activations are built once per set
so that the GEMM rows time the GEMM alone.
"""

from __future__ import annotations

import dataclasses
import math

#: The tolerance of GEMM-like outputs against the fp32 oracle (``woa_jax.testing.TOLERANCES``).
GEMM_TOLERANCE = "gemm_bf16"
#: Bytes of input one timed round should exceed, ~3x the H200's 60 MB L2.
L2_COLD_BYTES = 200e6
#: H200 SXM dense FP8 peak (datasheet), for "% of ceiling" of compute-bound rows.
H200_FP8_PEAK_TFLOPS = 1979.0


class Skip(Exception):
    """A provider that cannot run here (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One sweep: groups, token counts and the per-group GEMM size."""

    groups: tuple[int, ...]
    ms: tuple[int, ...]
    heads_per_group: int  # K = heads_per_group * head_dim
    n: int
    head_dim: int = 512
    rope_dim: int = 64
    cache_rows: int = 65536  # rows of the cos/sin table (positions drawn below it)
    config: str = "v4-pro"  # the model whose rope table and input rules the sets use

    @property
    def k(self) -> int:
        return self.heads_per_group * self.head_dim


#: DeepSeek V4 ``wo_a``: K = 4096, N = 1024 (V4-Pro at TP1 is G = 16, at TP8 G = 2).
GPU = Sweep(groups=(16, 8, 2),
            ms=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
            heads_per_group=8, n=1024)

#: CPU smoke shapes under ``TRITON_INTERPRET=1``: K = 512, N = 128, about 1e6 FLOP per call.
CPU = Sweep(groups=(2,), ms=(1, 5), heads_per_group=1, n=128, cache_rows=64)


@dataclasses.dataclass(frozen=True)
class Prefill:
    """One long prefill processed in fixed-size chunks (the AITER measurement)."""

    tokens: int
    chunk: int
    groups: tuple[int, ...]
    runs: int = 3


GPU_PREFILL = Prefill(tokens=100_000, chunk=8192, groups=(16, 2))
CPU_PREFILL = Prefill(tokens=40, chunk=16, groups=(2,))


@dataclasses.dataclass
class Problem:
    """One input set of one (G, M) with everything the providers derive from it."""

    g: int
    o: object  # [M, H, Dh] bf16
    pos: object  # [M] int64
    cos_bf16: object  # [P, rd / 2]
    sin_bf16: object
    cos32: object
    sin32: object
    w: object  # [G, N, K] fp8
    ws: object  # [G, N / 128, K / 128] uint8 E8M0
    w_bf16: object  # [G, N, K] bf16, exact
    x: object = None  # [M, G, K] fp8, quantized o
    xs: object = None  # [M, G, K / 128] uint8
    o_work: object = None  # a private copy of o for the in-place chains
    cache: dict = dataclasses.field(default_factory=dict)

    @property
    def m(self) -> int:
        return int(self.o.shape[0])


def _config(sweep: Sweep, g: int):
    """The sweep's shapes as a one-rank model config with ``g`` groups."""
    import woa_jax

    return dataclasses.replace(woa_jax.get_config(sweep.config), o_groups=g,
                               num_heads=g * sweep.heads_per_group, o_lora_rank=sweep.n,
                               head_dim=sweep.head_dim, rope_dim=sweep.rope_dim)


def make_problem(sweep: Sweep, g: int, m: int, device: str, seed: int) -> Problem:
    """Draw one input set on ``device`` by ``woa_jax.draw_rules`` (see the module docstring)."""
    import torch

    import woa_jax
    from torch_bridge import interop
    from torch_bridge.backends import torch_ref
    from torch_bridge.backends.triton import launch

    cfg = _config(sweep, g)
    gen = torch.Generator(device=device).manual_seed(seed)
    draws = [torch.randn(r.shape, generator=gen, device=device) if r.high is None else
             torch.randint(r.low, r.high, r.shape, generator=gen, device=device,
                           dtype=torch.int32)
             for r in woa_jax.draw_rules(cfg, tokens=m, tp_size=1, max_position=sweep.cache_rows)]
    cos32, sin32 = (interop.to_torch(t).to(device)
                    for t in woa_jax.rope_cos_sin(cfg, "compress", sweep.cache_rows))
    inp = woa_jax.inputs_from_draws(woa_jax.Draws(*map(interop.to_jax, draws)),
                                    interop.to_jax(cos32), interop.to_jax(sin32), g,
                                    block=cfg.block_size)
    o, pos, cos_bf16, sin_bf16, w2d, ws2d = (interop.to_torch(a) for a in inp[:6])
    ws2d = ws2d.view(torch.uint8)
    k, n, b = sweep.k, sweep.n, cfg.block_size
    p = Problem(g=g, o=o, pos=pos.to(torch.int64), cos_bf16=cos_bf16, sin_bf16=sin_bf16,
                cos32=cos32, sin32=sin32, w=w2d.view(g, n, k), ws=ws2d.view(g, n // b, k // b),
                w_bf16=torch_ref.dequant_wo_a_weight(w2d, ws2d, g))
    p.x, p.xs = launch.inverse_rope_group_quant(o, p.pos, cos_bf16, sin_bf16, g, 128)
    p.o_work = o.clone()
    return p


def n_sets(sweep: Sweep, g: int, m: int, on_gpu: bool) -> int:
    """Input sets to rotate through so that one round exceeds L2 (1 on CPU)."""
    if not on_gpu:
        return 1
    per_set = g * sweep.n * sweep.k * 3 + m * g * sweep.k * 3  # fp8 + bf16 weight, o + x
    return int(min(24, max(1, math.ceil(L2_COLD_BYTES / per_set))))


def make_sets(sweep: Sweep, g: int, m: int, on_gpu: bool, seed: int) -> list[Problem]:
    device = "cuda" if on_gpu else "cpu"
    return [make_problem(sweep, g, m, device, seed + i)
            for i in range(n_sets(sweep, g, m, on_gpu))]


# ----------------------------------------------------------------------------------------------
# Oracle and checks
# ----------------------------------------------------------------------------------------------


def _j(t):
    from torch_bridge import interop

    return interop.to_jax(t)


def oracle(p: Problem, what: str):
    """The ``woa_jax`` result of ``what`` (quant, quant_cuda_floor, gemm, chain_fp8,
    chain_fp8_layer, chain_bf16), cached on ``p``.

    ``quant_cuda_floor`` is the quant with vLLM's CUDA amax floor (1e-10) instead of AITER's
    (1e-8, ours). The FP8 chain's oracle is the quant oracle's output through the GEMM oracle
    (the quant is computed once for both checks); ``chain_fp8_layer`` is the same chain on the
    fp32 rope tables that ``WoAProjection`` holds (bf16 tables move some fp8 bytes).
    """
    if what in p.cache:
        return p.cache[what]
    import jax
    import jax.numpy as jnp

    import woa_jax

    gemm = jax.jit(woa_jax.batched_gemm_a8w8_mxscale, static_argnames="dtype")
    quant = jax.jit(woa_jax.inverse_rope_group_quant, static_argnums=(4, 5),
                    static_argnames="amax_floor")
    if what in ("quant", "quant_cuda_floor"):
        floor = woa_jax.CUDA_AMAX_FLOOR if what == "quant_cuda_floor" else woa_jax.AITER_AMAX_FLOOR
        r = quant(_j(p.o), _j(p.pos), _j(p.cos_bf16), _j(p.sin_bf16), p.g, 128, amax_floor=floor)
    elif what == "gemm":
        r = gemm(_j(p.x), _j(p.w), _j(p.xs), _j(p.ws), dtype=jnp.float32)
    elif what == "chain_fp8":
        q, sc = oracle(p, "quant")
        r = gemm(q, _j(p.w), sc, _j(p.ws), dtype=jnp.float32)
    elif what == "chain_fp8_layer":
        q, sc = quant(_j(p.o), _j(p.pos), _j(p.cos32), _j(p.sin32), p.g, 128)
        r = gemm(q, _j(p.w), sc, _j(p.ws), dtype=jnp.float32)
    elif what == "chain_bf16":
        w2, s2 = _j(p.w.flatten(0, 1)), _j(p.ws.flatten(0, 1))
        r = jax.jit(woa_jax.wo_a_bf16, static_argnums=6)(
            _j(p.o), _j(p.pos), _j(p.cos32), _j(p.sin32), w2, s2, p.g)
    else:
        raise ValueError(f"unknown oracle {what!r}; expected quant, quant_cuda_floor, gemm, "
                         "chain_fp8, chain_fp8_layer or chain_bf16")
    p.cache[what] = r
    return r


def check_close(y, p: Problem, what: str) -> str:
    """``"relerr E"``, or ``AssertionError`` unless ``y`` is within the bf16 GEMM tolerance."""
    from woa_jax.testing import TOLERANCES, relative_error

    err = relative_error(y, oracle(p, what))
    tol = TOLERANCES[GEMM_TOLERANCE].rel
    if not err <= tol:
        raise AssertionError(f"relative error {err:.3g} > {tol} against the {what} oracle")
    return f"relerr {err:.2e}"


def check_quant_bytes(q, scale, p: Problem) -> str:
    """``"bytes exact"``, or ``AssertionError`` naming the first differing byte."""
    from woa_jax.testing import assert_bitwise_equal

    rq, rs = oracle(p, "quant")
    assert_bitwise_equal(q, rq, name="quant fp8")
    assert_bitwise_equal(scale, rs, name="quant scale")
    return "bytes exact"


#: Beyond this fraction of differing bytes (and more than one), a peer's quant is wrong, not
#: rounded otherwise: a wrong layout, rotation or rounding rule changes most bytes, while a
#: scale computed with an approximate log2 differs from the oracle's in about 1e-7 of the groups.
PEER_QUANT_MAX_DIFFER = 1e-3


def check_quant_near(q, scale_bytes, p: Problem, what: str) -> str:
    """A peer's quant against the ``what`` oracle: ``"bytes exact"`` or ``"bytes differ: fp8
    N/T, scale n/t"``.

    Raises:
      AssertionError: a scale byte more than one off, more than ``PEER_QUANT_MAX_DIFFER`` of
        the scale bytes differing, or of the fp8 bytes of the groups whose scales agree.
    """
    import numpy as np

    from woa_jax.testing import to_numpy

    rq, rs = oracle(p, what)
    qa, qe = (to_numpy(a).view(np.uint8) for a in (q, rq))
    sa, se = (to_numpy(a).view(np.uint8).astype(np.int32) for a in (scale_bytes, rs))
    if qa.shape != qe.shape or sa.shape != se.shape:
        raise AssertionError(f"shapes fp8 {qa.shape}, scale {sa.shape} != the oracle's "
                             f"{qe.shape}, {se.shape}")
    n_scale = int((sa != se).sum())
    same_scale = np.repeat(sa == se, qa.shape[-1] // sa.shape[-1], axis=-1)
    n_fp8, n_fp8_same = int((qa != qe).sum()), int(((qa != qe) & same_scale).sum())
    if np.abs(sa - se).max() > 1:
        raise AssertionError(f"a scale byte differs from the {what} oracle's by "
                             f"{int(np.abs(sa - se).max())} (a rounding boundary moves it by one)")
    for count, total, which in ((n_scale, sa.size, "scale bytes"),
                                (n_fp8_same, qa.size, "fp8 bytes under equal scales")):
        if count > max(1, PEER_QUANT_MAX_DIFFER * total):
            raise AssertionError(f"{count} of {total} {which} differ from the {what} oracle")
    if n_fp8 == n_scale == 0:
        return "bytes exact"
    return f"bytes differ: fp8 {n_fp8}/{qa.size}, scale {n_scale}/{sa.size}"
