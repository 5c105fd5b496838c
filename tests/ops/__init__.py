"""The Triton kernels' tests, one file per op (a package: ``test_quant`` and ``test_gemm`` share
their names with the oracle's tests in ``tests/woa_jax``)."""
