"""``--tune`` rows and ``--tuned``: the fastest shapes of the newest tuning run replace the
launch choice; the source digest that ties rows to the code they measured."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch_bridge.backends.triton import configs  # noqa: E402
from torch_bridge.bench import problem, results, tune  # noqa: E402


def _row(kind, g, m, us, cfg, run="2026-01-02"):
    return {"mode": "tune", "run": run, "kind": kind, "G": g, "M": m, "us": us,
            "config": json.dumps(dataclasses.asdict(cfg))}


def test_tuned_shapes_replace_the_launch_choice(monkeypatch):
    """The best GEMM shape of the nearest tuned M, the quant shape of the largest M, and only
    the newest run counts; installed where the launchers look them up."""
    monkeypatch.setattr(configs, "gemm_config", configs.gemm_config)
    monkeypatch.setattr(configs, "quant_config", configs.quant_config)
    fast, slow = configs.GemmConfig(16, 64, swap_ab=True), configs.GemmConfig(64, 128, tma=True)
    quant = configs.QuantConfig(8, 4, block_h=1)
    rows = [_row("gemm", 16, 1, 19.0, fast), _row("gemm", 16, 1, 25.0, slow),
            _row("gemm", 16, 1024, 99.0, slow), _row("quant", 16, 64, 5.0, quant),
            _row("gemm", 16, 1, 1.0, slow, run="2025-12-31"),  # an older run: ignored
            {"mode": "sweep", "kind": "gemm", "G": 16, "M": 1, "us": 0.5}]
    tune.use_tuned(rows)
    assert configs.gemm_config(4, 16, 1024, 4096, 128, wgmma=True) == fast
    assert configs.gemm_config(2048, 16, 1024, 4096, 128, wgmma=False) == slow
    assert configs.quant_config(1) == quant


def test_tuned_needs_tuning_rows():
    with pytest.raises(ValueError, match="no timed tuning rows"):
        tune.use_tuned([{"mode": "sweep", "us": 1.0}])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rows of the harness")
def test_tune_run_writes_rows_that_tuned_reads(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(configs, "quant_config", configs.quant_config)
    monkeypatch.setattr(tune, "quant_candidates", lambda: [configs.QuantConfig(8, 4),
                                                           configs.QuantConfig(4, 1, 1)])
    rc, rows = bench("--tune", "--tune-kinds", "quant", "--ms", "1", "--reps", "1")
    assert rc == 0 and [r["provider"] for r in rows] == ["r8w4", "r4w1h1"]
    assert all(r["check"] == "bytes exact" and r["us"] > 0 for r in rows)
    tune.use_tuned(results.read(tmp_path / "res" / "cpu.csv"))
    best = min(rows, key=lambda r: r["us"])
    assert dataclasses.asdict(configs.quant_config(1)) == json.loads(best["config"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rows of the harness")
def test_a_tune_run_cut_short_keeps_the_shapes_it_finished(bench, tmp_path, monkeypatch):
    """Each (G, M)'s rows reach the CSV as soon as they are timed: a run killed at its second
    shape has written the first."""
    monkeypatch.setattr(tune, "quant_candidates", lambda: [configs.QuantConfig(8, 4)])
    make_sets = problem.make_sets

    def cut_at_the_second_shape(sweep, g, m, *args):
        if m == 2:
            raise KeyboardInterrupt
        return make_sets(sweep, g, m, *args)

    monkeypatch.setattr(problem, "make_sets", cut_at_the_second_shape)
    with pytest.raises(KeyboardInterrupt):
        bench("--tune", "--tune-kinds", "quant", "--groups", "2", "--ms", "1,2", "--reps", "1")
    rows = results.read(tmp_path / "res" / "cpu.csv")
    assert [(r["mode"], r["G"], r["M"], r["provider"]) for r in rows] == [("tune", 2, 1, "r8w4")]


def test_candidates_have_distinct_labels():
    for m in (1, 16, 33, 64, 128, 8192):
        labels = [c.label() for c in tune.gemm_candidates(m)]
        assert len(labels) == len(set(labels)), labels


@pytest.mark.parametrize("g,m,split", ((2, 256, True), (4, 256, True), (8, 64, True),
                                       (8, 256, False), (16, 256, False), (16, 8192, False)))
def test_gemm_candidates_split_k_only_where_the_unsplit_grid_is_one_wave_or_less(g, m, split):
    """Every unsplit candidate stays; the splits only where they could fill the GPU."""
    pruned = tune.gemm_candidates(m, g, 1024)
    assert any(c.split_k > 1 for c in pruned) == split
    unsplit = {c.label() for c in tune.gemm_candidates(m) if c.split_k == 1}
    assert unsplit <= {c.label() for c in pruned}


@pytest.mark.parametrize("m", (16, 64, 128, 256))
def test_gemm_candidates_time_the_wgmma_kernel_split_1_to_8_ways(m):
    """Every GEMM tuning run compares the wgmma kernel unsplit and split 2, 4 and 8 ways on its
    64 x 64 and 64 x 128 tiles (and the swapped token tile up to 32 tokens), above 64 tokens
    128-token tiles unsplit and split 2 and 4 ways, each dividing V4's 32 K blocks;
    "gemm-split" times those alone."""
    split = tune.wgmma_split_candidates(m)
    labels = {c.label() for c in tune.gemm_candidates(m)}
    assert {c.label() for c in split} <= labels
    tiles = {(c.block_m, c.block_n, c.swap_ab) for c in split}
    assert {(64, 64, False), (64, 128, False)} <= tiles
    assert any(swap for *_, swap in tiles) == (m <= 32)
    assert ({(128, 64, False), (128, 128, False)} <= tiles) == (m > 64)
    for tile in tiles:
        ks = sorted(c.split_k for c in split if (c.block_m, c.block_n, c.swap_ab) == tile)
        assert ks == ([1, 2, 4] if tile[0] == 128 else [1, 2, 4, 8]), (tile, ks)
    assert all(c.num_warps == c.block_m // 16 for c in split if not c.swap_ab)
    assert all(c.wgmma and 32 % c.split_k == 0 for c in split)
    assert "gemm-split" in tune.KINDS and "gemm-split" not in tune.DEFAULT_KINDS


@pytest.mark.parametrize("g,m", ((2, 16), (2, 64), (4, 64), (2, 128)))
def test_split_candidates_rank_the_pointer_split_beside_the_wgmma_splits(g, m):
    """"gemm-split" times the pointer kernel's own K split for the shape first, then every
    wgmma split, the narrow unsplit tiles and the persistent 64-token tiles, each once."""
    got = tune.split_candidates(m, g, problem.GPU)
    assert got[0] == configs.gemm_config(m, g, 1024, 4096, 128) and not got[0].wgmma
    assert got[0].split_k > 1
    rest = tune.wgmma_split_candidates(m) + tune.narrow_candidates(m) + tune.wave_candidates()
    assert [c.label() for c in got[1:]] == [c.label() for c in rest]
    assert configs.gemm_config(m, g, 1024, 4096, 128, wgmma=True) in got
    assert all(c.split_k == 1 and c.block_n <= 32 for c in tune.narrow_candidates(m))


def test_source_digest_tracks_the_code(tmp_path):
    """It changes with any source file's bytes or path, the C++ launchers' included, and ignores
    files outside the packages."""
    root = results._ROOT
    for d in results.SOURCE_PACKAGES:
        shutil.copytree(root / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    first = results.source_digest(tmp_path)
    assert first == results.source_digest() and len(first) == 12
    (tmp_path / "notes.py").write_text("x = 1\n")
    assert results.source_digest(tmp_path) == first
    module = tmp_path / "torch_bridge" / "bench" / "timing.py"
    module.write_text(module.read_text() + "\n")
    assert results.source_digest(tmp_path) != first
    module.rename(module.with_name("timers.py"))
    renamed = results.source_digest(tmp_path)
    assert renamed not in (first, results.source_digest())
    header = tmp_path / "torch_bridge" / "backends" / "triton" / "launch_params.h"
    header.write_text(header.read_text() + "\n")  # the native launchers' sources count too
    assert results.source_digest(tmp_path) != renamed


def test_fused_wgmma_candidates_stay_within_two_waves():
    """The fused wgmma chain's shapes: the narrowest token tile holding M (up to 32 tokens; a
    64-token tile spills), 64 or 128 weight rows, K split while the grid stays within two
    waves, and the one-wave split of the 64-row tile as a programmatic dependent; 32 tokens by
    128 rows over eight warps (over four it spills with Triton 3.6)."""
    labels = [c.label() for c in tune.wo_a_fp8_wgmma_candidates(1, 2, 1024, 4096)]
    assert labels == ["m8n64k1sw4st8W", "m8n64k2sw4st8W", "m8n64k4sw4st8W", "m8n64k8sw4st8W",
                      "m8n64k4sw4st8WP", "m8n128k1sw4st8W", "m8n128k2sw4st8W",
                      "m8n128k4sw4st8W", "m8n128k8sw4st8W"], labels
    labels = [c.label() for c in tune.wo_a_fp8_wgmma_candidates(16, 16, 1024, 4096)]
    assert labels == ["m16n64k1sw4st8W", "m16n64k1sw4st8WP", "m16n128k1sw4st8W",
                      "m16n128k2sw4st8W"], labels
    labels = [c.label() for c in tune.wo_a_fp8_wgmma_candidates(32, 4, 1024, 4096)]
    assert labels == ["m32n64k1sw4st8W", "m32n64k2sw4st8W", "m32n64k4sw4st8W",
                      "m32n64k2sw4st8WP", "m32n128k1sw8st8W", "m32n128k2sw8st8W",
                      "m32n128k4sw8st8W", "m32n128k8sw8st8W"], labels
    for g, m in ((2, 1), (4, 9), (16, 32)):
        for c in tune.wo_a_fp8_wgmma_candidates(m, g, 1024, 4096):
            assert configs.wo_a_fp8_blocker(512, 64, 128, c) is None, c
            assert configs.programs(c, m, g, 1024) * c.split_k <= 2 * configs.ONE_WAVE_TILES
    assert tune.wo_a_fp8_wgmma_candidates(33, 2, 1024, 4096) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rows of the harness")
def test_chain_wgmma_tune_times_the_rules_shape_and_the_two_kernels(bench):
    """"chain-wgmma" times the rule's fused shape and the two-kernel chain, then where the wgmma
    kernel runs (Hopper) the fused wgmma kernel's shapes: none on this CPU."""
    sweep = problem.CPU
    rule = configs.wo_a_fp8_config(1, 2, sweep.n, sweep.k, 128)
    rc, rows = bench("--tune", "--tune-kinds", "chain-wgmma", "--ms", "1", "--reps", "1")
    assert rc == 0 and [r["provider"] for r in rows] == [f"fused {rule.label()}", "quant+gemm"]
    assert all(r["us"] > 0 and r["kind"] == "chain" for r in rows), rows
