"""Fixtures of the ``woa`` command tests: run it in a subprocess, as a user would."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a fresh machine, piped: no WOA_* switches, no Triton interpreter, no
    COLUMNS (so output is 80 columns wide), plus ``extra``.

    The suite's conftest sets TRITON_INTERPRET=1 for the in-process Triton tests; a subprocess
    inheriting it would run the full-size verify through the interpreter.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WOA_") and k not in ("TRITON_INTERPRET", "COLUMNS")}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.update(extra or {})
    return env


@pytest.fixture
def woa():
    """``woa(*args, cwd=None, env=None) -> CompletedProcess``: ``python -m torch_bridge ARGS``
    (``env``: variables added to the clean environment)."""

    def run(*args: str, cwd: pathlib.Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "torch_bridge", *map(str, args)],
                              capture_output=True, text=True, cwd=cwd or REPO,
                              env=_clean_env(env), timeout=timeout)

    return run


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str,
                          code: int = 2) -> None:
    """Exit ``code``, one ``woa...: error:`` line on stderr naming the fragments, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert lines[0].startswith("woa") and ": error: " in lines[0], lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.fixture
def one_line_error():
    return assert_one_line_error


def assert_reads_well(text: str, width: int = 80) -> None:
    """No line ends in padding or runs past ``width`` columns."""
    for line in text.splitlines():
        assert line == line.rstrip(), repr(line)
        assert len(line) <= width, (len(line), line)


@pytest.fixture
def reads_well():
    return assert_reads_well


@pytest.fixture
def main_error(capsys):
    """``main_error(args, *fragments)``: run ``cli.main`` in-process (no interpreter start-up)
    and check the same one-line error contract as ``one_line_error``."""
    from torch_bridge import cli

    def run(args, *fragments: str) -> None:
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as e:  # argparse exits itself
            code = e.code
        out, err = capsys.readouterr()
        assert_one_line_error(subprocess.CompletedProcess(args, code, out, err), *fragments)

    return run
