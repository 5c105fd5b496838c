"""The pytest summary says how many GPU tests were deselected and how to run them."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

# Not from conftest: which conftest that name finds depends on the test dirs collected first.
REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("workers", [[], ["-n", "1"]])
def test_summary_counts_deselected_gpu_tests(workers):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
         "tests/woa_jax/test_gpu_jit.py", "tests/triton/test_launch_checks.py"],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert ("1 GPU test(s) deselected; on a CUDA or ROCm machine run them with: python -m "
            "pytest -m gpu tests") in lines
    assert re.match(r"\d+ passed\b", lines[-1])  # the closing line `.ci/run` reads stays last
