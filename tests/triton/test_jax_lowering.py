"""The native route's lowering on CPU: the ``woa_triton_launch`` custom calls ``jax_launch``
emits (operands, split-K scratch, one call per chain), and a compile of every launch spec to
sm_90 (a subprocess without ``TRITON_INTERPRET``) lowered to the custom call."""

from __future__ import annotations

import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from inputs import DH, HPG, RD, N, P, run_compile_script

from torch_bridge.backends.triton import configs, jax_launch, launch, xla_ffi


@pytest.fixture
def lowered(monkeypatch):
    """``lowered(fn, *args)``: the CUDA lowering's text of ``jax.jit(fn)``, the native calls'
    kernels not compiled (the specs are checked above, the compile below); the pointer GEMM,
    as the stand-in kernel has no TMA descriptors."""
    monkeypatch.setattr(jax_launch, "capability", lambda: 90)
    monkeypatch.setattr(jax_launch, "wgmma_ok", lambda: False)
    monkeypatch.setattr(xla_ffi, "_registered", lambda: None)
    monkeypatch.setattr(xla_ffi, "compile_kernel", lambda *a: xla_ffi.Compiled(
        np.zeros(4, np.uint8), "kernel", 1, 128, 0, ()))
    return lambda fn, *args: jax.jit(fn).trace(*args).lower(
        lowering_platforms=("cuda",)).as_text()


