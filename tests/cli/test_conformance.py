"""``woa conformance``: our backends conform, deliberately broken ones are caught and named."""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import woa_jax
from woa_jax import conformance
from woa_jax.conformance import assert_conformance, run_conformance

GOOD = "tests/cli/good_impl.py"
BROKEN = "tests/cli/broken_impl.py"


def test_our_backends_with_aiters_signature_conform(woa, tmp_path):
    out = tmp_path / "report.json"
    proc = woa("conformance", f"{GOOD}:inverse_rope_group_quant",
               f"{GOOD}:batched_gemm_a8w8_mxscale", "--quick", "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS") == 2
    quant, gemm = json.loads(out.read_text())["reports"]
    assert quant["passed"] and quant["amax_floor"] == woa_jax.AITER_AMAX_FLOOR
    assert {c["name"].rsplit("-", 1)[-1] for c in quant["cases"]} >= {"randn", "large"}
    assert all(c["scale_bytes_equal"] == 1.0 and c["fp8_bytes_equal"] == 1.0
               for c in quant["cases"])
    assert gemm["passed"] and gemm["tolerance"] == "gemm_bf16"
    assert all(0 < c["rel_error"] < 4e-3 for c in gemm["cases"])


def test_public_entry_point_and_the_cuda_floor(woa):
    """torch_bridge's own functions take AITER's positional arguments as they are."""
    proc = woa("conformance", "torch_bridge:inverse_rope_group_quant",
               f"{GOOD}:cuda_floor_quant", "--quick", "-k", "floor", "--json")
    assert proc.returncode == 0, proc.stderr
    ours, cuda = json.loads(proc.stdout)["reports"]
    assert ours["amax_floor"] == 1e-8 and cuda["amax_floor"] == 1e-10
    assert all("floor" in c["name"] for c in ours["cases"])
    # Requiring AITER's floor turns the CUDA floor into a break.
    strict = woa("conformance", f"{GOOD}:cuda_floor_quant", "--quick", "-k", "zero-groups",
                 "--floor", "aiter")
    assert strict.returncode == 1
    assert "zero-groups" in strict.stdout and "0x55" in strict.stdout  # byte 85 instead of 92


