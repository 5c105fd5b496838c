"""Torch providers: each checks its output against the oracle, then returns what to time.

A provider is ``fn(sets, on_gpu) -> (calls, check)``: one zero-argument call per input set and
the check's verdict (``"bytes exact"``, a peer quant's ``"bytes differ: ..."`` or ``"relerr
E"``); it raises ``Skip`` with the reason where it cannot run, and ``AssertionError`` where its
output is wrong. Setup (scale conversion, padding, output buffers, the layer object) stays
outside the calls. The peers (vLLM's quant, DeepGEMM) come from ``peers``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from torch_bridge.backends import deepgemm

from . import peers
from .problem import Problem, Skip, check_close, check_quant_bytes, check_quant_near


@dataclasses.dataclass(frozen=True)
class Provider:
    """One row kind of the sweep: what it runs, and whether it is timed under ``jax.jit``."""

    name: str
    runs: str
    fn: Callable
    jax: bool = False

    @property
    def kind(self) -> str:
        return self.name.split("_", 1)[0]


def _out(p: Problem):
    import torch

    return torch.empty((p.m, p.g, p.w.shape[1]), dtype=torch.bfloat16, device=p.x.device)


def quant_triton(sets, on_gpu, *, config=None):
    """The public op on the Triton backend, into the set's buffers; ``config``: the launcher
    with a ``QuantConfig`` instead of the built-in choice (``--tune``)."""
    import torch_bridge as tb
    from torch_bridge.backends.triton import launch

    def quant(p, **buffers):
        if config is not None:
            return launch.inverse_rope_group_quant(p.o, p.pos, p.cos_bf16, p.sin_bf16, p.g,
                                                   128, config=config, **buffers)
        return tb.inverse_rope_group_quant(p.o, p.pos, p.cos_bf16, p.sin_bf16, p.g, 128,
                                           backend="triton", **buffers)

    msg = check_quant_bytes(*quant(sets[0]), sets[0])
    return [(lambda p=p: quant(p, x_fp8=p.x, x_scale=p.xs)) for p in sets], msg


def gemm_triton(sets, on_gpu, *, config=None):
    """The public op on the Triton backend, into an output of its own; ``config``: the launcher
    with a ``GemmConfig`` instead of the built-in choice (``--tune``)."""
    import torch_bridge as tb
    from torch_bridge.backends.triton import launch

    def gemm(p, out=None):
        if config is not None:
            return launch.batched_gemm_a8w8_mxscale(p.x, p.w, p.xs, p.ws, out=out,
                                                    config=config)
        return tb.batched_gemm_a8w8_mxscale(p.x, p.w, p.xs, p.ws, backend="triton", out=out)

    msg = check_close(gemm(sets[0]), sets[0], "gemm")
    outs = [_out(p) for p in sets]
    return [(lambda p=p, y=y: gemm(p, y)) for p, y in zip(sets, outs, strict=True)], msg


def _dg_activation_scales(dg, xs):
    """E8M0 activation scales ``[M, G, K / 128]`` in DeepGEMM's fp32 layout (what vLLM's quant
    writes), checked so that ``fp8_einsum`` transforms nothing when timed."""
    sf = deepgemm.activation_scales(xs)
    by_group = sf.transpose(0, 1)
    if dg.get_mn_major_tma_aligned_tensor(by_group).data_ptr() != by_group.data_ptr():
        raise AssertionError("DeepGEMM would transform its own activation-scale layout again")
    return sf


def gemm_deepgemm(sets, on_gpu):
    from torch_bridge.backends.torch_ref import e8m0_decode

    dg = peers.deep_gemm(pdl=False)  # DeepGEMM's default; none of the GEMM rows uses PDL
    prepared = [(p.x, _dg_activation_scales(dg, p.xs), p.w, e8m0_decode(p.ws).contiguous(),
                 _out(p)) for p in sets]

    def run(x, xs, w, ws, y):
        dg.fp8_einsum(deepgemm.EINSUM, (x, xs), (w, ws), y, recipe=deepgemm.RECIPE)
        return y

    msg = check_close(run(*prepared[0]), sets[0], "gemm")
    return [(lambda a=a: run(*a)) for a in prepared], msg


def _vllm_quant_call(quant, p: Problem):
    """vLLM's quant over ``p`` as its Hopper layers call it (fp32 scales for DeepGEMM's sm_90
    recipe), given its ``[P, rope_dim]`` fp32 cos || sin cache of our tables' values."""
    import torch

    cache = torch.cat([p.cos_bf16, p.sin_bf16], 1).float()
    rope_dim = cache.shape[1]
    return lambda: quant(p.o, p.pos, cache, n_groups=p.g, heads_per_group=p.o.shape[1] // p.g,
                         nope_dim=p.o.shape[2] - rope_dim, rope_dim=rope_dim,
                         quant_group_size=128, tma_aligned_scales=False)