def _gemm_args(m, g):
    f8, u8 = jnp.float8_e4m3fn, jnp.uint8
    return (jax.ShapeDtypeStruct((m, g, HPG * DH), f8), jax.ShapeDtypeStruct((g, N, HPG * DH), f8),
            jax.ShapeDtypeStruct((m, g, HPG * DH // 128), jnp.float8_e8m0fnu),
            jax.ShapeDtypeStruct((g, N // 128, HPG * DH // 128), u8))


def _calls(text: str) -> list[str]:
    return [line for line in text.splitlines() if "custom_call @woa_triton_launch" in line]


def _attr(line: str, name: str) -> list[int]:
    found = re.search(name + r" = dense<\[?([^\]>]*)\]?>", line).group(1)
    return [int(v) for v in found.split(", ")] if found else []


def test_split_gemm_lowers_with_xla_scratch(lowered):
    """A split launch (M = 16, G = 2: 8 parts) gets zeroed counters made inside the jit as its
    last operand, aliased to its last result (XLA knows the kernel writes them), and the fp32
    parts in one scratch result; the step returns y only. Two layers: a counters operand
    each."""
    cfg = launch.gemm_config(16, 2, N, HPG * DH, 128)
    tiles = configs.programs(cfg, 16, 2, N)
    assert cfg.split_k == 8 and tiles == 32
    parts = 8 * 16 * 2 * N * 4

    def two_layers(x, w, xs, ws):
        y = jax_launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=jnp.bfloat16)
        return y + jax_launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=jnp.bfloat16)

    text = lowered(two_layers, *_gemm_args(16, 2))
    calls = _calls(text)
    assert len(calls) == 2
    for line in calls:
        assert ("output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices "
                "= [2], operand_index = 4, operand_tuple_indices = []>]") in line
        assert line.endswith(f"tensor<{tiles}xi32>) -> (tensor<16x2x{N}xbf16>, "
                             f"tensor<{parts}xui8>, tensor<{tiles}xi32>)")
        assert _attr(line, "params") == [0, 1, 2, 3, -1, 5, 6, 4]  # y, parts, counters
    assert text.count(f"stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> "
                      f"tensor<{tiles}xi32>") >= 1


def test_unsplit_gemm_lowers_without_scratch(lowered):
    text = lowered(lambda *a: jax_launch.batched_gemm_a8w8_mxscale(*a, dtype=jnp.bfloat16),
                   *_gemm_args(16, 16))
    (line,) = _calls(text)
    assert "output_operand_aliases" not in line and "xi32>" not in line
    assert line.endswith(f"-> tensor<16x16x{N}xbf16>")


def test_split_chain_lowers_to_one_call_with_xla_scratch(lowered):
    """The fused chain at M = 1, G = 2 (split K): one custom call, y, then one scratch (the
    activations and the parts), then the counters, aliased."""
    cfg = launch.wo_a_fp8_config(1, 2, N, HPG * DH, 128)
    tiles = configs.programs(cfg, 1, 2, N)
    o = jax.ShapeDtypeStruct((1, 2 * HPG, DH), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((1,), jnp.int32)
    cos = jax.ShapeDtypeStruct((P, RD // 2), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((2, N, HPG * DH), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct((2, N // 128, HPG * DH // 128), jnp.float8_e8m0fnu)
    text = lowered(lambda o, pos, cos, sin, w, ws: jax_launch.wo_a_fp8(
        o, pos, cos, sin, w, ws, 2, amax_floor=1e-8, dtype=jnp.bfloat16), o, pos, cos, cos, w, ws)
    (line,) = _calls(text)
    scratch = 2 * HPG * DH + 128 + cfg.split_k * 2 * N * 4
    assert "output_tuple_indices = [2], operand_index = 6" in line
    assert line.endswith(f"-> (tensor<1x2x{N}xbf16>, tensor<{scratch}xui8>, "
                         f"tensor<{tiles}xi32>)")


def test_fused_wgmma_chain_lowers_with_its_descriptors_on_xla_scratch(lowered, monkeypatch):
    """A wgmma tile of the fused chain (what ``--tuned`` may install as
    ``configs.wo_a_fp8_config``) lowers to one custom call with the pointer kernel's outputs
    at the same split, and three descriptors: x over the scratch (its first piece), w over its
    input and y over the result."""
    cfg = configs.GemmConfig(8, 64, 4, True, 4, 8, wgmma=True)
    monkeypatch.setattr(configs, "wo_a_fp8_config", lambda *a, **k: cfg)
    encodings = ((0, 1, 3, (128, 8)), (0, 1, 3, (128, 64)), (10, 2, 3, (64, 8)))
    monkeypatch.setattr(xla_ffi, "compile_kernel", lambda *a: xla_ffi.Compiled(
        np.zeros(4, np.uint8), "kernel", 1, 128, 0, encodings))
    k = HPG * DH
    o = jax.ShapeDtypeStruct((1, 2 * HPG, DH), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((1,), jnp.int32)
    cos = jax.ShapeDtypeStruct((P, RD // 2), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((2, N, k), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct((2, N // 128, k // 128), jnp.float8_e8m0fnu)
    text = lowered(lambda o, pos, cos, sin, w, ws: jax_launch.wo_a_fp8(
        o, pos, cos, sin, w, ws, 2, amax_floor=1e-8, dtype=jnp.bfloat16), o, pos, cos, cos, w, ws)
    (line,) = _calls(text)
    tiles = configs.programs(cfg, 1, 2, N)
    scratch = 2 * k + 128 + cfg.split_k * 2 * N * 4
    assert line.endswith(f"-> (tensor<1x2x{N}xbf16>, tensor<{scratch}xui8>, "
                         f"tensor<{tiles}xi32>)")
    # Three descriptors, o, positions, cos, sin, w_scale, n_pos, the grid, x (the scratch at
    # 0), its scales and the parts (offsets into it), the counters (M = 1 is specialized away).
    assert _attr(line, "params") == [-2, -1, -1, -1, -1] * 3 + [0, 1, 2, 3, 5, -1, -1, 8, -3, -3,
                                                                6]
    tmaps = _attr(line, "tmaps")
    assert [tmaps[i] for i in (0, 12, 24)] == [8, 4, 7], tmaps
    assert [tmaps[i:i + 2] for i in (8, 20, 32)] == [[1, 2 * k], [2 * N, k], [1, 2 * N]], tmaps


@pytest.mark.parametrize("m,g,split", [(16, 2, True), (64, 16, False)])
def test_unfused_chain_lowers_to_one_call_of_two_kernels(lowered, m, g, split):
    """One custom call with two kernel rows (quant, GEMM) and their parameter maps back to
    back; its results are y and one scratch and, split, the counters (input 6), aliased."""
    o = jax.ShapeDtypeStruct((m, g * HPG, DH), jnp.bfloat16)
    pos = jax.ShapeDtypeStruct((m,), jnp.int32)
    cos = jax.ShapeDtypeStruct((P, RD // 2), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((g, N, HPG * DH), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct((g, N // 128, HPG * DH // 128), jnp.float8_e8m0fnu)
    assert not jax_launch.wo_a_fp8_fits(m, g, N, HPG * DH, 128, DH, RD)
    text = lowered(lambda o, pos, cos, sin, w, ws: jax_launch.wo_a_fp8(
        o, pos, cos, sin, w, ws, g, amax_floor=1e-8, dtype=jnp.bfloat16), o, pos, cos, cos, w, ws)
    (line,) = _calls(text)
    assert 'names = "kernel kernel"' in line
    assert len(_attr(line, "kernels")) == 2 * 11
    assert ("output_tuple_indices = [2], operand_index = 6" in line) == split
    results = line.rsplit(" -> ", 1)[1]
    assert results.count("tensor<") == 2 + split
    assert results.startswith(f"(tensor<{m}x{g}x{N}xbf16>, tensor<")


_COMPILE_SCRIPT = textwrap.dedent("""
    import re
    import jax
    import jax.numpy as jnp
    import numpy as np
    from torch_bridge.backends.triton import configs, jax_launch, launch, xla_ffi

    def compiled(call, in_dtypes):  # a split call's counters come in last
        in_dtypes = [*in_dtypes, *(["int32"] if call.counters else [])]
        dtypes = tuple(np.dtype(d).name for d in (*in_dtypes, *(o.dtype for o in call.out_shape)))
        return xla_ffi.compile_triton(call.kernel, call.args, dtypes, dict(call.constexprs),
                                      call.num_warps, call.num_stages, 90)

    def ptx(call, in_dtypes):
        return compiled(call, in_dtypes).asm["ptx"]

    rope = ["bfloat16", "int32", "bfloat16", "bfloat16"]
    quant_rule = configs.quant_config
    for cfg in (launch.QuantConfig(), launch.QuantConfig(block_r=4, block_h=8)):
        configs.quant_config = lambda s, cfg=cfg, **_: cfg
        call = jax_launch.quant_call(7, 16, 512, 64, 1024, 2, 128,
                                     fp8_dtype=jnp.float8_e4m3fn, amax_floor=1e-8,
                                     o_dtype=jnp.bfloat16, rope_dtype=jnp.bfloat16)
        print(call.kernel.__name__, sorted(set(re.findall(r"ld\\.global\\.v\\d", ptx(call, rope)))))
    rope32 = ["bfloat16", "int32", "float32", "float32"]
    call = jax_launch.quant_call(7, 16, 512, 64, 1024, 2, 128, fp8_dtype=jnp.float8_e4m3fn,
                                 amax_floor=1e-8, o_dtype=jnp.bfloat16, rope_dtype=jnp.float32)
    print("quant fp32 tables", "mul.rn.f32" in ptx(call, rope32))
    call = jax_launch.gemm_call(1, 2, 256, 512, 128, 2, dtype=jnp.bfloat16)
    print("gemm", "wgmma" in ptx(call, ["float8_e4m3fn"] * 2 + ["uint8"] * 2))
    call = jax_launch.gemm_call(8192, 16, 1024, 4096, 128, 8, dtype=jnp.bfloat16, wgmma=True,
                                sms=132)
    k = compiled(call, ["float8_e4m3fn"] * 2 + ["uint8"] * 2)
    print("wgmma", "wgmma.mma_async" in k.asm["ptx"], "cp.async.bulk.tensor" in k.asm["ptx"],
          len(k.metadata.tensordesc_meta))
    for tables, rope_dtype in ((rope, jnp.bfloat16), (rope32, jnp.float32)):
        call = jax_launch.wo_a_fp8_call(1, 128, 512, 64, 1024, 16, 1024, 4096, 128, 8,
                                     fp8_dtype=jnp.float8_e4m3fn, amax_floor=1e-8,
                                     dtype=jnp.bfloat16, o_dtype=jnp.bfloat16,
                                     rope_dtype=rope_dtype)
        code = ptx(call, tables + ["float8_e4m3fn", "uint8"])
        print("fused", "wgmma" in code, "cvt.rn.satfinite.e4m3x2.f32" in code,
              "mul.rn.f32" in code)

    # Split K (the GEMM at G = 1, the fused chain at G = 2) on XLA's scratch: both take tickets.
    ins = ["float8_e4m3fn"] * 2 + ["uint8"] * 2
    wg = jax_launch.gemm_call(64, 1, 1024, 4096, 128, 8, dtype=jnp.bfloat16, wgmma=True, sms=132)
    chain = jax_launch.wo_a_fp8_call(1, 16, 512, 64, 1024, 2, 1024, 4096, 128, 8,
                                     fp8_dtype=jnp.float8_e4m3fn, amax_floor=1e-8,
                                     dtype=jnp.bfloat16, o_dtype=jnp.bfloat16,
                                     rope_dtype=jnp.bfloat16)
    print("split", *("atom.global" in compiled(c, i).asm["ptx"] for c, i in (
        (wg, ins), (chain, rope + ["float8_e4m3fn", "uint8"]))))
    # The unfused chain at G = 2, M = 64: the quant and the wgmma GEMM, both programmatic.
    jax_launch.pdl_ok = lambda: True
    configs.quant_config = quant_rule
    chain = jax_launch.wo_a_fp8_chain_call(64, 16, 512, 64, 1024, 2, 1024, 4096, 128, 8,
                                           fp8_dtype=jnp.float8_e4m3fn, amax_floor=1e-8,
                                           dtype=jnp.bfloat16, o_dtype=jnp.bfloat16,
                                           rope_dtype=jnp.bfloat16, wgmma=True, sms=132)
    names = (*rope, "float8_e4m3fn", "uint8", *(["int32"] if chain.counters else []),
             *(np.dtype(o.dtype).name for o in chain.out_shape))
    for step in chain.launches:
        k = xla_ffi.compile_triton(step.kernel, step.args, names, dict(step.constexprs),
                                   step.num_warps, step.num_stages, 90)
        print("chain", step.kernel.__name__, k.metadata.launch_pdl,
              "griddepcontrol.wait" in k.asm["ptx"])
    # Lowered for CUDA: one custom call carrying the cubin and the parameter map.
    jax_launch.capability = lambda: 90
    jax_launch.wgmma_ok.cache_clear()  # the calls above asked it off Hopper
    jax_launch.sm_count = lambda: 132
    xla_ffi._registered = lambda: None
    f8, u8 = jnp.float8_e4m3fn, jnp.uint8
    args = (jax.ShapeDtypeStruct((8192, 16, 4096), f8), jax.ShapeDtypeStruct((16, 1024, 4096), f8),
            jax.ShapeDtypeStruct((8192, 16, 32), u8), jax.ShapeDtypeStruct((16, 8, 32), u8))
    text = jax.jit(lambda *a: jax_launch.batched_gemm_a8w8_mxscale(*a, dtype=jnp.bfloat16)).trace(
        *args).lower(lowering_platforms=("cuda",)).as_text()
    params = re.search(r"params = dense<\\[([^\\]]*)\\]>", text).group(1)
    print("lowered", text.count("custom_call @woa_triton_launch"),
          "cubin = dense<\\"0x7F454C46" in text, params)
    # A wgmma tile of the fused chain (as ``--tuned`` may install it): the Gluon kernel.
    configs.wo_a_fp8_config = lambda *a, **k: launch.GemmConfig(8, 64, 4, True, 4, 8,
                                                                wgmma=True)
    fused = jax_launch.wo_a_fp8_call(1, 16, 512, 64, 1024, 2, 1024, 4096, 128, 8,
                                     fp8_dtype=jnp.float8_e4m3fn, amax_floor=1e-8,
                                     dtype=jnp.bfloat16, o_dtype=jnp.bfloat16,
                                     rope_dtype=jnp.bfloat16)
    k = compiled(fused, rope + ["float8_e4m3fn", "uint8"])
    print("fused wgmma", fused.kernel.__name__, "wgmma.mma_async" in k.asm["ptx"],
          "fence.proxy.async.shared::cta" in k.asm["ptx"]
          and "fence.proxy.async.global" not in k.asm["ptx"], "atom.global" in k.asm["ptx"],
          len(k.metadata.tensordesc_meta))
""")


def test_specs_compile_for_sm90(tmp_path):
    """Every native launch compiles to sm_90 with vectorized ``o`` loads (strides marked
    divisible by 16), wgmma and TMA in the wgmma GEMM, wgmma and the hardware fp8 cast in the
    fused chain, and with fp32 tables the rotation's products rounded by ``mul.rn``; split-K's
    tickets in the split wgmma GEMM and fused chain; the unfused chain's quant and GEMM compiled
    as programmatic dependents (``launch_pdl``, ``griddepcontrol.wait``); the GEMM
    lowers to one custom call with the cubin (an ELF) and the descriptors' parameter map; a
    wgmma tile of the fused chain compiles its Gluon kernel (wgmma, the prologue's shared-memory
    writes fenced for the MMAs, none through global memory, split-K's tickets, three
    descriptors). A subprocess, since the
    kernels of this process are interpreted."""
    lines = run_compile_script(_COMPILE_SCRIPT, tmp_path)
    assert len(lines) == 12, lines
    assert lines[0].startswith("inverse_rope_group_quant_kernel "), lines
    assert lines[1].startswith("inverse_rope_group_quant_head_kernel "), lines
    assert "ld.global.v4" in lines[0] and "ld.global.v" in lines[1], lines
    assert lines[2] == "quant fp32 tables True", lines
    assert lines[3] == "gemm True", lines
    assert lines[4] == "wgmma True True 3", lines
    assert lines[5].startswith("fused True True") and lines[6] == "fused True True True", lines
    assert lines[7] == "split True True", lines
    assert lines[8].startswith("chain inverse_rope_group_quant") and lines[8].endswith(
        " True True"), lines
    assert lines[9].startswith("chain batched_gemm_a8w8_mxscale_wgmma") and lines[9].endswith(
        " True True"), lines
    assert lines[10] == ("lowered 1 True -2, -1, -1, -1, -1, -2, -1, -1, -1, -1, -2, -1, -1, -1, "
                        "-1, 2, 3, -1, -1, 4, 4"), lines  # y stands in for the split scratch
    assert lines[11] == "fused wgmma wo_a_fp8_wgmma_kernel True True True 3", lines
