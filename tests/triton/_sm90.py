"""Run a compile script in a fresh Python without ``TRITON_INTERPRET`` (the GPU-target tests).

The test process interprets the Triton kernels, so compiling them for a GPU target needs a
subprocess; no GPU is needed to compile.
"""

from __future__ import annotations

import os
import subprocess
import sys


def run_compile_script(script: str, cache_dir) -> list[str]:
    """Run ``script`` (Python source) with Triton's cache in ``cache_dir``; its stdout lines.

    Fails the calling test with the end of stderr when the script exits non-zero.
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_dir), TRITON_DEFAULT_FP_FUSION="1",
               JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().split("\n")