def quant_vllm(sets, on_gpu):
    from torch_bridge import interop

    if not on_gpu:
        raise Skip("vLLM's kernel casts with .to(float8e4nv), which the Triton interpreter "
                   "rounds otherwise than a GPU (127.0 to 64.0)")
    calls = [_vllm_quant_call(peers.vllm_quant(), p) for p in sets]
    q, scale = calls[0]()
    return calls, check_quant_near(q, interop.e8m0_bytes(scale), sets[0], "quant_cuda_floor")


def chain_peer(sets, on_gpu):
    import torch

    from torch_bridge.backends.torch_ref import e8m0_decode

    dg = peers.deep_gemm(pdl=True)  # as vLLM sets it on sm_90 and later
    quant = peers.vllm_quant()

    def chain(p, quant_call, ws):
        x, xs = quant_call()
        z = torch.empty((p.m, p.g, p.w.shape[1]), dtype=torch.bfloat16, device=x.device)
        dg.fp8_einsum(deepgemm.EINSUM, (x, xs), (p.w, ws), z, recipe=deepgemm.RECIPE)
        return z

    prepared = [(p, _vllm_quant_call(quant, p), e8m0_decode(p.ws).contiguous()) for p in sets]
    msg = check_close(chain(*prepared[0]), sets[0], "chain_fp8")
    return [(lambda a=a: chain(*a)) for a in prepared], msg


