"""The launch rules of ``configs`` (torch-free): the choice pinned at representative DeepSeek V4
shapes, the properties every choice must satisfy over a sweep of problems, the fields a config
refuses, and the rules of the BF16 chain's GEMM from ``o`` (``bf16_configs``).

The pinned tables hold the tuned choice (tiles, stages); a new tuning updates them. The
properties are what the kernels need to run and give the right bits: valid tiles that cover the
work, split-K only for grids of few programs and dividing the K blocks, the wgmma kernel only
where it has its tiles, the fused kernel only where its prologue is one step.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys

import pytest

from torch_bridge.backends.triton import bf16_configs, configs
from torch_bridge.backends.triton.bf16_configs import Bf16GemmConfig

MS = (0, 1, 2, 7, 8, 9, 16, 17, 33, 64, 65, 128, 129, 512, 1024, 4096, 8192)
GS = (1, 2, 4, 8, 16)
N, K = 1024, 4096


def _problems():
    for m, g, block in itertools.product(MS, GS, (128, 32)):
        yield m, g, N, K, block


@pytest.mark.parametrize("rules", [configs, bf16_configs], ids=lambda m: m.__name__)
def test_configs_imports_neither_torch_nor_triton(rules):
    """The JAX launcher and the torch launchers share these rules; they must not drag in torch."""
    import subprocess

    code = ("import importlib, sys\n"
            "importlib.import_module(sys.argv[1])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code, rules.__name__], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


C = configs.GemmConfig

#: (M, G, block, wgmma) -> the GEMM's launch shape at N = 1024, K = 4096.
GEMM_CHOICES = {
    (1, 16, 128, False): C(16, 64, swap_ab=True, num_stages=5),
    (17, 16, 128, False): C(64, 64, num_stages=6),
    (8192, 16, 128, False): C(64, 128, tma=True),
    (1, 2, 128, False): C(16, 64, split_k=8, swap_ab=True),
    (64, 2, 128, False): C(64, 64, split_k=4, swap_ab=True),
    (128, 2, 128, False): C(64, 64, split_k=4),
    (1024, 2, 128, False): C(64, 128, tma=True),
    (1, 8, 32, False): C(16, 64, swap_ab=True, num_stages=5),
    (1, 16, 128, True): C(8, 64, swap_ab=True, num_stages=6, wgmma=True),
    (1, 8, 128, True): C(8, 64, swap_ab=True, num_stages=8, wgmma=True),
    (16, 16, 128, True): C(16, 64, swap_ab=True, num_stages=6, wgmma=True),
    (64, 16, 128, True): C(64, 128, num_stages=8, wgmma=True, programs_per_sm=1),
    (17, 8, 128, True): C(64, 64, num_stages=10, wgmma=True, programs_per_sm=1),
    (128, 8, 128, True): C(64, 128, num_stages=8, wgmma=True, programs_per_sm=1),
    (8192, 16, 128, True): C(128, 128, num_warps=8, num_stages=5, wgmma=True, programs_per_sm=1),
    (256, 16, 128, True): C(128, 128, num_warps=8, num_stages=5, wgmma=True, programs_per_sm=1),
    (1, 2, 128, True): C(8, 64, split_k=4, swap_ab=True, num_stages=8, wgmma=True),
    (16, 2, 128, True): C(16, 64, split_k=4, swap_ab=True, num_stages=8, wgmma=True),
    (16, 4, 128, True): C(16, 64, split_k=4, swap_ab=True),
    (17, 2, 128, True): C(64, 16, num_stages=12, wgmma=True, programs_per_sm=1),
    (64, 2, 128, True): C(64, 16, num_stages=12, wgmma=True, programs_per_sm=1),
    (64, 1, 128, True): C(64, 64, split_k=4, num_stages=8, wgmma=True),
    (128, 2, 128, True): C(64, 32, num_stages=12, wgmma=True, programs_per_sm=1),
    (256, 2, 128, True): C(64, 64, num_stages=10, wgmma=True, programs_per_sm=1),
    (64, 4, 128, True): C(64, 32, num_stages=12, wgmma=True, programs_per_sm=1),
    (128, 4, 128, True): C(64, 64, num_stages=10, wgmma=True, programs_per_sm=1),
    (256, 4, 128, True): C(64, 128, num_stages=8, wgmma=True, programs_per_sm=1),
    (64, 8, 128, True): C(64, 64, num_stages=10, wgmma=True, programs_per_sm=1),
    (8192, 16, 32, True): C(64, 128, tma=True),
}

#: (M, G, block) -> (the fused chain's launch shape, whether it runs by default).
FUSED_CHOICES = {
    (1, 16, 128): (C(16, 128, swap_ab=True, num_warps=8, num_stages=5), True),
    (2, 16, 128): (C(16, 128, swap_ab=True, num_warps=8, num_stages=5), False),
    (17, 16, 128): (C(32, 128, swap_ab=True, num_warps=8, num_stages=5), False),
    (2, 8, 128): (C(16, 128, split_k=4, swap_ab=True, num_warps=8), True),
    (8, 8, 128): (C(16, 128, split_k=4, swap_ab=True, num_warps=8), False),
    (65, 8, 128): (C(64, 128, swap_ab=True, num_warps=8, num_stages=5), False),
    (4, 4, 128): (C(16, 128, split_k=8, swap_ab=True, num_warps=8), True),
    (8, 4, 128): (C(16, 128, split_k=8, swap_ab=True, num_warps=8), False),
    (8, 2, 128): (C(16, 128, split_k=8, swap_ab=True, num_warps=8), True),
    (9, 2, 128): (C(16, 128, split_k=8, swap_ab=True, num_warps=8), False),
    (33, 2, 128): (C(64, 128, split_k=4, swap_ab=True, num_warps=8), False),
    (1, 16, 32): (C(16, 128, swap_ab=True, num_warps=8, num_stages=5), True),
}


def _tiles(cfg, m, g, n) -> int:
    return -(-m // cfg.block_m) * -(-n // cfg.block_n) * g


@pytest.mark.parametrize("key", GEMM_CHOICES, ids=lambda k: "m{}g{}b{}{}".format(
    *k[:3], "wgmma" if k[3] else ""))
def test_gemm_config_choices(key):
    m, g, block, wgmma = key
    assert configs.gemm_config(m, g, N, K, block, wgmma=wgmma) == GEMM_CHOICES[key]


def test_warp_specialized_takes_the_persistent_wgmma_tiles_only():
    """The warp-specialized kernel runs exactly the default persistent wgmma tiles (G 16 from
    65 tokens, G 2-8 at 1024 and 8192): never a swapped, split or one-program-per-tile launch,
    and the chain's dependent launch of those tiles too."""
    for key, cfg in GEMM_CHOICES.items():
        assert configs.warp_specialized(cfg) == bool(cfg.wgmma and cfg.programs_per_sm), key
    for m, g in ((65, 16), (1024, 8), (1024, 4), (8192, 2)):
        cfg = configs.gemm_config(m, g, N, K, 128, wgmma=True)
        assert configs.warp_specialized(cfg) and configs.warp_specialized(
            dataclasses.replace(cfg, pdl=True)), (m, g, cfg)
    assert not configs.warp_specialized(C(16, 128, swap_ab=True, num_stages=6, wgmma=True,
                                          programs_per_sm=1))
    # The ring spans tiles: one K block still gets two stages.
    one = configs.wgmma_launch(200, 4, N, 128, 128, GEMM_CHOICES[(8192, 16, 128, True)],
                               out_bytes=4, sms=132, x_row=4 * 128, y_row=4 * N,
                               scale_strides=(4, 1, 8, 1))
    assert one.constexprs["STAGES"] == 2


