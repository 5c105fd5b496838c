"""Moved to ``tests/inputs.py``; re-exported here until every importer imports from ``inputs``."""

from inputs import run_compile_script  # noqa: F401