def gemm_scaled_mm(sets, on_gpu):
    import torch

    from torch_bridge.backends.torch_ref import e8m0_decode

    if not on_gpu or torch.cuda.get_device_capability() != (9, 0):
        raise Skip("blockwise torch._scaled_mm runs on sm_90 only")
    prepared = []
    for p in sets:
        mp = -(-p.m // 4) * 4  # M padded to a multiple of 4
        xg = torch.zeros((p.g, mp, p.x.shape[2]), dtype=p.x.dtype, device=p.x.device)
        xg[:, :p.m] = p.x.transpose(0, 1)
        xs = torch.ones((p.g, mp, p.x.shape[2] // 128), dtype=torch.float32, device=p.x.device)
        xs[:, :p.m] = e8m0_decode(p.xs).transpose(0, 1)
        ws = e8m0_decode(p.ws)
        sa = [xs[i].t().contiguous().t() for i in range(p.g)]
        sb = [ws[i].contiguous().t() for i in range(p.g)]
        prepared.append((xg, sa, sb, p))

    def run(xg, sa, sb, p):
        return [torch._scaled_mm(xg[i], p.w[i].t(), scale_a=sa[i], scale_b=sb[i],
                                 out_dtype=torch.bfloat16) for i in range(p.g)]

    p0 = sets[0]
    msg = check_close(torch.stack(run(*prepared[0]), 1)[:p0.m], p0, "gemm")
    return [(lambda a=a: run(*a)) for a in prepared], msg


def gemm_bf16(sets, on_gpu):
    import torch

    from torch_bridge.backends.torch_ref import e8m0_decode

    # The activations dequantized to bf16 (exact: fp8 times a power of two).
    xb = [(p.x.float() * e8m0_decode(p.xs).repeat_interleave(128, 2)).to(torch.bfloat16)
          for p in sets]

    def run(x, p):
        return torch.einsum("mgk,gnk->mgn", x, p.w_bf16)

    msg = check_close(run(xb[0], sets[0]), sets[0], "gemm")
    return [(lambda x=x, p=p: run(x, p)) for x, p in zip(xb, sets, strict=True)], msg


def projection(p: Problem, backend: str):
    """The product's layer object over ``p``'s checkpoint-layout weight."""
    from torch_bridge import WoAProjection

    return WoAProjection(p.w.flatten(0, 1), p.ws.flatten(0, 1), p.g, p.cos32, p.sin32,
                         backend=backend)


def gemm_deepgemm_op(sets, on_gpu):
    """The public op on the deepgemm backend: its E8M0 scales converted on each call."""
    import torch_bridge as tb

    _deepgemm_backend_here()

    def gemm(p, out):
        return tb.batched_gemm_a8w8_mxscale(p.x, p.w, p.xs, p.ws, backend="deepgemm", out=out)

    outs = [_out(p) for p in sets]
    msg = check_close(gemm(sets[0], outs[0]), sets[0], "gemm")
    return [(lambda p=p, y=y: gemm(p, y)) for p, y in zip(sets, outs, strict=True)], msg


def chain_fp8_deepgemm(sets, on_gpu):
    """``WoAProjection(backend="deepgemm")``: our quant writing DeepGEMM's scales, then its
    einsum. The check also says whether its bytes equal the Triton layer's, the condition for
    ``auto`` ever taking it."""
    import torch

    _deepgemm_backend_here()
    layers = [projection(p, "deepgemm") for p in sets]
    p0 = sets[0]
    y = layers[0](p0.o, p0.pos)
    msg = check_close(y, p0, "chain_fp8_layer")
    same = torch.equal(y, projection(p0, "triton")(p0.o, p0.pos))
    msg += f", bytes {'equal to' if same else 'differ from'} the triton layer"
    return [(lambda f=f, p=p: f(p.o, p.pos)) for f, p in zip(layers, sets, strict=True)], msg


def _deepgemm_backend_here() -> None:
    """Skip where the backend cannot run; else set DeepGEMM's process-wide PDL switch to its
    default (off), which the backend leaves as the process has it and ``chain_peer`` turns on."""
    from torch_bridge import _dispatch

    ok, why = _dispatch.get_backend("deepgemm").is_available()
    if not ok:
        raise Skip(f"the deepgemm backend cannot run here: {why}")
    peers.deep_gemm(pdl=False)


def chain_bf16(sets, on_gpu):
    layers = [projection(p, "bf16") for p in sets]
    msg = check_close(layers[0](sets[0].o, sets[0].pos), sets[0], "chain_bf16")
    return [(lambda f=f, p=p: f(p.o, p.pos)) for f, p in zip(layers, sets, strict=True)], msg


def chain_bf16_inplace(sets, on_gpu):
    layers = [projection(p, "bf16") for p in sets]
    p0 = sets[0]
    msg = check_close(layers[0](p0.o.clone(), p0.pos, overwrite_o=True), p0, "chain_bf16")
    return [(lambda f=f, p=p: f(p.o_work, p.pos, overwrite_o=True))
            for f, p in zip(layers, sets, strict=True)], msg


def chain_bf16_ref(sets, on_gpu):
    from torch_bridge.backends.triton import launch

    p0 = sets[0]
    y = launch.wo_a_bf16(p0.o, p0.pos, p0.cos32, p0.sin32, p0.w_bf16, p0.g)
    msg = check_close(y, p0, "chain_bf16")
    return [(lambda p=p: launch.wo_a_bf16(p.o_work, p.pos, p.cos32, p.sin32, p.w_bf16, p.g,
                                          overwrite_o=True)) for p in sets], msg


def chain_fp8(sets, on_gpu):
    layers = [projection(p, "auto") for p in sets]
    p0 = sets[0]
    msg = check_close(layers[0](p0.o, p0.pos), p0, "chain_fp8_layer")
    return ([(lambda f=f, p=p: f(p.o, p.pos)) for f, p in zip(layers, sets, strict=True)],
            f"{msg}, path {layers[0].path}")


def chain_fp8_triton(sets, on_gpu, *, single_kernel=None, config=None):
    """The layer on the Triton backend (``WoAProjection(..., backend="triton")``, a layer per
    set, as a model holds one per layer); ``single_kernel`` or ``config``: the launcher with
    that route or launch shape, into the set's output."""
    from torch_bridge.backends.triton import launch

    if single_kernel is None and config is None:
        layers = [projection(p, "triton") for p in sets]
        p0 = sets[0]
        msg = check_close(layers[0](p0.o, p0.pos), p0, "chain_fp8_layer")
        return [(lambda f=f, p=p: f(p.o, p.pos)) for f, p in zip(layers, sets, strict=True)], msg

    def chain(p, y):
        return launch.wo_a_fp8(p.o, p.pos, p.cos_bf16, p.sin_bf16, p.w, p.ws, p.g, out=y,
                               single_kernel=single_kernel, config=config)

    outs = [_out(p) for p in sets]
    msg = check_close(chain(sets[0], outs[0]), sets[0], "chain_fp8")
    return [(lambda p=p, y=y: chain(p, y)) for p, y in zip(sets, outs, strict=True)], msg


chain_fp8_triton_2k = functools.partial(chain_fp8_triton, single_kernel=False)


def _read_weight(sets, on_gpu):
    from .read_floor import read_weight

    return read_weight(sets, on_gpu)


def _jax_providers() -> list[Provider]:
    from . import jax_providers as jp

    return [Provider("gemm_jax", "jax_ops.batched_gemm_a8w8_mxscale under jax.jit",
                     jp.gemm_jax, jax=True),
            Provider("chain_fp8_jax", "jax_ops.wo_a_fp8 under jax.jit", jp.chain_fp8_jax,
                     jax=True),
            Provider("chain_fp8_jax_cb", "jax_ops.wo_a_fp8, callback route in command buffers",
                     jp.chain_fp8_jax_cb, jax=True)]


PROVIDERS: dict[str, Provider] = {p.name: p for p in [
    Provider("copy", "device-to-device copy (bandwidth ceiling; only when named)", None),
    Provider("read_weight", "a kernel that only reads the FP8 weight: the decode GEMM's "
             "memory floor", _read_weight),
    Provider("quant_triton", "Triton inverse RoPE + 1x128 E8M0 quant", quant_triton),
    Provider("gemm_triton", "Triton block-scaled FP8 batched GEMM", gemm_triton),
    Provider("quant_vllm", "vLLM 0.33's fused inverse RoPE + FP8 quant (Triton, PDL), fp32 "
             "scales in DeepGEMM's layout", quant_vllm),
    Provider("gemm_deepgemm", "DeepGEMM fp8_einsum('bhr,hdr->bhd'), scales in its layout",
             gemm_deepgemm),
    Provider("gemm_deepgemm_op", "batched_gemm_a8w8_mxscale(backend='deepgemm'): DeepGEMM "
             "through the public op", gemm_deepgemm_op),
    Provider("gemm_scaled_mm", "torch._scaled_mm blockwise, one call per group", gemm_scaled_mm),
    Provider("gemm_bf16", "torch bf16 einsum of the dequantized operands", gemm_bf16),
    Provider("chain_bf16", "WoAProjection(backend='bf16'): the shipped fallback, copying o",
             chain_bf16),
    Provider("chain_bf16_inplace", "the shipped fallback with overwrite_o=True",
             chain_bf16_inplace),
    Provider("chain_bf16_ref", "Triton in-place inverse RoPE + torch bf16 bmm (cuBLAS)",
             chain_bf16_ref),
    Provider("chain_fp8", "WoAProjection(backend='auto'): the shipped layer as users call it",
             chain_fp8),
    Provider("chain_fp8_triton", "WoAProjection on Triton (fused at decode, else quant + GEMM)",
             chain_fp8_triton),
    Provider("chain_fp8_triton_2k", "Triton quant + GEMM, always two kernels",
             chain_fp8_triton_2k),
    Provider("chain_fp8_deepgemm", "WoAProjection(backend='deepgemm'): Triton quant + "
             "DeepGEMM", chain_fp8_deepgemm),
    Provider("chain_peer", "vLLM 0.33's quant + DeepGEMM fp8_einsum, PDL: vLLM's Hopper chain",
             chain_peer),
    *_jax_providers(),
]}

#: The sweep's rows when ``--providers`` is not given (``copy`` only on request).
DEFAULT = tuple(name for name in PROVIDERS if name != "copy")