def test_broken_implementations_fail_and_name_the_case(woa, tmp_path):
    out = tmp_path / "report.json"
    names = ["inverse_rope_group_quant_log2", "inverse_rope_group_quant_round_down",
             "inverse_rope_group_quant_mixed_floor", "batched_gemm_a8w8_mxscale_swapped"]
    proc = woa("conformance", *(f"{BROKEN}:{n}" for n in names), "--quick", "--json", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log2, round_down, mixed, swapped = json.loads(out.read_text())["reports"]
    # An approximate log2 is one step low only just above a power of two, reached in rotated lanes.
    assert not log2["passed"]
    assert {c["name"].split("-", 6)[-1] for c in log2["cases"] if not c["passed"]} == {"pow2-rope"}
    assert "FAIL: scale bytes" in proc.stdout and "pow2-rope" in proc.stdout
    assert not round_down["passed"] and all(not c["passed"] for c in round_down["cases"])
    # Every case matches some floor, but not the same one.
    assert not mixed["passed"] and all(c["passed"] for c in mixed["cases"])
    assert "inconsistent amax floor" in mixed["problems"][0]
    assert not swapped["passed"]
    assert all("exceeds" in c["detail"] for c in swapped["cases"])


def _floored(name, *floors):
    return conformance.CaseResult("inverse_rope_group_quant", name, True, floors=floors)


@pytest.mark.parametrize("matches, named", [
    # Two floors, two cases that each match only one.
    ([("a", 1e-8), ("b", 1e-10)], {"a": "floor 1e-08", "b": "floor 1e-10"}),
    # Three floors: a two-floor case against a one-floor case.
    ([("a", 1e-8, 1e-9), ("b", 1e-10)], {"a": "floors 1e-08, 1e-09", "b": "floor 1e-10"}),
    # Three floors: every pair of cases agrees on a floor, no floor fits all three.
    ([("a", 1e-8, 1e-9), ("b", 1e-9, 1e-10), ("c", 1e-8, 1e-10)],
     {"a": "floors 1e-08, 1e-09", "b": "floors 1e-09, 1e-10", "c": "floors 1e-08, 1e-10"}),
])
def test_inconsistent_floors_are_reported_for_any_number_of_floors(matches, named):
    floors = (1e-8, 1e-9, 1e-10)
    results = [_floored(n, *f) for n, *f in matches] + [_floored("floor-free")]
    floor, problems = conformance._floor_problems(results, floors)
    assert floor is None and len(problems) == 1
    assert problems[0].startswith("inconsistent amax floor: no accepted floor matches every case")
    for name, text in named.items():
        assert f"{name} matches only {text}" in problems[0]
    assert "floor-free" not in problems[0]
    # Consistent cases still yield their one floor.
    assert conformance._floor_problems([_floored("a", 1e-8, 1e-9), _floored("b", 1e-9)],
                                       floors) == (1e-9, ())


@pytest.mark.parametrize("target, fragments", [
    ("no_such_module_xyz:fn", ["no module named 'no_such_module_xyz'"]),
    ("torch_bridge:no_such_fn", ["has no attribute 'no_such_fn'"]),
])
def test_bad_targets_are_one_line(woa, one_line_error, target, fragments):
    one_line_error(woa("conformance", target), *fragments)


@pytest.mark.parametrize("args, fragments", [
    (["torch_bridge.ops"], ["is not MODULE:FUNCTION"]),
    (["tests/cli/missing.py:fn"], ["does not exist"]),
    (["os:getcwd"], ["cannot tell", "--op"]),
    (["torch_bridge:wo_a_fp8", "--group-size", "96"], ["--group-size", "invalid choice"]),
])
def test_more_bad_targets_in_process(main_error, args, fragments):
    main_error(["conformance", *args], *fragments)


@pytest.mark.parametrize("args, fragments", [
    # A chain where an op is expected: its arguments say so before any case runs.
    (["torch_bridge:wo_a_fp8"], ["takes (o, positions, cos_cache, sin_cache, weight,",
                                 "a wo_a chain, not one op"]),
    (["torch_bridge:WoAProjection", "--op", "inverse_rope_group_quant"],
     ["a wo_a chain, not one op"]),
    # The other op's arguments.
    (["torch_bridge:inverse_rope_group_quant", "--op", "batched_gemm_a8w8_mxscale"],
     ["not batched_gemm_a8w8_mxscale's positional arguments (x, w, x_scale, w_scale)"]),
    # The other framework's arrays.
    (["woa_jax:inverse_rope_group_quant"], ["is a jax function: pass --numpy"]),
    (["torch_bridge.jax_ops:inverse_rope_group_quant"], ["is a jax function: pass --numpy"]),
    (["torch_bridge:inverse_rope_group_quant", "--numpy"], ["takes torch tensors: drop --numpy"]),
])
def test_usage_mistakes_are_not_contract_breaks(main_error, args, fragments):
    main_error(["conformance", *args, "--quick"], *fragments)


def test_a_device_that_is_not_here_is_a_usage_error(main_error, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    main_error(["conformance", "torch_bridge:inverse_rope_group_quant", "--device", "cuda"],
               "--device cuda: no such device here")


def test_a_backend_that_cannot_run_is_not_run_not_a_break(main_error, monkeypatch, capsys):
    """WOA_BACKEND asks torch_bridge for a backend switched off: nothing is compared (exit 2)."""
    from torch_bridge import _dispatch

    monkeypatch.setenv("WOA_BACKEND", "triton")
    monkeypatch.setenv("WOA_USE_TRITON", "0")
    _dispatch.reset_caches()
    try:
        main_error(["conformance", "torch_bridge:inverse_rope_group_quant", "--quick"],
                   "not run: backend 'triton' cannot run inverse_rope_group_quant: disabled "
                   "by WOA_USE_TRITON=0")
    finally:
        monkeypatch.undo()
        _dispatch.reset_caches()


def test_a_good_jax_function_with_numpy_conforms(woa):
    proc = woa("conformance", "woa_jax:inverse_rope_group_quant", "--numpy", "--quick", "-k",
               "large")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("PASS")


# The importable sweep (what another project's pytest suite calls).


def _oracle_quant(o, positions, cos, sin, num_groups, quant_group_size):
    return woa_jax.inverse_rope_group_quant(o, positions, cos, sin, num_groups, quant_group_size)


def _torch_quant(o, positions, cos, sin, num_groups, quant_group_size):
    import jax.numpy as jnp

    import torch_bridge

    # The sweep hands numpy arrays; torch_bridge takes torch tensors or JAX arrays.
    o, positions, cos, sin = (jnp.asarray(a) for a in (o, positions, cos, sin))
    return torch_bridge.inverse_rope_group_quant(o, positions, cos, sin, num_groups,
                                                 quant_group_size, backend="torch")


def test_sweep_is_importable_from_testing_and_passes_an_exact_implementation():
    """The pure-torch reference is an implementation of its own (not the oracle the sweep
    compares with), exact by design: it must pass."""
    report = run_conformance(_torch_quant, quick=True, select="large")
    assert report.passed and report.op == "inverse_rope_group_quant" and report.cases
    assert report.summary().startswith("PASS")


def test_assert_conformance_names_the_failing_case():
    def fp8_off(o, positions, cos, sin, num_groups, quant_group_size):
        x, s = _oracle_quant(o, positions, cos, sin, num_groups, quant_group_size)
        x = np.asarray(x).view(np.uint8).copy()
        x[0, 0, 5] ^= 1  # one payload bit
        return x.view(ml_dtypes.float8_e4m3fn), s

    with pytest.raises(AssertionError, match=r"(?s)^FAIL: .*-large: fp8 bytes .* first at "
                                             r"\[0, 0, 5\]: got 0x01, expected 0x00"):
        assert_conformance(fp8_off, op="inverse_rope_group_quant", quick=True, select="large")


def test_sweep_contents_and_argument_errors():
    quick = conformance.list_cases("inverse_rope_group_quant", quick=True)
    assert {c.rsplit("gs128-", 1)[1] for c in quick} == set(conformance.QUANT_PATTERNS)
    full = conformance.list_cases("batched_gemm_a8w8_mxscale")
    assert len(full) == 3 * 3 * 2 and any("-G8-M33-" in c for c in full)
    with pytest.raises(ValueError, match="no inverse_rope_group_quant case id contains"):
        run_conformance(_oracle_quant, select="nothing-like-this")
    with pytest.raises(ValueError, match="group_sizes"):
        run_conformance(_oracle_quant, group_sizes=(96,))
    with pytest.raises(ValueError, match="cannot tell which op"):
        run_conformance(lambda a, b: a)


def test_conformance_module_does_not_import_torch():
    code = "import sys, woa_jax.testing, woa_jax.conformance; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
