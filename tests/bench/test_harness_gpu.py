"""The harness on a GPU: every provider passes its check and its row carries the GPU metrics."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_sweep_rows_on_the_gpu(bench):
    rc, rows = bench("--groups", "16,2", "--ms", "1,64,1024", "--reps", "3")
    failed = [(r["provider"], r["G"], r["M"], r["check"]) for r in rows
              if r["check"].startswith("FAILED")]
    assert rc == 0 and not failed, failed
    timed = [r for r in rows if r["us"] is not None]
    assert {r["machine"] for r in rows} == {results_slug()}
    for r in timed:
        if r["timer"] == "jit":
            assert r["device_us"] > 0, r
        else:
            assert r["timer"] == "graph" and r["clock"] == "burst", r
            assert r["pct_ceiling"] > 0 and (r["TFLOP/s"] or r["GB/s"]), r
    by = {(r["provider"], r["G"], r["M"]): r for r in timed}
    assert by[("chain_fp8_triton", 16, 1024)]["vs_bf16"] > 0
    assert by[("chain_bf16", 16, 1024)]["vs_ref"] > 0
    for r in timed:
        if r["provider"] == "chain_fp8_deepgemm":
            assert " the triton layer" in r["check"], r
    skipped = {r["provider"]: r["check"] for r in rows if r["us"] is None}
    assert set(skipped) <= {"quant_vllm", "gemm_deepgemm", "chain_peer", "chain_fp8_jax_cb",
                            "gemm_deepgemm_op", "chain_fp8_deepgemm"}, skipped


def test_eager_and_sustained_timers(bench):
    for flag, timer, clock in (("--eager", "eager", "burst"), ("--sustained", "graph",
                                                                 "sustained")):
        rc, rows = bench(flag, "--groups", "2", "--ms", "8192", "--reps", "2", "--providers",
                         "gemm_triton")
        assert rc == 0 and [(r["timer"], r["clock"]) for r in rows] == [(timer, clock)]
        if flag == "--eager":  # beside the same calls' graph and host time, in this process
            assert rows[0]["vs_graph"] > 0 and rows[0]["host_us"] > 0, rows[0]


def test_host_cost_on_the_gpu(bench):
    rc, rows = bench("--host-cost", "--groups", "16", "--reps", "3")
    assert rc == 0
    by = {r["provider"]: r for r in rows}
    assert by["bare Triton launch"]["us"] > 0 and by["torch.bmm"]["us"] > 0
    if by["torch._scaled_mm"]["us"]:  # sm_90
        assert all(r["vs_scaled_mm"] > 0 for n, r in by.items() if n != "torch._scaled_mm")


def results_slug() -> str:
    import torch

    from torch_bridge.bench import results

    return results.machine_slug(torch.cuda.get_device_name())


def test_jax_step_on_the_gpu(bench):
    """Every route runs and checks at decode and prefill sizes, including where the torch layer
    fuses (G = 16, M = 1) and splits K (G = 2); each JAX row has its ratio to the graph and
    its host time per step."""
    rc, rows = bench("--jax-step", "--layers", "2", "--groups", "2,16", "--ms", "1,64",
                     "--reps", "3")
    bad = [(r["provider"], r["G"], r["M"], r["check"]) for r in rows if r["us"] is None]
    assert rc == 0 and not bad, bad
    assert len(rows) == 4 * 2 * 2
    for r in rows:
        if r["provider"] == "jax_step_torch_graph":
            assert r["timer"] == "graph" and r["vs_graph"] is None, r
        else:
            assert r["timer"] == "jit" and r["vs_graph"] > 0 and r["host_us"] > 0, r
        if r["provider"] != "jax_step_xla_bf16":
            assert r["check"].startswith("bytes exact"), r
