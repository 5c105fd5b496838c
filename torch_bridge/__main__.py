"""``python -m torch_bridge``: the ``woa`` command (see ``torch_bridge.cli``)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
