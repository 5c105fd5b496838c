"""The Triton kernels compile for GPU targets, checked on a machine without one.

Under ``TRITON_INTERPRET=1`` nothing is compiled, so a change that breaks the GPU-only code paths
(the TMA GEMM, split-K's atomics, the hardware fp8 cast, the wgmma kernel) or no longer lowers
for ROCm would pass the interpreter axis of the op tests. Each check compiles the kernels of
every op at the launch shapes the launchers pick, in a subprocess (``inputs.run_compile_script``:
no interpreter, no GPU needed), and looks for the instructions the design relies on:

* Hopper (sm_90): the quant, GEMM and fused FP8 chain kernels (the Gluon kernels:
  ``test_codegen_gluon.py``);
* AMD Instinct (gfx942 / MI300, gfx950 / MI355X), with each target's fp8 type (e4m3fnuz on
  gfx942, OCP e4m3fn on gfx950) and the launcher's ROCm settings (fp32-side RNE before the fp8
  cast): fp8 MFMA GEMMs and split-K tickets taken with global atomics;
* the BF16 chain's GEMM from ``o`` on both.
"""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

from inputs import run_compile_script  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Hopper (sm_90): quant, GEMM and the fused FP8 chain
# ---------------------------------------------------------------------------------------------

_SM90_SCRIPT = textwrap.dedent("""
    import inspect
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from torch_bridge.backends.triton import _common, configs, kernels, launch, quant_kernels

    def defaults(kernel, sig, cx):
        # The constexprs a launcher leaves at their defaults (PDL off).
        return {p.name: p.default for p in kernel.params if p.name not in sig
                and p.name not in cx and p.default is not inspect.Parameter.empty}

    def ptx(kernel, sig, cx, aligned, num_warps=4, num_stages=4):
        # Like torch's launcher: pointers and ints that are multiples of 16 carry the hint.
        cx = {**defaults(kernel, sig, cx), **cx}
        names = list(sig)
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
        sig = {**sig, **{k: "constexpr" for k in cx}}
        src = ASTSource(kernel, signature=sig, constexprs=cx, attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(
            num_warps=num_warps, num_stages=num_stages)).asm["ptx"]

    g, n, k, sb = 16, 1024, 4096, 128
    scales = dict(SXSM=g * k // sb, SXSG=k // sb, SWSG=n // sb * k // sb, SWSN=k // sb)
    for cfg in (launch.gemm_config(8192, g, n, k, sb),
                launch.GemmConfig(64, 64, swap_ab=True, num_stages=6, tma=True)):
        assert cfg.tma, cfg
        sig = {"x_desc": f"tensordesc<fp8e4nv[{cfg.block_m}, {sb}]>",
               "w_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {sb}]>",
               "y_desc": f"tensordesc<bf16[{cfg.block_m}, {cfg.block_n}]>",
               "xs_ptr": "*u8", "ws_ptr": "*u8", "M": "i32", "num_programs": "i32"}
        cx = dict(scales, G=g, N=n, K=k, SB=sb, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                  SWAP_AB=cfg.swap_ab, OUT_BF16=True)
        code = ptx(kernels.batched_gemm_a8w8_mxscale_tma_kernel, sig, cx, ("xs_ptr", "ws_ptr"),
                   cfg.num_warps, cfg.num_stages)
        print("tma", cfg.label(), "wgmma" in code, "cp.async.bulk.tensor" in code)

    # The decode tile without wgmma (17-64 tokens): pointer loads pipelined by cp.async.
    cfg = launch.gemm_config(64, g, n, k, sb)
    assert not (cfg.tma or cfg.wgmma or cfg.swap_ab) and cfg.split_k == 1, cfg
    sig = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "xs_ptr": "*u8", "ws_ptr": "*u8",
           "M": "i32", "y_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32"}
    cx = dict(scales, SXM=g * k, SXG=k, SWG=n * k, SWN=k, SYM=g * n, SYG=n, N=n, K=k, SB=sb,
              BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT_K=1, SWAP_AB=False,
              OUT_BF16=True)
    code = ptx(kernels.batched_gemm_a8w8_mxscale_kernel, sig, cx,
               ("x_ptr", "w_ptr", "xs_ptr", "ws_ptr", "M", "y_ptr"),
               cfg.num_warps, cfg.num_stages)
    print("pointer", cfg.label(), "wgmma" in code, "cp.async.cg.shared.global" in code)

    cfg = launch.gemm_config(1, 2, n, k, sb)
    assert cfg.split_k > 1, cfg
    # M = 1 arrives as a constexpr (Triton specializes integer arguments equal to 1).
    split = {"part_ptr": "*fp32", "count_ptr": "*i32"}
    sig = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "xs_ptr": "*u8", "ws_ptr": "*u8",
           "M": "constexpr", "y_ptr": "*bf16", **split}
    cx = dict(M=1, SXM=2 * k, SXG=k, SXSM=2 * k // sb, SXSG=k // sb, SWG=n * k, SWN=k,
              SWSG=n // sb * k // sb, SWSN=k // sb, SYM=2 * n, SYG=n, N=n, K=k, SB=sb,
              BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT_K=cfg.split_k,
              SWAP_AB=cfg.swap_ab, OUT_BF16=True)
    code = ptx(kernels.batched_gemm_a8w8_mxscale_kernel, sig, cx,
               ("x_ptr", "w_ptr", "xs_ptr", "ws_ptr", "y_ptr", "part_ptr", "count_ptr"),
               cfg.num_warps, cfg.num_stages)

    def serial_split(code):  # an acquire-release ticket; the parts read back from L2
        return "atom.global.gpu.acq_rel.add" in code and "ld.global.cg" in code

    print("split", cfg.label(), "wgmma" in code, serial_split(code))

    qc = launch.quant_config(8192)
    assert qc.block_h, qc
    sig = {"o_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
           "n_tokens": "i32", "n_pos_rows": "i32", "stride_os": "i32", "stride_cp": "i32",
           "stride_sp": "i32", "q_ptr": "*fp8e4nv", "s_ptr": "*u8"}
    import torch
    cx = dict(H=128, DH=512, RD=64, GS=128, BLOCK_T=qc.block_r, BLOCK_H=qc.block_h,
              **dict(configs.quant_constants("float8_e4m3fn", 1e-8, True)), ROUND_PRODUCTS=0)
    assert cx["HW_CAST"]
    code = ptx(quant_kernels.inverse_rope_group_quant_head_kernel, sig, cx,
               ("o_ptr", "pos_ptr", "cos_ptr", "sin_ptr", "stride_os", "stride_cp", "stride_sp",
                "q_ptr", "s_ptr"), qc.num_warps)
    print("quant", "cvt.rn.satfinite.e4m3x2.f32" in code, "ld.global.v4" in code)
    # Decode batches: whole head rows, 1 and 2 tokens a program, as programmatic dependents.
    whole = []
    for s in (1, 16):
        qc = launch.quant_config(s, heads=128, dependent=True)
        assert qc.whole_head and qc.pdl, qc
        code = ptx(quant_kernels.inverse_rope_group_quant_head_kernel, sig,
                   dict(cx, BLOCK_T=qc.block_r, BLOCK_H=qc.block_h, WHOLE_HEAD=True, PDL=True),
                   ("o_ptr", "pos_ptr", "cos_ptr", "sin_ptr", "stride_os", "stride_cp",
                    "stride_sp", "q_ptr", "s_ptr"), qc.num_warps)
        whole.append("cvt.rn.satfinite.e4m3x2.f32" in code and "ld.global.v4" in code
                     and "griddepcontrol.wait" in code)
    print("quant whole", *whole)
    # DeepGEMM's token-major fp32 scales, by whole rows (decode) and by groups.
    mn = []
    for s, whole_head in ((16, True), (8192, False)):
        qc = launch.quant_config(s, heads=128)
        assert qc.whole_head is whole_head, qc
        code = ptx(quant_kernels.inverse_rope_group_quant_head_kernel, dict(sig, s_ptr="*fp32"),
                   dict(cx, BLOCK_T=qc.block_r, BLOCK_H=qc.block_h, WHOLE_HEAD=whole_head,
                        PDL=qc.pdl, SCALE_MN_ALIGN=4),
                   ("o_ptr", "pos_ptr", "cos_ptr", "sin_ptr", "stride_os", "stride_cp",
                    "stride_sp", "q_ptr", "s_ptr"), qc.num_warps)
        mn.append("cvt.rn.satfinite.e4m3x2.f32" in code and "ld.global.v4" in code
                  and "st.global.b32" in code)
    print("quant mn", *mn)

    # The fused chain at its G = 2 decode shape: wgmma and serial split-K; fp32 tables, so
    # the rotation's products are rounded by mul.rn (configs.round_products).
    cfg = launch.wo_a_fp8_config(1, 2, n, k, sb)
    sig = {"o_ptr": "*bf16", "pos_ptr": "*i32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
           "w_ptr": "*fp8e4nv", "ws_ptr": "*u8", "M": "i32", "n_pos_rows": "i32",
           "x_ptr": "*fp8e4nv", "xs_ptr": "*u8", "y_ptr": "*bf16", **split}
    cx = dict(SOM=2 * k, SCP=32, SSP=32, SWG=n * k, SWN=k, SWSG=n // sb * k // sb,
              SWSN=k // sb, SYM=2 * n, SYG=n, G=2, N=n, K=k, SB=sb, DH=512, RD=64,
              **dict(configs.quant_constants("float8_e4m3fn", 1e-8, True)),
              ROUND_PRODUCTS=configs.round_products("bfloat16", "float32", "cuda"),
              BLOCK_M=cfg.block_m,
              BLOCK_N=cfg.block_n, SPLIT_K=cfg.split_k, OUT_BF16=True,
              QUANT_ROWS=configs.WO_A_FP8_QUANT_LANES // sb)
    code = ptx(kernels.wo_a_fp8_kernel, sig, cx,
               tuple(sig)[:6] + ("x_ptr", "xs_ptr", "y_ptr", *split), cfg.num_warps,
               cfg.num_stages)
    print("fused", cfg.label(), "wgmma" in code, serial_split(code),
          "cvt.rn.satfinite.e4m3x2.f32" in code, "mul.rn.f32" in code)
""")


