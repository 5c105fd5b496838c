"""``python -m torch_bridge.bench``."""

from . import main

raise SystemExit(main())
