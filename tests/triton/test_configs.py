"""The launch rules of ``configs`` (torch-free), checked as rules over a sweep of problems.

The tuned numbers (tiles, stages) may change with a new tuning; what these tests pin is what
every choice must satisfy for the kernels to run and give the right bits: valid tiles, split-K
only for grids of few programs and dividing the K blocks, the wgmma kernel only where it has
its tiles, the fused kernel only where its prologue is one step.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys

import pytest

from torch_bridge.backends.triton import configs

MS = (0, 1, 2, 7, 8, 9, 16, 17, 33, 64, 65, 128, 129, 512, 1024, 4096, 8192)
GS = (1, 2, 4, 8, 16)
N, K = 1024, 4096


def _problems():
    for m, g, block in itertools.product(MS, GS, (128, 32)):
        yield m, g, N, K, block


def test_configs_imports_neither_torch_nor_triton():
    """The JAX launcher and the torch launchers share these rules; they must not drag in torch."""
    import subprocess

    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('c', sys.argv[1])\n"
            "module = sys.modules['c'] = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(module)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code, configs.__file__], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("wgmma", [False, True])
def test_gemm_config_rules(wgmma):
    """Every default shape is a valid config; K is split (``k_split``: a divisor of the K blocks,
    about 256 programs in all) exactly for the Triton kernels' grids of ``FEW_PROGRAMS`` or
    fewer; up to 16 tokens the
    tokens are the MMA's N side; the wgmma kernel takes only 128-blocks, and its swapped decode
    tile (no split-K) only from one wave of tiles."""
    for m, g, n, k, block in _problems():
        cfg = configs.gemm_config(m, g, n, k, block, wgmma=wgmma)
        dataclasses.replace(cfg)  # __post_init__ accepts it (raises otherwise)
        kb = k // block
        configs.check_split(cfg, kb)
        if cfg.split_k > 1:
            unsplit = dataclasses.replace(cfg, split_k=1)
            assert cfg.split_k == configs.k_split(unsplit, m, g, n, kb), (m, g, cfg)
            assert configs.programs(unsplit, m, g, n) * cfg.split_k <= 256
            assert not (cfg.tma or cfg.wgmma)
        elif not cfg.wgmma and m > 0:
            assert configs.programs(cfg, m, g, n) > configs.FEW_PROGRAMS or kb == 1 \
                or configs.k_split(cfg, m, g, n, kb) == 1, (m, g, cfg)
        if 0 < m <= 16:
            assert cfg.swap_ab, (m, g, cfg)
        if cfg.wgmma:
            assert wgmma and block == 128 and n % 128 == 0 and block % cfg.block_n == 0
            if cfg.swap_ab:
                assert configs.programs(cfg, m, g, n) >= configs.ONE_WAVE_TILES, (m, g, cfg)


def test_k_split_is_a_divisor_capped_by_programs():
    cfg = configs.GemmConfig(16, 64, swap_ab=True)
    for tiles_g, kb in itertools.product((1, 2, 16, 32, 64), (1, 2, 3, 8, 32)):
        split = configs.k_split(cfg, 1, tiles_g, 64, kb)
        assert kb % split == 0 and 1 <= split <= 8
        assert split == 1 or split * tiles_g <= 256


def test_fused_rules():
    """The fused kernel: swapped pointer tiles of 128 weight rows and 16-64 tokens, 8 warps;
    K split exactly as ``k_split`` splits the GEMM's few-program grids; chosen by default only
    where each program's prologue quantizes at most ``FUSED_QUANT_LANES`` activations."""
    for m, g, n, k, block in _problems():
        cfg = configs.fused_config(m, g, n, k, block)
        assert configs.fused_blocker(512, 64, block, cfg) is None
        assert (cfg.block_n, cfg.num_warps, cfg.swap_ab) == (128, 8, True)
        assert cfg.block_m == min(64, max(16, 1 << max(0, m - 1).bit_length()))
        unsplit = dataclasses.replace(cfg, split_k=1)
        if configs.programs(unsplit, m, g, n) > configs.FEW_PROGRAMS:
            assert cfg.split_k == 1
        else:
            assert cfg.split_k == configs.k_split(unsplit, m, g, n, k // block)
        lanes = m * (k // block) // cfg.split_k * block
        assert configs.fused_chosen(m, g, n, k, block) == (lanes <= configs.FUSED_QUANT_LANES)
    assert configs.fused_chosen(1, 16, N, K, 128)  # DeepSeek V4 decode at G = 16 fuses


def test_fused_blocker_names_the_obstacle():
    assert "not a multiple of the scale block" in configs.fused_blocker(192, 64, 128)
    assert "exceeds head_dim" in configs.fused_blocker(128, 256, 128)
    assert "swapped tiles only" in configs.fused_blocker(
        512, 64, 128, configs.GemmConfig(64, 128, tma=True))


def test_quant_launch_rules():
    """The per-head kernel where GS divides Dh (``block_h`` cut to a divisor of H), else flat
    groups; the grid covers every token (or group) once."""
    for s, h, dh, gs in itertools.product((1, 5, 64), (1, 6, 16), (128, 192, 512), (32, 128)):
        if h * dh % gs:
            continue
        for cfg in (configs.quant_config(s), configs.QuantConfig(16, 2),
                    configs.QuantConfig(4, block_h=4)):
            plan = configs.quant_launch(s, h, dh, gs, cfg)
            if plan.per_head:
                assert cfg.block_h and dh % gs == 0 and h % plan.shape["BLOCK_H"] == 0
                assert plan.grid[0] * cfg.block_r * plan.shape["BLOCK_H"] >= s * h
            else:
                assert plan.n_work == s * h * dh // gs
                assert plan.grid[0] * cfg.block_r >= plan.n_work


def test_quant_constants_and_product_rounding():
    """fp8 constants per format; the rotation rounds its products apart only where they are
    inexact (an fp32 operand) on a compiled target."""
    fn = dict(configs.quant_constants("float8_e4m3fn", 1e-8, True))
    assert (fn["FP8_MAX"], fn["FP8_MIN_NORMAL_EXP"], fn["HW_CAST"]) == (448.0, -6, True)
    fnuz = dict(configs.quant_constants("float8_e4m3fnuz", 1e-8, False))
    assert (fnuz["FP8_MAX"], fnuz["FP8_MIN_NORMAL_EXP"]) == (240.0, -7)
    with pytest.raises(ValueError, match="float8_e5m2"):
        configs.quant_constants("float8_e5m2", 1e-8, False)
    for o, rope in itertools.product(("bfloat16", "float16", "float32"), repeat=2):
        exact = o != "float32" and rope != "float32"
        assert configs.round_products(o, rope, "interpreter") == configs.PRODUCTS_AS_COMPILED
        assert configs.round_products(o, rope, "cuda") == (
            configs.PRODUCTS_AS_COMPILED if exact else configs.PRODUCTS_PTX)
        assert configs.round_products(o, rope, "hip") == (
            configs.PRODUCTS_AS_COMPILED if exact else configs.PRODUCTS_AMDGCN)


def test_wgmma_stages_fit_shared_memory():
    for bm, bn, out_bytes, kb in itertools.product((8, 64, 128), (64, 128), (2, 4), (1, 32)):
        stages = configs.wgmma_stages(8, kb, bm, bn, 128, out_bytes)
        assert 1 <= stages <= min(8, kb)
        assert stages * (bm + bn) * 128 + bm * bn * out_bytes <= configs.SMEM_BYTES