@pytest.mark.parametrize("wgmma", [False, True])
def test_gemm_config_rules(wgmma):
    """Every default shape is a valid config whose tiles cover N exactly (the tile-walking
    kernels count N / block_n tiles); K is split, into a divisor of the K blocks and at most 256
    programs in all, where the Triton kernels' grids would have ``FEW_PROGRAMS`` or fewer; up to
    16 tokens are the MMA's N side, in one tile; the wgmma kernel takes only 128-blocks, its
    swapped decode tile unsplit from one wave of tiles and split up to ``FEW_SWAPPED_TILES``,
    every grid of more than ``FEW_PROGRAMS`` tiles above 64 tokens where it can run, and every
    split grid above 16 tokens where it can run."""
    for m, g, n, k, block in _problems():
        cfg = configs.gemm_config(m, g, n, k, block, wgmma=wgmma)
        dataclasses.replace(cfg)  # __post_init__ accepts it (raises otherwise)
        kb, tiles = k // block, _tiles(cfg, m, g, n)
        assert n % cfg.block_n == 0 and kb % cfg.split_k == 0, (m, g, cfg)
        if cfg.split_k > 1:
            assert not cfg.tma and cfg.split_k <= 8, (m, g, cfg)
            assert tiles * cfg.split_k <= 256, (m, g, cfg)
            assert cfg.wgmma == (wgmma and block == 128 and n % 128 == 0 and (
                m > 16 or tiles <= configs.FEW_SWAPPED_TILES)), (m, g, cfg)
        elif not cfg.wgmma:
            assert tiles > configs.FEW_PROGRAMS or kb == 1, (m, g, cfg)
        if 0 < m <= 16:
            assert cfg.swap_ab and m <= cfg.block_m, (m, g, cfg)
        if cfg.wgmma:
            assert wgmma and block == 128 and n % 128 == 0 and block % cfg.block_n == 0
            if cfg.swap_ab:
                assert tiles >= configs.ONE_WAVE_TILES or (
                    tiles <= configs.FEW_SWAPPED_TILES and cfg.split_k > 1), (m, g, cfg)
        elif wgmma and block == 128 and m > 64:
            assert cfg.split_k > 1, (m, g, cfg)
        if cfg.wgmma and cfg.split_k > 1:  # k_split's parts; G = 2 to 4 fill one wave
            assert _tiles(C(64, 128), m, g, n) < configs.FEW_PROGRAMS, (m, g, cfg)
            assert cfg.split_k == configs.k_split(cfg, m, g, n, kb, most=configs.ONE_WAVE_TILES)
            assert g not in (2, 4) or m == 0 or tiles * cfg.split_k == configs.ONE_WAVE_TILES, (
                m, g, cfg)  # zero tokens launch nothing


