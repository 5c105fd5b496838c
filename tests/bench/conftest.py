"""Fixtures of the harness tests: in-process runs into a temporary results directory, and
subprocesses that run the harness as a user would."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def clean_env(**extra: str) -> dict[str, str]:
    """A fresh machine's environment: no WOA_* switches, no Triton interpreter, JAX on CPU."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WOA_") and k != "TRITON_INTERPRET"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.update(extra)
    return env


@pytest.fixture
def bench(tmp_path):
    """``bench(*args) -> (rc, rows)``: ``torch_bridge.bench.main`` writing under ``tmp_path``;
    ``rows`` are the newest run's rows of the machine's CSV (``cpu.csv`` on CPU)."""
    from torch_bridge.bench import main, results

    (tmp_path / "res").mkdir()

    def run(*args: str):
        rc = main([*map(str, args), "--no-progress", "--results-dir", str(tmp_path / "res")])
        paths = sorted((tmp_path / "res").glob("*.csv"))
        return rc, results.newest_run(results.read(paths[0])) if paths else []

    return run


@pytest.fixture
def run_python():
    """``run_python(*args, cwd, pythonpath, env) -> CompletedProcess``: ``python ARGS`` in a
    subprocess with only ``pythonpath`` importable beside the installed packages, on CPU
    (``env``: variables added)."""

    def run(*args: str, cwd: pathlib.Path, pythonpath: pathlib.Path,
            env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                              cwd=cwd,
                              env=clean_env(PYTHONPATH=str(pythonpath), CUDA_VISIBLE_DEVICES="",
                                            **(env or {})),
                              timeout=timeout)

    return run
