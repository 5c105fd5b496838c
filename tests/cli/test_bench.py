"""``woa bench`` forwards to the benchmark harness (tiny CPU shapes under the interpreter)."""

from __future__ import annotations

import json


def test_bench_help_is_the_harness(woa):
    proc = woa("bench", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: woa bench") and "--plot" in proc.stdout


def test_bench_tiny_cpu_run_writes_json_and_plot(woa, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = woa("bench", "--providers", "quant_triton,chain_fp8_triton", "--ms", "1", "--reps",
               "1", "--no-progress", "--json", out, "--plot", png, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    checks = {r["provider"]: r["check"] for r in rows}
    assert checks["quant_triton"] == "bytes exact"
    assert checks["chain_fp8_triton"].startswith("relerr")
    assert png.stat().st_size > 0


def test_bench_usage_error_is_one_line(woa, one_line_error):
    one_line_error(woa("bench", "--providers", "nope"), "unknown providers")


def test_bench_sustained_is_not_for_the_prefill(woa, one_line_error):
    one_line_error(woa("bench", "--sustained", "--prefill"),
                   "--sustained applies to the sweep and --tune")


def test_bench_timing_label_names_the_sustained_clock():
    from benchmarks import bench

    assert "sustained clock" in bench._timing_label(True)
    assert "sustained" not in bench._timing_label(False)
