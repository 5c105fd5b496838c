"""``woa probe``: the table, JSON, and WOA_* values the library rejects."""

from __future__ import annotations

import json

import pytest


def test_probe_table_lists_every_backend_per_op(woa, reads_well):
    proc = woa("probe")
    assert proc.returncode == 0, proc.stderr
    reads_well(proc.stdout)
    # Rows start at column 0; a wrapped "why" continues on indented lines.
    rows = [line.split() for line in proc.stdout.splitlines() if line[:1].strip()]
    for op in ("inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a"):
        assert {r[1] for r in rows if r[:1] == [op]} == {"aiter", "triton", "deepgemm", "torch",
                                                           "bf16"}
    # Without a GPU or interpreter, Triton says why; the pure-torch reference always runs.
    triton = next(r for r in rows if r[:2] == ["inverse_rope_group_quant", "triton"])
    assert triton[2] == "no"
    assert "TRITON_INTERPRET" in " ".join(proc.stdout.split())
    assert next(r for r in rows if r[:2] == ["batched_gemm_a8w8_mxscale", "torch"])[2] == "yes"
    # What a call runs on this CPU: the BF16 chain for wo_a, though the torch FP8 chain can run.
    text = " ".join(proc.stdout.split())
    assert ("a call without backend= runs: inverse_rope_group_quant on torch, "
            "batched_gemm_a8w8_mxscale on torch, wo_a on bf16.") in text
    assert "wo_a torch yes FP8 chain on torch; only when named" in text
    assert "torch 2." in proc.stdout and "jax 0." in proc.stdout  # versions
    assert ("jax_ops: Triton kernels launch through buffer_callback (JAX's default backend is "
            "cpu; the native route needs cuda)") in " ".join(proc.stdout.split())


def test_probe_json_to_stdout(woa):
    proc = woa("probe", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["device"]["device"] == "cpu" and report["versions"]["torch"]
    assert set(report["ops"]) == {"inverse_rope_group_quant", "batched_gemm_a8w8_mxscale",
                                  "wo_a"}
    assert report["ops"]["inverse_rope_group_quant"]["torch"]["ok"] is True
    aiter = report["ops"]["wo_a"]["aiter"]
    assert aiter["ok"] is False and "AITER" in aiter["reason"]
    assert report["env"]["TRITON_INTERPRET"] == "(unset)"
    assert report["picked"] == {"inverse_rope_group_quant": "torch",
                                "batched_gemm_a8w8_mxscale": "torch", "wo_a": "bf16"}
    assert report["jax_route"] == {
        "native": False, "reason": "JAX's default backend is cpu; the native route needs cuda"}


@pytest.mark.parametrize("env, fragments", [
    ({"WOA_BACKEND": "nope"}, ["WOA_BACKEND='nope' is not a backend", "aiter"]),
    ({"WOA_USE_TRITON": "yes"}, ["WOA_USE_TRITON='yes' is not a valid switch", "0 or 1"]),
])
def test_a_bad_environment_value_is_reported(woa, one_line_error, env, fragments):
    one_line_error(woa("probe", env=env), *fragments)


def test_probe_for_a_device_that_is_not_here(woa):
    proc = woa("probe", "--device", "cuda", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["device_missing"] == "no such device here: torch sees no CUDA or ROCm GPU"
    assert all(entry == {"ok": False, "reason": report["device_missing"]}
               for per in report["ops"].values() for entry in per.values())
    assert set(report["picked"].values()) == {None}
