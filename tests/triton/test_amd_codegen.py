"""The Triton kernels compile for AMD Instinct (gfx942 / MI300, gfx950 / MI355X), checked on CPU.

No AMD GPU is at hand, and the interpreter compiles nothing, so a kernel that no longer lowers
for ROCm would pass every other test. This compiles each kernel at the launch shapes
``gemm_config`` / ``quant_config`` pick (and the 32 x 32 scale blocks of V4.1) to an AMD code
object in a subprocess, with each target's fp8 type (e4m3fnuz on gfx942, OCP e4m3fn on gfx950)
and the launcher's ROCm settings (fp32-side RNE before the fp8 cast), and checks that the GEMMs
run on fp8 MFMA instructions and split-K takes its tickets with global atomics.
"""

from __future__ import annotations

import textwrap

import pytest
from _sm90 import run_compile_script

pytest.importorskip("triton")
pytest.importorskip("torch")

_SCRIPT = textwrap.dedent("""
    import re
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from torch_bridge.backends.triton import configs, kernels, launch

    def amdgcn(arch, kernel, sig, cx, aligned=(), num_warps=4, num_stages=2):
        names = list(sig)
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
        src = ASTSource(kernel, signature={**sig, **{k: "constexpr" for k in cx}},
                        constexprs=cx, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("hip", arch, 64), options=dict(
            num_warps=num_warps, num_stages=num_stages))
        assert compiled.asm["hsaco"], (arch, kernel)
        return compiled.asm["amdgcn"]

    def fp8_mfma(asm):
        return any("fp8" in op or "f8f6f4" in op for op in re.findall(r"v_mfma\\w*", asm))

    g, n, k = 16, 1024, 4096
    for arch, fp8_dtype in (("gfx942", torch.float8_e4m3fnuz), ("gfx950", torch.float8_e4m3fn)):
        fp8 = {torch.float8_e4m3fnuz: "fp8e4b8", torch.float8_e4m3fn: "fp8e4nv"}[fp8_dtype]
        # As configs.hw_fp8_cast decides on ROCm (this CPU torch is not a ROCm build).
        name = str(fp8_dtype).removeprefix("torch.")
        consts = {**dict(configs.quant_constants(name, 1e-8, configs.hw_fp8_cast(name, "hip"))),
                  "ROUND_PRODUCTS": configs.round_products("bfloat16", "float32", "hip")}
        # fp32 tables: the rotation rounds each product with v_mul_f32 (inline assembly)
        rope = {"o_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32"}
        rows = {"n_tokens": "i32", "n_pos_rows": "i32", "stride_os": "i32", "stride_cp": "i32",
                "stride_sp": "i32"}
        out = {"q_ptr": f"*{fp8}", "s_ptr": "*u8"}
        qc = launch.quant_config(8192)
        asm = amdgcn(arch, kernels.inverse_rope_group_quant_head_kernel,
                     {**rope, **rows, **out},
                     dict(H=8 * g, DH=512, RD=64, GS=128, BLOCK_T=qc.block_r,
                          BLOCK_H=qc.block_h, **consts), ("o_ptr", "q_ptr"), qc.num_warps)
        assert consts["ROUND_PRODUCTS"] == 2 and "v_mul_f32" in asm
        amdgcn(arch, kernels.inverse_rope_group_quant_kernel,
               {**rope, "n_rows": "i32", **dict(list(rows.items())[1:]), **out},
               dict(NQ=8 * g * 512 // 32, GS=32, DH=512, RD=64, BLOCK_R=32, **consts))
        rotate = {**rope, "n_rows": "i32", "n_pos_rows": "i32", "stride_os": "i32",
                  "stride_oh": "i32", "stride_cp": "i32", "stride_sp": "i32", "y_ptr": "*bf16",
                  "stride_ys": "i32", "stride_yh": "i32"}
        for copy, tails in ((False, False), (True, False), (False, True)):
            amdgcn(arch, kernels.inverse_rope_kernel, rotate,
                   dict(H=8 * g, DH=512, RD=64, BLOCK_R=32, COPY_NOPE=copy, TAIL_ONLY=tails,
                        ROUND_PRODUCTS=consts["ROUND_PRODUCTS"]))
        print(arch, "quant and rope")

        for m, groups, sb in ((1, g, 128), (64, g, 128), (8192, g, 128), (1, 2, 128),
                              (8192, g, 32)):
            cfg = launch.gemm_config(m, groups, n, k, sb)
            sig = {"x_ptr": f"*{fp8}", "w_ptr": f"*{fp8}", "xs_ptr": "*u8", "ws_ptr": "*u8",
                   "M": "i32", "y_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32"}
            cx = dict(SXM=groups * k, SXG=k, SXSM=groups * k // sb, SXSG=k // sb, SWG=n * k,
                      SWN=k, SWSG=n // sb * k // sb, SWSN=k // sb, SYM=groups * n, SYG=n, N=n,
                      K=k, SB=sb, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      SPLIT_K=cfg.split_k, SWAP_AB=cfg.swap_ab, OUT_BF16=True)
            asm = amdgcn(arch, kernels.batched_gemm_a8w8_mxscale_kernel, sig, cx,
                         ("x_ptr", "w_ptr", "xs_ptr", "ws_ptr", "y_ptr"), cfg.num_warps,
                         cfg.num_stages)
            line = [arch, "gemm", f"m{m}g{groups}b{sb}", fp8_mfma(asm)]
            if cfg.split_k > 1:
                line.append("global_atomic" in asm)
            if cfg.tma:
                sig = {"x_desc": f"tensordesc<{fp8}[{cfg.block_m}, {sb}]>",
                       "w_desc": f"tensordesc<{fp8}[{cfg.block_n}, {sb}]>",
                       "y_desc": f"tensordesc<bf16[{cfg.block_m}, {cfg.block_n}]>",
                       "xs_ptr": "*u8", "ws_ptr": "*u8", "M": "i32", "num_programs": "i32"}
                cx = dict(SXSM=groups * k // sb, SXSG=k // sb, SWSG=n // sb * k // sb,
                          SWSN=k // sb, G=groups, N=n, K=k, SB=sb, BLOCK_M=cfg.block_m,
                          BLOCK_N=cfg.block_n, SWAP_AB=cfg.swap_ab, OUT_BF16=True)
                tma_kernel = kernels.batched_gemm_a8w8_mxscale_tma_kernel
                line.append(fp8_mfma(amdgcn(arch, tma_kernel, sig, cx, ("xs_ptr", "ws_ptr"),
                                            cfg.num_warps, cfg.num_stages)))
            print(*line)

        cfg = launch.wo_a_fp8_config(1, 2, n, k, 128)  # the fused decode chain at G = 2
        sig = {**rope, "w_ptr": f"*{fp8}", "ws_ptr": "*u8", "M": "i32", "n_pos_rows": "i32",
               "x_ptr": f"*{fp8}", "xs_ptr": "*u8", "y_ptr": "*bf16", "part_ptr": "*fp32",
               "count_ptr": "*i32"}
        cx = dict(SOM=2 * k, SCP=32, SSP=32, SWG=n * k, SWN=k, SWSG=n // 128 * k // 128,
                  SWSN=k // 128, SYM=2 * n, SYG=n, G=2, N=n, K=k, SB=128, DH=512, RD=64,
                  **consts, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT_K=cfg.split_k,
                  OUT_BF16=True, QUANT_ROWS=configs.WO_A_FP8_QUANT_LANES // 128)
        asm = amdgcn(arch, kernels.wo_a_fp8_kernel, sig, cx, ("o_ptr", "w_ptr"),
                      cfg.num_warps, cfg.num_stages)
        print(arch, "gemm", "fused", fp8_mfma(asm), "global_atomic" in asm)
""")


def test_kernels_compile_for_amd_instinct(tmp_path):
    """Every kernel and launch-shape family compiles for gfx942 and gfx950; GEMMs (pointer
    and tensor-descriptor variants, 128- and 32-wide scale blocks, the fused decode chain) use
    fp8 MFMA, split-K (G = 2 decode) global atomics."""
    lines = run_compile_script(_SCRIPT, tmp_path)
    assert len(lines) == 14, lines
    for arch, part in (("gfx942", lines[:7]), ("gfx950", lines[7:])):
        assert part[0] == f"{arch} quant and rope", part
        for line in part[1:]:
            words = line.split()
            assert words[:2] == [arch, "gemm"] and words[3:] and set(words[3:]) == {"True"}, line
    # The shapes whose extra checks ran: split-K at G = 2 decode, tensor descriptors above M 16.
    assert any(line.startswith("gfx950 gemm m1g2b128 True True") for line in lines), lines
    assert any(line.startswith("gfx950 gemm m8192g16b128 True True") for line in lines), lines
    assert "gfx942 gemm fused True True" in lines and "gfx950 gemm fused True True" in lines
