"""The Gluon (explicit-layout Triton) kernels compile for Hopper, checked on a machine without
one: the wgmma GEMM, its warp-specialized variant and the fused FP8 chain on the wgmma GEMM's
tile. Each check compiles the launch shapes the launchers pick in a subprocess
(``inputs.run_compile_script``: no interpreter, no GPU needed), runs ``ptxas`` on the result and
looks for the instructions the design relies on (``test_codegen.py`` has the Triton kernels).
"""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

from inputs import run_compile_script  # noqa: E402

_GLUON_SCRIPT = textwrap.dedent("""
    import subprocess, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from torch_bridge.backends.triton import launch, wgmma_kernels

    g, n, sb = 16, 1024, 128
    cfg = launch.gemm_config(8192, g, n, 4096, sb, wgmma=True)
    decode = launch.gemm_config(64, g, n, 4096, sb, wgmma=True)
    swapped = [launch.gemm_config(m, gs, n, 4096, sb, wgmma=True) for m, gs in ((1, 8), (16, g))]
    split = launch.gemm_config(64, 1, n, 4096, sb, wgmma=True)
    assert cfg.wgmma and decode.wgmma and all(c.wgmma and c.swap_ab for c in swapped)
    assert split.wgmma and split.split_k > 1, split
    # K blocks: 32 (V4), 31 (ends on the other register set), 1 (no unrolled loop); the
    # 99-stage cases ask for more than shared memory holds, so the launcher's cap decides.
    cases = [(cfg.block_m, 128, cfg.num_warps, cfg.num_stages, "bf16", 4096, False, 1),
             (64, 128, 4, 4, "fp32", 4096, False, 1), (128, 128, 8, 4, "bf16", 31 * sb, False, 1),
             (128, 128, 8, 1, "bf16", sb, False, 1), (128, 128, 8, 99, "fp32", 4096, False, 1),
             (64, 128, 4, 99, "bf16", 4096, False, 1),
             (decode.block_m, 128, decode.num_warps, decode.num_stages, "bf16", 4096, False, 1)]
    cases += [(c.block_m, c.block_n, c.num_warps, c.num_stages, "bf16", 4096, True, 1)
              for c in swapped]
    cases += [(16, 128, 4, 99, "fp32", 31 * sb, True, 1), (32, 128, 4, 6, "bf16", sb, True, 1)]
    # Split K: the default G = 1 decode shape, 8 parts of one K block (set A only), 2 parts of
    # an odd count, the swapped tile with fp32 output.
    cases += [(split.block_m, split.block_n, split.num_warps, split.num_stages, "bf16", 4096,
               False, split.split_k), (64, 128, 4, 8, "bf16", 8 * sb, False, 8),
              (128, 128, 8, 4, "bf16", 62 * sb, False, 2), (16, 64, 4, 8, "fp32", 4096, True, 8)]
    # As the chain quant's programmatic dependent: the split decode shapes (G = 1 at 64 tokens,
    # G = 2 at 16) and a narrow tile.
    few = launch.gemm_config(16, 2, n, 4096, sb, wgmma=True)
    assert few.wgmma and few.swap_ab and few.split_k > 1, few
    cases = [(*c, False) for c in cases] + [
        (split.block_m, split.block_n, split.num_warps, split.num_stages, "bf16", 4096, False,
         split.split_k, True),
        (few.block_m, few.block_n, few.num_warps, few.num_stages, "bf16", 4096, True,
         few.split_k, True), (64, 32, 4, 8, "bf16", 4096, False, 1, True)]
    for bm, bn, warps, stages, out, k, swap, split_k, pdl in cases:
        stages = launch.wgmma_stages(stages, k // sb // split_k, bm, bn, sb,
                                     4 if out == "fp32" else 2)
        def desc(dtype, tile):
            layout = gl.NVMMASharedLayout.get_default_for(tile, getattr(gl, dtype))
            short = {"float8e4nv": "fp8e4nv", "bfloat16": "bf16", "float32": "fp32"}[dtype]
            return f"tensordesc<{short}{tile},{layout!r}>"
        sig = {"x_desc": desc("float8e4nv", [bm, sb]), "w_desc": desc("float8e4nv", [bn, sb]),
               "y_desc": desc({"bf16": "bfloat16", "fp32": "float32"}[out], [bm, bn]),
               "xs_ptr": "*u8", "ws_ptr": "*u8", "M": "i32", "num_programs": "i32",
               "part_ptr": "*fp32" if split_k > 1 else "*bf16",
               "count_ptr": "*i32" if split_k > 1 else "*bf16"}
        cx = dict(SXSM=g * k // sb, SXSG=k // sb, SWSG=n // sb * k // sb, SWSN=k // sb, G=g,
                  N=n, K=k, STAGES=stages, num_warps=warps, SWAP_AB=swap, SPLIT_K=split_k,
                  PDL=pdl)
        src = GluonASTSource(wgmma_kernels.batched_gemm_a8w8_mxscale_wgmma_kernel,
                             {**sig, **{c: "constexpr" for c in cx}}, cx,
                             {(i,): [["tt.divisibility", 16]] for i in (3, 4, 7, 8)})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options=dict(num_warps=warps))
        ptx = compiled.asm["ptx"]
        assert compiled.metadata.shared <= 227 * 1024, (bm, stages, out, compiled.metadata.shared)
        with tempfile.TemporaryDirectory() as d:
            open(f"{d}/k.ptx", "w").write(ptx)
            info = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f"{d}/k.ptx",
                                   "-o", f"{d}/k.cubin"], capture_output=True, text=True,
                                  check=True).stderr
        # Split K: an acquire-release ticket, and the other parts read from L2.
        ticket = "atom.global.gpu.acq_rel.add" in ptx and "ld.global.cg" in ptx
        # A dependent requests weight tiles before it waits; a plain launch never waits.
        wait, tma = ptx.find("griddepcontrol.wait"), ptx.find("cp.async.bulk.tensor")
        waits = 0 <= tma < wait if pdl else wait < 0
        print(f"m{bm}n{bn}{'s' if swap else ''}{'P' if pdl else ''} {out} "
              f"k{k // sb}/{split_k} st{stages}", waits,
              "wgmma.mma_async" in ptx,
              "cp.async.bulk.tensor" in ptx, "C7514" not in info,
              " 0 bytes spill stores" in info, ticket == (split_k > 1),
              "mbarrier.inval" not in ptx)
""")