def test_k_split_is_a_divisor_capped_by_programs():
    cfg = configs.GemmConfig(16, 64, swap_ab=True)
    for tiles_g, kb in itertools.product((1, 2, 16, 32, 64), (1, 2, 3, 8, 32)):
        split = configs.k_split(cfg, 1, tiles_g, 64, kb)
        assert kb % split == 0 and 1 <= split <= 8
        assert split == 1 or split * tiles_g <= 256
        one_wave = configs.k_split(cfg, 1, tiles_g, 64, kb, most=configs.ONE_WAVE_TILES)
        assert kb % one_wave == 0 and (one_wave == 1 or one_wave * tiles_g <= 128)


@pytest.mark.parametrize("key", FUSED_CHOICES, ids=lambda k: "m{}g{}b{}".format(*k))
def test_fused_choices(key):
    m, g, block = key
    cfg, chosen = FUSED_CHOICES[key]
    assert configs.wo_a_fp8_config(m, g, N, K, block) == cfg
    assert configs.wo_a_fp8_chosen(m, g, N, K, block, dependent=False) == chosen


def test_fused_rules():
    """The fused kernel: swapped pointer tiles of 128 weight rows and the fewest of 16, 32 or 64
    token columns that hold the tokens, 8 warps; K split into a divisor of the K blocks exactly
    for grids of ``FEW_PROGRAMS`` or fewer; chosen by default only where each program's
    prologue quantizes at most ``WO_A_FP8_QUANT_LANES`` activations and the grid's at most
    ``WO_A_FP8_GRID_LANES``, so for the fewest tokens."""
    for g, block in itertools.product(GS, (128, 32)):
        kb, chosen = K // block, []
        for m in MS:
            cfg = configs.wo_a_fp8_config(m, g, N, K, block)
            assert configs.wo_a_fp8_blocker(512, 64, block, cfg) is None
            assert (cfg.block_n, cfg.num_warps, cfg.swap_ab) == (128, 8, True)
            assert cfg.block_m in (16, 32, 64) and min(m, 64) <= cfg.block_m, (m, g, cfg)
            assert cfg.block_m == 16 or cfg.block_m // 2 < m, (m, g, cfg)
            tiles = _tiles(cfg, m, g, N)
            assert kb % cfg.split_k == 0 and cfg.split_k <= 8, (m, g, cfg)
            assert (cfg.split_k > 1) == (tiles <= configs.FEW_PROGRAMS), (m, g, cfg)
            assert cfg.split_k == 1 or max(tiles, 1) * cfg.split_k <= 256, (m, g, cfg)
            chosen.append(configs.wo_a_fp8_chosen(m, g, N, K, block, dependent=False))
            if chosen[-1]:
                assert m * kb // cfg.split_k * block <= configs.WO_A_FP8_QUANT_LANES, (m, g, cfg)
                assert m * g * K * N // cfg.block_n <= configs.WO_A_FP8_GRID_LANES, (m, g, cfg)
        assert chosen == sorted(chosen, reverse=True), (g, block, chosen)  # a prefix of MS


