"""The README: its Python example runs as pasted (on CPU: the BF16 fallback against the
oracle), and what it states of the code base agrees with the code."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_python_example_runs(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "the README has no Python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0] + "\nassert relative_error(z, ref) < 0.1\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_declared_license_ships():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_readme_states_the_activations_kept_per_stream():
    from torch_bridge.backends.triton.chain_eager import SCRATCH_BYTES

    text = " ".join((ROOT / "README.md").read_text().split())
    assert f"({SCRATCH_BYTES >> 20} MiB per stream and G" in text


def test_readme_layout_names_every_backend():
    backends = ROOT / "torch_bridge" / "backends"
    names = {p.stem for p in backends.glob("*.py") if p.stem != "__init__"} | {
        f"{p.parent.name}/" for p in backends.glob("*/__init__.py")}
    layout = re.search(r"`backends/` \((.*?)\)", " ".join(
        (ROOT / "README.md").read_text().split())).group(1)
    assert names == {n.strip() for n in layout.split(",")}, layout


def test_readme_env_table_is_the_registered_variables():
    """The README's table and ``ENV_VARS`` (what ``woa probe`` lists and tests clear) name the
    same variables."""
    from torch_bridge._capability import ENV_VARS

    table = re.findall(r"^\| `(WOA_[A-Z_]+)` \|", (ROOT / "README.md").read_text(), re.M)
    assert sorted(table) == sorted(ENV_VARS)
