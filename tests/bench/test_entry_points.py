"""The harness as a user runs it: ``woa bench`` in a checkout, and ``python -m
torch_bridge.bench`` from an installed copy of the packages with no source tree around it."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from torch_bridge.bench import results

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def installed(tmp_path):
    """The two packages copied alone into ``site/`` (as ``pip install .`` lays them out)."""
    site = tmp_path / "site"
    for d in results.SOURCE_PACKAGES:
        shutil.copytree(REPO / d, site / d, ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    return site, work


def test_help_outside_the_source_tree(run_python, installed):
    site, work = installed
    proc = run_python("-m", "torch_bridge.bench", "--help", cwd=work, pythonpath=site)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: woa bench") and "--host-cost" in proc.stdout
    assert "WoAProjection(backend='bf16')" in proc.stdout  # what each row runs


def test_tiny_cpu_run_outside_the_source_tree(run_python, installed, tmp_path):
    """Without --results-dir and outside a checkout, rows go to $WOA_CACHE_DIR/results, never
    into a tree under the working directory."""
    site, work = installed
    cache = tmp_path / "cache"
    proc = run_python("-m", "torch_bridge.bench", "--ms", "1", "--reps", "1", "--no-progress",
                      "--providers", "quant_triton,chain_fp8_triton", cwd=work,
                      pythonpath=site, env={"WOA_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(work.iterdir()) == []
    rows = results.read(cache / "results" / "cpu.csv")
    assert {r["provider"]: r["check"][:6] for r in rows} == {
        "quant_triton": "bytes ", "chain_fp8_triton": "relerr"}
    assert rows[0]["source"] == results.source_digest(site)


def test_source_digest_flag(run_python, installed):
    site, work = installed
    proc = run_python("-m", "torch_bridge.bench", "--source-digest", cwd=work, pythonpath=site)
    assert proc.returncode == 0 and proc.stdout.strip() == results.source_digest(site)


def test_woa_bench_forwards_to_the_harness(run_python, tmp_path):
    proc = run_python("-m", "torch_bridge", "bench", "--help", cwd=tmp_path, pythonpath=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: woa bench") and "--plot" in proc.stdout


@pytest.mark.parametrize("entry", [("torch_bridge", "bench"), ("torch_bridge.bench",)])
@pytest.mark.parametrize("args, fragment", [
    (["--providers", "nope"], "unknown providers"),
    (["--reps", "many"], "argument --reps: invalid int value: 'many'"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--results-dir", "/nonexistent/dir", "--providers", "copy"],
     "--results-dir /nonexistent/dir: does not exist"),
])
def test_bench_usage_errors_are_one_line(run_python, tmp_path, entry, args, fragment):
    """Through woa and on its own, a mistake is one line and exit 2, and no path is created."""
    proc = run_python("-m", *entry, *args, cwd=tmp_path, pythonpath=REPO)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("woa bench: error: "), proc.stderr
    assert fragment in lines[0] and "Traceback" not in proc.stderr
    assert not pathlib.Path("/nonexistent").exists() and list(tmp_path.iterdir()) == []