def test_gpu_only_paths_compile_for_sm90(tmp_path):
    """TMA GEMM tiles (large M and the swapped decode tile) use wgmma and the bulk tensor
    copy; the default decode tile without wgmma (64 x 64 pointer loads) uses wgmma fed by
    cp.async; split-K uses wgmma, an acquire-release ticket and L2 reads of the parts; the
    per-head quant kernel uses the hardware RNE fp8 cast and 16-byte loads, by groups and by
    whole head rows (waiting for the kernel before it, as a dependent), and writes fp32
    token-major scales for DeepGEMM either way. The fused chain uses
    wgmma, serial split-K, the hardware cast and, with fp32 tables, products rounded apart."""
    lines = run_compile_script(_SM90_SCRIPT, tmp_path)
    assert len(lines) == 8, lines
    assert lines[0].startswith("tma ") and lines[0].endswith("True True"), lines
    assert lines[1].startswith("tma ") and lines[1].endswith("True True"), lines
    assert lines[2].startswith("pointer ") and lines[2].endswith("True True"), lines
    assert lines[3].startswith("split ") and lines[3].endswith("True True"), lines
    assert lines[4] == "quant True True", lines
    assert lines[5] == "quant whole True True", lines
    assert lines[6] == "quant mn True True", lines
    assert lines[7].startswith("fused ") and lines[7].endswith("True True True True"), lines