def test_fused_chain_yields_to_a_dependent_gemm_that_streams_its_weight():
    """Where the unfused chain's GEMM would be the quant's dependent and request its whole
    weight before the quant ends (the wgmma kernel, K split into at most one wave of programs,
    each part no deeper than its stages), the chain is not fused: at G = 1 and 2 at every size
    the fused rule takes, nowhere else."""
    for m, g in itertools.product(MS, GS):
        streams = configs.dependent_streams_weight(m, g, N, K, 128)
        gemm = configs.gemm_config(m, g, N, K, 128, wgmma=True)
        assert streams == (gemm.wgmma and gemm.split_k > 1
                           and _tiles(gemm, m, g, N) * gemm.split_k <= configs.ONE_WAVE_TILES
                           and K // 128 // gemm.split_k <= gemm.num_stages), (m, g, gemm)
        alone = configs.wo_a_fp8_chosen(m, g, N, K, 128, dependent=False)
        assert configs.wo_a_fp8_chosen(m, g, N, K, 128, dependent=True) == (
            alone and not streams), (m, g)
    fused = {g: [m for m in MS[1:] if configs.wo_a_fp8_chosen(m, g, N, K, 128, dependent=True)]
             for g in GS}
    assert fused == {1: [], 2: [], 4: [1, 2], 8: [1, 2], 16: [1]}, fused
    assert [m for m in MS[1:] if configs.wo_a_fp8_chosen(m, 2, N, K, 128, dependent=False)] == [
        1, 2, 7, 8]


def test_one_token_at_few_groups_fuses_on_the_wgmma_tile_on_hopper():
    """Where the wgmma kernel runs, one token at G <= 4 fuses on its swapped 8 x 128 tile, K in
    8 (each part's slice in flight), even where the quant's dependent GEMM would stream its
    whole weight; more tokens or groups keep the pointer kernel's rule."""
    tile = configs.GemmConfig(8, 128, split_k=8, swap_ab=True, num_warps=4, num_stages=8,
                              wgmma=True)
    for g in (2, 4):
        assert configs.wo_a_fp8_config(1, g, N, K, 128, wgmma=True) == tile
        assert configs.wo_a_fp8_chosen(1, g, N, K, 128, dependent=True, wgmma=True)
        assert not configs.wo_a_fp8_config(1, g, N, K, 128).wgmma
    # A stage per K block of a part, no more: the rest would only take shared memory.
    assert configs.wgmma_stages(tile.num_stages, K // 128 // tile.split_k, tile.block_m,
                                tile.block_n, 128, 2, resident_x=True) == K // 128 // 8
    for m, g in ((2, 2), (1, 8), (1, 16)):
        assert configs.wo_a_fp8_config(m, g, N, K, 128, wgmma=True) == configs.wo_a_fp8_config(
            m, g, N, K, 128)
    assert not configs.wo_a_fp8_config(1, 2, N, K, 64, wgmma=True).wgmma  # 64-blocks
    assert not configs.wo_a_fp8_chosen(1, 2, N, K, 128, dependent=True)  # the dependent GEMM


def test_fused_blocker_names_the_obstacle():
    assert "not a multiple of the scale block" in configs.wo_a_fp8_blocker(192, 64, 128)
    assert "exceeds head_dim" in configs.wo_a_fp8_blocker(128, 256, 128)
    assert "take swapped tiles, one per program" in configs.wo_a_fp8_blocker(
        512, 64, 128, configs.GemmConfig(64, 128, tma=True))
    assert "block_n 128 must divide 64" in configs.wo_a_fp8_blocker(
        512, 64, 64, configs.GemmConfig(8, 128, swap_ab=True, wgmma=True))
    assert configs.wo_a_fp8_blocker(512, 64, 128, configs.GemmConfig(8, 64, swap_ab=True,
                                                                      wgmma=True)) is None
    # The fused wgmma kernel holds its K part's activations: 32 blocks of 64 rows fill the SM.
    wide = configs.GemmConfig(64, 64, swap_ab=True, wgmma=True)
    assert "leave no room for a weight stage" in configs.wo_a_fp8_blocker(512, 64, 128, wide,
                                                                         k=4096)
    assert configs.wo_a_fp8_blocker(512, 64, 128, dataclasses.replace(wide, split_k=2),
                                    k=4096) is None


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
    for bm, bn, out_bytes, kb, staged in itertools.product((8, 64, 128), (64, 128), (2, 4),
                                                           (1, 31, 32), (False, True)):
        stages = configs.wgmma_stages(8, kb, bm, bn, 128, out_bytes, staged_scales=staged)
        assert 1 <= stages <= min(8, kb)
        scales = configs.staged_scale_bytes(kb, bm) if staged else 0
        assert stages * (bm + bn) * 128 + bm * bn * out_bytes + scales <= configs.SMEM_BYTES


def test_resident_activations_take_their_share_of_shared_memory():
    """The fused wgmma kernel's stages are weight tiles beside its work unit's every
    activation tile: fewer fit as the unit deepens, none once the activations fill it."""
    for bm, bn, kb in itertools.product((8, 16, 32), (64, 128), (4, 8, 16, 32)):
        stages = configs.wgmma_stages(8, kb, bm, bn, 128, 4, resident_x=True)
        assert 1 <= stages <= min(8, kb)
        assert kb * bm * 128 + stages * bn * 128 + bm * bn * 4 <= configs.SMEM_BYTES
    assert configs.wgmma_stages(8, 32, 64, 128, 128, 4, resident_x=True) == 0


def test_staged_scales_pad_the_k_blocks_to_a_power_of_two():
    assert [configs.staged_scale_bytes(kb, 64) for kb in (1, 2, 31, 32, 33)] == [
        256, 512, 8192, 8192, 16384]


@pytest.mark.parametrize("fields,match", [
    (dict(block_m=48, block_n=64), "block_m must be a power of two >= 16, got 48"),
    (dict(block_m=8, block_n=64), "block_m must be a power of two >= 16, got 8"),
    (dict(block_m=16, block_n=96), "block_n must be a power of two >= 16, got 96"),
    (dict(block_m=16, block_n=64, num_warps=3), "num_warps must be a power of two"),
    (dict(block_m=16, block_n=64, split_k=0), "split_k >= 1"),
    (dict(block_m=16, block_n=64, num_stages=0), "num_stages >= 1"),
    (dict(block_m=16, block_n=64, tma=True, programs_per_sm=-1), "programs_per_sm >= 0"),
    (dict(block_m=16, block_n=64, programs_per_sm=2), "programs_per_sm applies to the TMA"),
    (dict(block_m=16, block_n=64, tma=True, split_k=2), "TMA kernel does not split K"),
    (dict(block_m=128, block_n=128, num_warps=4, wgmma=True), "block_m = 16 \\* num_warps"),
    (dict(block_m=32, block_n=128, num_warps=2, wgmma=True), "in \\(64, 128\\)"),
    (dict(block_m=128, block_n=128, swap_ab=True, wgmma=True), "block_m in 8..64"),
    (dict(block_m=16, block_n=32, swap_ab=True, wgmma=True), "block_n in \\(64, 128\\)"),
    (dict(block_m=16, block_n=64, swap_ab=True, num_warps=8, wgmma=True),
     "a multiple of 16 \\* num_warps"),
    (dict(block_m=4, block_n=64, swap_ab=True, wgmma=True), "block_m must be a power of two >= 8"),
    (dict(block_m=8, block_n=64, swap_ab=True), "block_m must be a power of two >= 16"),
    (dict(block_m=64, block_n=128, tma=True, wgmma=True), "wgmma is its own kernel"),
])
def test_gemm_config_rejects_bad_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        configs.GemmConfig(**fields)


@pytest.mark.parametrize("fields,match", [
    (dict(block_r=3), "block_r must be a power of two >= 1, got 3"),
    (dict(block_r=0), "block_r must be a power of two >= 1, got 0"),
    (dict(num_warps=6), "num_warps must be a power of two"),
    (dict(block_h=-1), "block_h must be >= 0"),
    (dict(whole_head=True), "whole_head needs the per-head kernel"),
])
def test_quant_config_rejects_bad_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        configs.QuantConfig(**fields)


# ---------------------------------------------------------------------------------------------
# The BF16 chain's GEMM from ``o`` (``bf16_kernels``)
# ---------------------------------------------------------------------------------------------

#: Token counts of the BF16 GEMM's sweeps.
SS = (1, 2, 15, 16, 17, 33, 64, 65, 128, 256, 1000, 1024, 4096, 8192)


@pytest.mark.parametrize("target", ["cuda", "hip", "interpreter"])
def test_every_chosen_shape_is_a_valid_tile(target):
    for s, g, block_k in itertools.product(SS, (1, 2, 8, 16), (16, 32, 64)):
        cfg = bf16_configs.bf16_gemm_config(s, g, 1024, 4096, block_k, target)
        assert cfg.block_k <= block_k and block_k % cfg.block_k == 0, (s, g, cfg)
        assert cfg.block_m <= max(16, 1 << (s - 1).bit_length()), (s, g, cfg)
        if target == "hip":
            # Two stages of A and B tiles within half of gfx942's 64 KiB of LDS.
            assert cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * 2 <= 32768


def test_the_gemm_from_o_runs_at_decode_and_from_128_tokens_with_tma_loads():
    """On Hopper the one-launch chain up to 16 tokens (64 at G = 16, and at G = 2 with K
    split), the TMA kernel from 128 tokens and 2048 (token, group) rows, the rotated copy and
    cuBLAS between; without TMA loads always the copy. The decode tiles rotate, no other tile
    does; in one wave of programs they keep more stages in flight."""
    for (s, g), want in {(1, 16): True, (16, 2): True, (17, 8): False, (64, 16): True,
                         (64, 2): True, (64, 4): False, (65, 2): False, (65, 16): False,
                         (127, 16): False, (128, 16): True, (128, 8): False, (256, 8): True,
                         (255, 8): False, (512, 2): False, (1024, 2): True,
                         (8192, 2): True}.items():
        assert bf16_configs.bf16_gemm_chosen(s, g, 1024, 4096, tma=True, dh=512) == want, (s, g)
        assert not bf16_configs.bf16_gemm_chosen(s, g, 1024, 4096, tma=False, dh=512)
        if want and s <= 64:  # groups inside heads, or no head dim: no one-launch chain
            assert not bf16_configs.bf16_gemm_chosen(s, g, 1024, 256, tma=True, dh=512)
            assert not bf16_configs.bf16_gemm_chosen(s, g, 1024, 4096, tma=True)
        for target in ("cuda", "hip"):
            cfg = bf16_configs.bf16_gemm_config(s, g, 1024, 4096, 64, target, target == "cuda")
            assert cfg.rotate == (s <= 64), (s, g, target)
    stages = {g: bf16_configs.bf16_gemm_config(1, g, 1024, 4096, 64, "cuda", True)
              for g in (16, 8, 2)}
    assert [(c.block_n, c.num_stages) for c in stages.values()] == [(64, 5), (64, 8), (16, 12)]


def test_few_decode_tiles_split_k_by_heads():
    """From 17 to 64 tokens, where the one-launch chain's 64-row tiles are at most a quarter
    wave (G = 2), K is split by whole heads into one wave, 8 stages; four times the tiles
    (G = 4), fewer tokens, more tokens, other targets, and groups that are not whole heads
    keep K whole."""
    for s in (17, 32, 33, 64):
        cfg = bf16_configs.bf16_gemm_config(s, 2, 1024, 4096, 64, "cuda", True, dh=512)
        assert (cfg.block_n, cfg.split_k, cfg.num_stages, cfg.rotate) == (64, 4, 8, True), s
        assert configs.programs(configs.GemmConfig(cfg.block_m, cfg.block_n), s, 2, 1024) \
            * cfg.split_k == configs.ONE_WAVE_TILES
    assert bf16_configs.bf16_split(64, 2, 1024, 1536, 512) == 1  # 3 heads: no split divides
    assert bf16_configs.bf16_split(64, 2, 1024, 1024, 512) == 2  # 2 heads
    for s, g, k, dh, target in ((16, 2, 4096, 512, "cuda"), (65, 2, 4096, 512, "cuda"),
                                (64, 4, 4096, 512, "cuda"), (64, 2, 4096, None, "cuda"),
                                (64, 2, 4096, 384, "cuda"), (64, 2, 4096, 512, "hip"),
                                (64, 2, 4096, 512, "interpreter")):
        cfg = bf16_configs.bf16_gemm_config(s, g, 1024, k, 64, target, target == "cuda", dh=dh)
        assert cfg.split_k == 1, (s, g, k, dh, target)


def test_hopper_tma_tiles():
    """128 x 256 tiles where they make a wave of programs, else 128 x 128, else 64 x 128."""
    big, mid, small = (Bf16GemmConfig(128, 256, 64, 8, 3, True),
                       Bf16GemmConfig(128, 128, 64, 4, 5, True),
                       Bf16GemmConfig(64, 128, 64, 4, 4, True))
    for (s, g), want in {(8192, 16): big, (1024, 16): big, (4096, 2): big, (1024, 2): mid,
                         (256, 16): big, (256, 8): mid, (128, 16): mid, (256, 2): small}.items():
        assert bf16_configs.bf16_gemm_config(s, g, 1024, 4096, tma=True) == want, (s, g)


def test_hopper_shapes_fill_the_gpu():
    """Large problems take the 128 x 256 x 64 wgmma tile; the others keep a wave of programs."""
    assert bf16_configs.bf16_gemm_config(8192, 16, 1024, 4096) == Bf16GemmConfig(128, 256, 64, 8, 3)
    for s, g in itertools.product(SS, (2, 8, 16)):
        cfg = bf16_configs.bf16_gemm_config(s, g, 1024, 4096)
        progs = configs.cdiv(s, cfg.block_m) * configs.cdiv(1024, cfg.block_n) * g
        assert progs >= configs.ONE_WAVE_TILES or cfg.block_n == 16 or cfg.block_m == 64, cfg


def test_blocker_and_block_k_limit():
    assert bf16_configs.bf16_block_k_limit(512, 64, 4096) == 64
    assert bf16_configs.bf16_block_k_limit(192, 128, 384) == 64
    assert bf16_configs.bf16_block_k_limit(64, 32, 128) == 32
    assert bf16_configs.bf16_gemm_blocker(512, 64, 4096) is None
    assert bf16_configs.bf16_gemm_blocker(512, 64, 4096, Bf16GemmConfig(128, 256, 64)) is None
    assert "block_k 64" in bf16_configs.bf16_gemm_blocker(64, 32, 128, Bf16GemmConfig(16, 16, 64))
    assert "no K tile" in bf16_configs.bf16_gemm_blocker(24, 8, 48)
    assert "rope dim" in bf16_configs.bf16_gemm_blocker(64, 128, 128)
    cfg = Bf16GemmConfig(128, 256, 64, 8, 3, tma=True)
    assert cfg.label() == "m128n256k64w8st3T" and dataclasses.replace(cfg, tma=False) != cfg


def test_programmatic_dependent_shapes_are_named_and_reach_the_wgmma_kernel():
    """``pdl`` is part of a launch shape: its label says so (``P``) and the wgmma launch passes
    it to the kernel, which then requests weight tiles before it waits."""
    cfg = C(64, 64, split_k=4, num_stages=8, wgmma=True, pdl=True)
    assert cfg.label() == "m64n64k4w4st8WP"
    assert configs.QuantConfig(4, 1, 1, pdl=True).label() == "r4w1h1P"
    assert configs.QuantConfig(1, 1, 1, pdl=True, whole_head=True).label() == "r1w1h1WP"
    scales = (32, 32, 256, 32)
    for shape in (cfg, dataclasses.replace(cfg, pdl=False)):
        launch = configs.wgmma_launch(64, 2, N, K, 128, shape, out_bytes=2, sms=132,
                                      x_row=2 * K, y_row=2 * N, scale_strides=scales)
        assert launch.constexprs["PDL"] is shape.pdl


@pytest.mark.parametrize("s,heads,tokens,whole", [
    (1, 16, 1, True), (64, 16, 1, True), (100, 16, 1, True), (101, 16, 2, True),
    (128, 16, 2, True),
    (129, 16, 4, False), (8, 128, 1, True), (16, 128, 2, True), (17, 128, 4, False),
    (8192, 128, 4, False),
    (1, 0, 1, False), (9, 0, 2, False), (17, 0, 4, False),  # heads unknown: by tokens alone
])
def test_quant_programs_take_whole_head_rows_in_decode_batches(s, heads, tokens, whole):
    """One warp per program and head, whatever the launch (torch and JAX launch the same
    shape): whole head rows up to 2048 (token, head) rows, 1 token a program up to 1600;
    above, a group at a time, 4 tokens a program (by tokens alone where the heads are not
    given: 1 up to 8, 2 up to 16)."""
    for dependent in (False, True):
        cfg = configs.quant_config(s, heads=heads, dependent=dependent)
        assert (cfg.block_r, cfg.num_warps, cfg.block_h, cfg.whole_head) == (tokens, 1, 1, whole)


@pytest.mark.parametrize("s,heads,dependent,pdl", [
    (1, 16, False, True), (16, 64, False, True), (100, 16, False, True),  # <= 1600 rows
    (101, 16, False, False),
    (128, 16, False, False), (64, 32, False, False), (8192, 128, False, False),
    (128, 16, True, True), (8192, 128, True, True),  # before the chain's dependent GEMM
    (16, 0, False, False),  # heads unknown (JAX's plain launches): the plain shape
])
def test_small_quants_and_the_chains_launch_as_programmatic_dependents(s, heads, dependent,
                                                                       pdl):
    """The quant's default shape asks for a programmatic dependent launch up to
    ``DEPENDENT_QUANT_ROWS`` (token, head) rows and before the chain's dependent GEMM; the
    shape is the same either way."""
    cfg = configs.quant_config(s, heads=heads, dependent=dependent)
    assert cfg.pdl is pdl
    plain = configs.quant_config(s, heads=heads)
    assert dataclasses.replace(cfg, pdl=plain.pdl) == plain
