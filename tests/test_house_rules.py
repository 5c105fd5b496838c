"""Rules of the code base that no single op's tests would catch."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("woa_jax", "torch_bridge")

#: A module-level dict that keeps launches, plans or prepared objects across calls.
_TABLE = re.compile(r"^_?[A-Z0-9_]*(PLAN|COMPILED|BOUND|LAUNCH|EAGER|PREPARED)[A-Z0-9_]*\s*"
                    r"(:[^=]*)?=\s*(\{|dict\(|collections\.OrderedDict\(|OrderedDict\()")


def _modules():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_launch_state_lives_in_at_most_three_tables():
    """One table of launches (``_common.LAUNCHES``), one of call plans (``ops._PLANS``) and
    one of prepared layers (``projection._PREPARED``): each tier of cache that saved the same
    host time twice was one more place to keep safe for threads and streams."""
    tables = [f"{path.relative_to(ROOT)}:{line.split('=')[0].split(':')[0].strip()}"
              for path in _modules() if "torch_bridge" in path.parts
              for line in path.read_text().splitlines() if _TABLE.match(line)]
    assert len(tables) <= 3, tables


def _submodules(package_dir: pathlib.Path) -> set[str]:
    return {p.stem for p in package_dir.glob("*.py")} | {
        p.parent.name for p in package_dir.glob("*/__init__.py")}


def test_no_module_imports_a_name_from_its_own_package_init():
    """``from . import x`` must name a submodule: a name re-exported by the package's
    ``__init__`` ties the module to the import order of that file."""
    bad = []
    for path in _modules():
        package_dir = path.parent
        own = ".".join(package_dir.relative_to(ROOT).parts)
        allowed = _submodules(package_dir)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if (node.level == 1 and node.module is None) or (node.level == 0
                                                            and node.module == own):
                bad += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names
                        if a.name not in allowed]
    assert not bad, bad