# ---------------------------------------------------------------------------------------------
# AMD Instinct (gfx942, gfx950): every kernel of the FP8 ops
# ---------------------------------------------------------------------------------------------

_AMD_SCRIPT = textwrap.dedent("""
    import inspect
    import re
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from torch_bridge.backends.triton import _common, configs, kernels, launch, quant_kernels

    def defaults(kernel, sig, cx):
        # The constexprs a launcher leaves at their defaults (PDL off).
        return {p.name: p.default for p in kernel.params if p.name not in sig
                and p.name not in cx and p.default is not inspect.Parameter.empty}

    def amdgcn(arch, kernel, sig, cx, aligned=(), num_warps=4, num_stages=2):
        cx = {**defaults(kernel, sig, cx), **cx}
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
        asm = amdgcn(arch, quant_kernels.inverse_rope_group_quant_head_kernel,
                     {**rope, **rows, **out},
                     dict(H=8 * g, DH=512, RD=64, GS=128, BLOCK_T=qc.block_r,
                          BLOCK_H=qc.block_h, **consts), ("o_ptr", "q_ptr"), qc.num_warps)
        assert consts["ROUND_PRODUCTS"] == 2 and "v_mul_f32" in asm
        qc = launch.quant_config(1, heads=8 * g)
        asm = amdgcn(arch, quant_kernels.inverse_rope_group_quant_head_kernel,
                     {**rope, **rows, **out},
                     dict(H=8 * g, DH=512, RD=64, GS=128, BLOCK_T=qc.block_r,
                          BLOCK_H=qc.block_h, WHOLE_HEAD=qc.whole_head, **consts),
                     ("o_ptr", "q_ptr"), qc.num_warps)
        assert qc.whole_head and "v_mul_f32" in asm
        amdgcn(arch, quant_kernels.inverse_rope_group_quant_kernel,
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
    lines = run_compile_script(_AMD_SCRIPT, tmp_path)
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


# ---------------------------------------------------------------------------------------------
# The BF16 chain's GEMM from ``o``: sm_90, gfx942 and gfx950
# ---------------------------------------------------------------------------------------------

_BF16_SCRIPT = textwrap.dedent("""
    import re
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from torch_bridge.backends.triton import bf16_configs, bf16_kernels, configs

    def build(target, kernel, sig, cx, aligned, cfg):
        names = list(sig)
        attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
        src = ASTSource(kernel, signature={**sig, **{k: "constexpr" for k in cx}},
                        constexprs=cx, attrs=attrs)
        return triton.compile(src, target=target, options=dict(
            num_warps=cfg.num_warps, num_stages=cfg.num_stages))

    g, n, k, h, dh, rd = 16, 1024, 4096, 128, 512, 64
    ptr_sig = {"o_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "M": "i32",
               "y_ptr": "*bf16"}
    one_sig = {"o_ptr": "*bf16", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
               "w_ptr": "*bf16", "M": "i32", "n_pos_rows": "i32", "y_ptr": "*bf16",
               "part_ptr": "*fp32", "count_ptr": "*i32"}

    def ptr_cx(cfg, target="cuda"):
        if cfg.rotate:
            return one_sig, bf16_kernels.wo_a_bf16_rotating_kernel, dict(
                SOM=h * dh, SOH=dh, SCP=rd // 2, SSP=rd // 2, SWG=n * k, SWN=k, SYM=g * n, SYG=n,
                HPG=k // dh, DH=dh, RD=rd, N=n, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k, DOT_IN_FP32=False, SETTLE_MMA=target == "cuda",
                ROUND_PRODUCTS=configs.round_products("bfloat16", "float32", target),
                SPLIT_K=cfg.split_k)
        return ptr_sig, bf16_kernels.wo_a_bf16_kernel, dict(
            SOM=h * dh, SOH=dh, SWG=n * k, SWN=k, SYM=g * n, SYG=n, H=h, DH=dh, RD=rd, N=n, K=k,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DOT_IN_FP32=False)

    sm90 = GPUTarget("cuda", 90, 32)
    for s in (8192, 1):
        cfg = bf16_configs.bf16_gemm_config(s, g, n, k)
        sig, kernel, cx = ptr_cx(cfg)
        ptx = build(sm90, kernel, sig, cx, tuple(sig), cfg).asm["ptx"]
        print("sm90 pointer", s, cfg.rotate, "wgmma.mma_async" in ptx or "mma.sync" in ptx,
              "cp.async.cg.shared.global" in ptx and ", 0x10," in ptx)
    # A rotated tile is wgmma's register operand: each loop that feeds one must end with its
    # MMAs complete (a wait with no MMA pending before the loop's yield).
    for s in (64, 16, 1):
        cfg = bf16_configs.bf16_gemm_config(s, g, n, k)
        sig, kernel, cx = ptr_cx(cfg)
        ttgir = build(sm90, kernel, sig, cx, tuple(sig), cfg).asm["ttgir"]
        settled = True
        for body in re.findall(r"scf\\.for.*?scf\\.yield", ttgir, re.S):
            if re.search(r"warp_group_dot %\\S+, .*dot_op<\\{opIdx = 0", body):
                waits = re.findall(r"warp_group_dot_wait.*?pendings = (\\d+)", body)
                settled &= bool(waits) and waits[-1] == "0"
        print("sm90 rotating", s, settled)
    cfg = bf16_configs.Bf16GemmConfig(128, 256, 64, 8, 3, tma=True)
    sig = {"o_desc": "tensordesc<bf16[128, 64]>", "r_desc": "tensordesc<bf16[128, 64]>",
           "w_desc": "tensordesc<bf16[256, 64]>", "M": "i32", "y_ptr": "*bf16"}
    cx = dict(SYM=g * n, SYG=n, HPG=8, DH=dh, RD=rd, N=n, BLOCK_M=128, BLOCK_N=256,
              BLOCK_K=64, DOT_IN_FP32=False)
    ptx = build(sm90, bf16_kernels.wo_a_bf16_tma_kernel, sig, cx, ("y_ptr",),
                cfg).asm["ptx"]
    print("sm90 tma", "wgmma.mma_async" in ptx, "cp.async.bulk.tensor" in ptx)
    for arch in ("gfx942", "gfx950"):
        for s in (8192, 64, 1):
            cfg = bf16_configs.bf16_gemm_config(s, g, n, k, 64, "hip")
            sig, kernel, cx = ptr_cx(cfg, "hip")
            c = build(GPUTarget("hip", arch, 64), kernel, sig, cx, tuple(sig), cfg)
            mfma = re.findall(r"v_mfma\\w*bf16\\w*", c.asm["amdgcn"])
            print(arch, s, bool(c.asm["hsaco"]), bool(mfma), c.metadata.shared <= 65536)
""")


def test_bf16_kernels_compile_for_hopper_and_amd(tmp_path):
    """The pointer kernel at the chosen Hopper shapes (rotating its rope tiles at decode) runs
    tensor-core MMAs fed by 16-byte cp.async copies (the pipelined K loop), keeps no MMA that
    reads a rotated tile in flight into the next iteration, the TMA kernel
    wgmma fed by bulk tensor copies, and the ROCm shapes build for gfx942 / gfx950 with bf16
    MFMA within 64 KiB of LDS."""
    lines = run_compile_script(_BF16_SCRIPT, tmp_path)
    assert lines == ["sm90 pointer 8192 False True True", "sm90 pointer 1 True True True",
                     "sm90 rotating 64 True", "sm90 rotating 16 True", "sm90 rotating 1 True",
                     "sm90 tma True True"] + [f"{arch} {s} True True True"
                                              for arch in ("gfx942", "gfx950")
                                              for s in (8192, 64, 1)], lines
