"""Build the backend's C++ launch libraries on first use, with the system C++ compiler.

``xla_launch.cc`` (XLA's custom call, ``xla_ffi``) and ``native_launch.cc`` (torch's eager
launches, ``native``) share ``launch_params.h``, which includes the ``cuda.h`` Triton ships
(``cuda_include``). Each library is named by a digest of its
sources, the compiler and the headers it is built against, kept in ``WOA_CACHE_DIR`` and
replaced atomically, so concurrent builds are safe. Nothing here touches a GPU.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile

HERE = pathlib.Path(__file__).parent
#: The header both libraries include.
SHARED_HEADER = HERE / "launch_params.h"


def cuda_include() -> pathlib.Path:
    """The folder of the ``cuda.h`` Triton ships (the driver API's types; no toolkit needed)."""
    import triton

    return pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "include"


def cache_dir() -> pathlib.Path:
    """Where the built libraries live: ``WOA_CACHE_DIR``, else ``~/.cache/woa``."""
    return pathlib.Path(os.environ.get("WOA_CACHE_DIR") or pathlib.Path.home() / ".cache" / "woa")


def compiler() -> str | None:
    """``CXX``, else ``c++`` or ``g++`` on the path."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def library_path(source: pathlib.Path, cxx: str, headers: tuple[pathlib.Path, ...]) -> pathlib.Path:
    """The built library's path: a digest of the sources, the compiler and ``headers``."""
    digest = hashlib.sha256(source.read_bytes())
    digest.update(SHARED_HEADER.read_bytes())
    digest.update(cxx.encode())
    for header in headers:
        digest.update(header.read_bytes())
    return cache_dir() / f"{source.stem}-{digest.hexdigest()[:16]}.so"


def build(source: pathlib.Path, includes: tuple[str, ...],
          headers: tuple[pathlib.Path, ...]) -> pathlib.Path:
    """``source`` built as a shared library against ``includes`` (``headers``: the files there
    it depends on); the cached one when it exists.

    Raises ``RuntimeError`` with the compiler's message when it cannot be built.
    """
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    path = library_path(source, cxx, headers)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = pathlib.Path(tmp) / path.name
        cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC",
               *(arg for include in includes for arg in ("-isystem", include)), str(source),
               "-o", str(out), "-ldl"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {source.name} failed ({' '.join(cmd)}):\n"
                               f"{done.stderr[-2000:]}")
        os.replace(out, path)
    return path
