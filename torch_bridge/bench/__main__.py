"""``python -m torch_bridge.bench``: a usage error is one line and exit 2, as in ``woa bench``."""

import sys

from .run import main

try:
    code = main()
except SystemExit as e:
    if not isinstance(e.code, str):
        raise
    print(f"woa bench: error: {e.code}", file=sys.stderr)
    code = 2
raise SystemExit(code)