def test_wgmma_gemm_compiles_for_sm90_without_serialized_wgmma(tmp_path):
    """The wgmma GEMM (the default large-M and decode shapes, the swapped decode tiles, the
    4-warp fp32-output shape, odd and single K block counts, the deepest pipelines the
    launcher allows, K split 2 to 8 ways) fits Hopper's shared memory and compiles to sm_90a
    with async wgmma and TMA copies, no register spills, and no ptxas C7514 warning: with it,
    ptxas serializes every wgmma of the kernel and the promotion no longer overlaps the MMAs.
    Split launches, and only they, take an acquire-release ticket and read the parts from L2.
    Launched as the chain quant's dependent (``PDL``) it requests weight tiles before its
    grid-dependency wait; otherwise it never waits."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    lines = run_compile_script(_GLUON_SCRIPT, tmp_path)
    assert lines == [f"{shape} True True True True True True True" for shape in (
        "m128n128 bf16 k32/1 st5", "m64n128 fp32 k32/1 st4", "m128n128 bf16 k31/1 st4",
        "m128n128 bf16 k1/1 st1", "m128n128 fp32 k32/1 st5", "m64n128 bf16 k32/1 st8",
        "m64n128 bf16 k32/1 st8", "m8n64s bf16 k32/1 st8", "m16n64s bf16 k32/1 st6",
        "m16n128s fp32 k31/1 st12", "m32n128s bf16 k1/1 st1", "m64n64 bf16 k32/4 st8",
        "m64n128 bf16 k8/8 st1", "m128n128 bf16 k62/2 st4", "m16n64s fp32 k32/8 st4",
        "m64n64P bf16 k32/4 st8", "m16n64sP bf16 k32/4 st8", "m64n32P bf16 k32/1 st8")], lines


_FUSED_WGMMA_SCRIPT = textwrap.dedent("""
    import subprocess, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from torch_bridge.backends.triton import configs, plans

    n, sb, k, dh, rd = 1024, 128, 4096, 512, 64
    C = configs.GemmConfig

    def desc(dtype, tile):
        layout = gl.NVMMASharedLayout.get_default_for(tile, getattr(gl, dtype))
        short = {"float8e4nv": "fp8e4nv", "bfloat16": "bf16", "float32": "fp32"}[dtype]
        return f"tensordesc<{short}{tile},{layout!r}>"

    # G = 2, one token (K split 4, fp32 tables: products rounded apart) and three (four token
    # rows computed, repeated over the tile's eight), G = 16 (unsplit, as a
    # programmatic dependent), G = 4 with 16 and 32 tokens, 128 weight rows, fp32 output.
    cases = [(2, 1, C(8, 64, 4, True, 4, 8, wgmma=True), "float32", "bf16"),
             (2, 3, C(8, 64, 4, True, 4, 8, wgmma=True), "bfloat16", "bf16"),
             (16, 1, C(8, 64, 1, True, 4, 8, wgmma=True, pdl=True), "bfloat16", "bf16"),
             (4, 16, C(16, 64, 2, True, 4, 8, wgmma=True), "bfloat16", "bf16"),
             (4, 32, C(32, 128, 2, True, 8, 8, wgmma=True), "bfloat16", "fp32")]
    for g, s, cfg, table, out in cases:
        plan, views = plans.wo_a_fp8_wgmma(
            s, dh, rd, g, n, k, sb, cfg, o_row=g * k, cos_row=rd // 2, sin_row=rd // 2,
            w_scale=(n // sb * k // sb, k // sb, 1), y_row=g * n,
            out_bytes=4 if out == "fp32" else 2, fp8="float8_e4m3fn", amax_floor=1e-8,
            o_dtype="bfloat16", rope_dtype=table, target="cuda")
        assert plan.grid == (configs.programs(cfg, s, g, n) * cfg.split_k,), plan.grid
        (_, _, x_tile), (_, _, w_tile), (_, _, y_tile) = views
        short = {"float32": "fp32", "bfloat16": "bf16"}[table]
        split = cfg.split_k > 1
        sig = {"x_desc": desc("float8e4nv", list(x_tile)),
               "w_desc": desc("float8e4nv", list(w_tile)),
               "y_desc": desc({"bf16": "bfloat16", "fp32": "float32"}[out], list(y_tile)),
               "o_ptr": "*bf16", "pos_ptr": "*i32", "cos_ptr": f"*{short}",
               "sin_ptr": f"*{short}", "ws_ptr": "*u8", "M": "i32", "n_pos_rows": "i32",
               "num_programs": "i32", "x_ptr": "*fp8e4nv", "xs_ptr": "*u8",
               "part_ptr": "*fp32" if split else f"*{out}",
               "count_ptr": "*i32" if split else f"*{out}"}
        cx = dict(plan.constexprs)
        src = GluonASTSource(plan.kernel, {**sig, **{c: "constexpr" for c in cx}}, cx,
                             {(i,): [["tt.divisibility", 16]] for i in (3, 7, 11, 12)})
        options = dict(num_warps=plan.num_warps, **({"launch_pdl": True} if cfg.pdl else {}))
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        ptx = compiled.asm["ptx"]
        with tempfile.TemporaryDirectory() as d:
            open(f"{d}/k.ptx", "w").write(ptx)
            info = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f"{d}/k.ptx",
                                   "-o", f"{d}/k.cubin"], capture_output=True, text=True,
                                  check=True).stderr
        tma, load = ptx.find("cp.async.bulk.tensor"), ptx.find("ld.global")
        fence = ptx.find("fence.proxy.async.shared::cta")
        wait = ptx.find("griddepcontrol.wait")
        # o is read, and the activations written to shared memory and fenced for the tensor
        # cores, before the weight's first tiles are requested, never copied through global
        # memory; a dependent waits before any of it.
        order = (0 <= load < fence < tma < ptx.find("wgmma.mma_async")
                 and "fence.proxy.async.global" not in ptx)
        waits = 0 <= wait < load if cfg.pdl else wait < 0
        print(f"G{g} M{s} {cfg.label()} {table} {out}", order, waits,
              "wgmma.mma_async" in ptx, "C7514" not in info, " 0 bytes spill stores" in info,
              ("mul.rn.f32" in ptx) == (table == "float32"),
              ("atom.global.gpu.acq_rel.add" in ptx) == split,
              compiled.metadata.shared <= configs.SMEM_BYTES, "mbarrier.inval" not in ptx)
