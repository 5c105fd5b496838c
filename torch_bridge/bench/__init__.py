"""The ``wo_a`` benchmark harness: every provider checked against the ``woa_jax`` oracle, then
timed; rows appended to ``benchmarks/results/<machine>.csv``.

``python -m torch_bridge.bench --help`` (or ``woa bench --help``); the method is described in
the repository's ``benchmarks/README.md``. Modules: ``problem`` (shapes, inputs, oracle),
``providers`` / ``jax_providers`` (what each row runs), ``sweep``, ``prefill``, ``jax_step``
(jitted multi-layer steps), ``tune``, ``hostcost``, ``timing``, ``results`` (the CSV),
``report`` (tables, plots), ``tp`` (two-GPU tensor parallel).
"""

from __future__ import annotations

from .run import build_parser, main

__all__ = ["build_parser", "main"]
