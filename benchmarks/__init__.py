"""The benchmark's method, results and device script; the harness is ``torch_bridge.bench``."""