""")


def test_fused_wgmma_chain_compiles_for_sm90(tmp_path):
    """The fused chain on the wgmma GEMM's swapped tile compiles to sm_90a at the launch shapes
    of ``plans.wo_a_fp8_wgmma`` (split and unsplit, 8 to 32 tokens, bf16 and fp32 tables and
    outputs, as a programmatic dependent): async wgmma, no spills, no serialized wgmma (ptxas
    C7514), shared memory within Hopper's; ``o`` read and the activations written to shared
    memory and fenced for the MMAs that read them before the weight tiles are requested; a
    dependent waits before any of them; products rounded apart with fp32 tables; split-K's
    tickets."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    lines = run_compile_script(_FUSED_WGMMA_SCRIPT, tmp_path)
    assert lines == [f"{shape} True True True True True True True True True" for shape in (
        "G2 M1 m8n64k4sw4st8W float32 bf16", "G2 M3 m8n64k4sw4st8W bfloat16 bf16",
        "G16 M1 m8n64k1sw4st8WP bfloat16 bf16",
        "G4 M16 m16n64k2sw4st8W bfloat16 bf16", "G4 M32 m32n128k2sw8st8W bfloat16 fp32")], lines


_GLUON_WS_SCRIPT = textwrap.dedent("""
    import dataclasses, inspect, re, subprocess, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from torch_bridge.backends.triton import configs, wgmma_ws_kernels

    kernel = wgmma_ws_kernels.batched_gemm_a8w8_mxscale_wgmma_ws_kernel
    n, k, sb = 1024, 4096, 128
    for m, g, pdl in ((8192, 16, False), (8192, 16, True), (64, 2, True)):
        # The launch the torch and JAX launchers make for the persistent large-M tile and the
        # 16-row decode tile (PDL: the FP8 chain's, a dependent of its quant).
        cfg = dataclasses.replace(configs.gemm_config(m, g, n, k, sb, wgmma=True), pdl=pdl)
        assert configs.warp_specialized(cfg), cfg
        launch = configs.wgmma_launch(m, g, n, k, sb, cfg, out_bytes=2, sms=132,
                                      x_row=g * k, y_row=g * n,
                                      scale_strides=(g * k // sb, k // sb, n // sb * k // sb,
                                                     k // sb))
        def desc(dtype, tile):
            layout = gl.NVMMASharedLayout.get_default_for(tile, getattr(gl, dtype))
            short = {"float8e4nv": "fp8e4nv", "bfloat16": "bf16"}[dtype]
            return f"tensordesc<{short}{tile},{layout!r}>"
        (_, _, x_tile), (_, _, w_tile), (_, _, y_tile) = launch.views
        sig = {"x_desc": desc("float8e4nv", list(x_tile)),
               "w_desc": desc("float8e4nv", list(w_tile)),
               "y_desc": desc("bfloat16", list(y_tile)), "xs_ptr": "*u8", "ws_ptr": "*u8",
               "M": "i32", "num_programs": "i32", "part_ptr": "*bf16", "count_ptr": "*bf16"}
        cx = {p.name: p.default for p in kernel.params if p.name not in sig
              and p.default is not inspect.Parameter.empty}
        cx.update(launch.constexprs)
        src = GluonASTSource(kernel, {**sig, **{c: "constexpr" for c in cx}}, cx,
                             {(i,): [["tt.divisibility", 16]] for i in (3, 4, 5, 7, 8)})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options=dict(num_warps=cfg.num_warps))
        ptx = compiled.asm["ptx"]
        assert compiled.metadata.shared <= 227 * 1024, compiled.metadata.shared
        with tempfile.TemporaryDirectory() as d:
            open(f"{d}/k.ptx", "w").write(ptx)
            info = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f"{d}/k.ptx",
                                   "-o", f"{d}/k.cubin"], capture_output=True, text=True,
                                  check=True).stderr
        # Warp specialization: the consumers' warps plus the producer's warpgroup, registers
        # moved from the producer (setmaxnreg) to the consumers (240 a thread beside two
        # consumer warpgroups, 256 beside one).
        regs = {int(r) for r in re.findall(r"setmaxnreg[.]\\w+[.]sync[.]aligned[.]u32\\s+(\\d+)",
                                           ptx)}
        split = compiled.metadata.num_warps == cfg.num_warps + 4 and \\
            cx["PRODUCER_NUM_REGS"] in regs and max(regs) >= 240
        # Each stage release (one thread's arrive) follows a barrier of both consumer
        # warpgroups, so neither still reads the stage.
        lines = [" ".join(line.split()) for line in ptx.splitlines()]

        def last(i, *starts):  # the line of the last of these instructions before line i
            return max((j for j in range(i) if lines[j].startswith(starts)), default=-1)

        arrives = [i for i, line in enumerate(lines) if "mbarrier.arrive.shared" in line]
        fenced = bool(arrives) and all(
            last(i, "wgmma.wait_group") < last(i, f"bar.sync 0, {32 * cfg.num_warps};")
            for i in arrives)
        # The scales are staged once per tile: a few global loads, none per K block.
        staged = ptx.count("ld.global") < k // sb // 4
        print(f"M{m} G{g} n{cfg.block_n} st{cx['STAGES']} pdl {pdl}", split,
              "griddepcontrol.wait" in ptx, fenced, "wgmma.mma_async" in ptx,
              "cp.async.bulk.tensor" in ptx, "mbarrier.arrive.expect_tx" in ptx,
              not re.search(r"C75\\d\\d", info), " 0 bytes spill stores" in info, staged,
              "mbarrier.inval" not in ptx)
""")


def test_wgmma_ws_gemm_compiles_for_sm90(tmp_path):
    """The warp-specialized wgmma GEMM (``wgmma_ws_kernels``) at the launchers' persistent
    large-M launch, G = 16, plain and as the chain's dependent, and at G = 2's 64 x 16 decode
    tile as the chain's dependent, compiles to sm_90a within
    Hopper's shared memory:
    a producer warpgroup beside the consumers with registers moved to the consumers by
    setmaxnreg, each stage released after a barrier of both consumer warpgroups, async wgmma,
    TMA copies with expect-tx barriers, no ptxas performance warning (C75xx: serialized
    wgmma), no spills, the scales read from global memory once per tile, not per K block,
    and no barrier invalidated at exit (each costs the consumers a barrier at the end of every
    launch)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    lines = run_compile_script(_GLUON_WS_SCRIPT, tmp_path)
    assert lines == [f"M{m} G{g} n{n} st{st} pdl {pdl} True {pdl} True True True True True "
                     "True True True"
                     for m, g, n, st, pdl in ((8192, 16, 128, 5, False), (8192, 16, 128, 5, True),
                                              (64, 2, 16, 12, True))], lines
