"""``python -m benchmarks.bench``: the harness is ``torch_bridge.bench`` (``woa bench``)."""

from torch_bridge.bench import build_parser, main
from torch_bridge.bench.tune import gemm_candidates

__all__ = ["build_parser", "gemm_candidates", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
