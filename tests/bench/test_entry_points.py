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


def test_tiny_cpu_run_outside_the_source_tree(run_python, installed):
    site, work = installed
    proc = run_python("-m", "torch_bridge.bench", "--ms", "1", "--reps", "1", "--no-progress",
                      "--providers", "quant_triton,chain_fp8_triton", cwd=work,
                      pythonpath=site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = results.read(work / "benchmarks" / "results" / "cpu.csv")
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


def test_woa_bench_usage_error_is_one_line(run_python, tmp_path):
    proc = run_python("-m", "torch_bridge", "bench", "--providers", "nope", cwd=tmp_path,
                      pythonpath=REPO)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown providers" in lines[0], proc.stderr
