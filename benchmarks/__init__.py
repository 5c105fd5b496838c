"""Benchmarks of the ``wo_a`` chain: ``python -m benchmarks.bench --help`` (or ``woa bench``)."""
