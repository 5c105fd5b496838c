"""Results as data: every run appends its rows to ``<results dir>/<machine>.csv``
(``--results-dir``, else ``default_dir()``).

Each row carries the machine, the versions, the commit and a digest of the measured sources
(a copied tree may have no git history, or a stale one), the provider, the shape, how it was
timed (``timer``: graph, eager, jit, wall or host; ``clock``: burst or sustained on a GPU) and
the metrics that were measured; a cell left empty was not measured. New columns go at the
end, so that an older file's header is a prefix of ``COLUMNS``: its rows read with the new
cells empty, and appending to it first extends its header.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import json
import os
import pathlib
import platform
import re
import subprocess

COLUMNS = ("run", "machine", "device", "python", "torch", "triton", "jax", "cuda", "commit",
           "source", "mode", "kind", "provider", "G", "M", "N", "K", "sets", "chunk", "calls",
           "timer", "clock", "us", "device_us", "TFLOP/s", "GB/s", "pct_ceiling", "vs_bf16",
           "vs_ref", "vs_deepgemm", "vs_scaled_mm", "runs_ms", "config", "check", "vs_graph",
           "vs_peer", "host_us")
#: Measured columns besides the ``vs_`` ratios: ``read`` returns them as floats.
FLOAT_COLUMNS = frozenset({"us", "device_us", "TFLOP/s", "GB/s", "pct_ceiling", "host_us"})
#: The packages whose sources a row measures, beside this one in the same directory.
SOURCE_PACKAGES = ("woa_jax", "torch_bridge")
#: Their files a row's numbers depend on: Python, and the C++ launchers that encode the kernels'
#: tensor maps and launch them (``torch_bridge/backends/triton``).
SOURCE_SUFFIXES = frozenset({".py", ".cc", ".h"})
_ROOT = pathlib.Path(__file__).resolve().parents[2]


def machine_slug(device_name: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``: the results file's name."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown"


def source_digest(root: str | os.PathLike | None = None) -> str:
    """sha256 (12 hex digits) of the source files (``SOURCE_SUFFIXES``) of ``SOURCE_PACKAGES``
    under ``root`` (default: where this package is installed or checked out), by relative
    path."""
    base = pathlib.Path(root) if root is not None else _ROOT
    h = hashlib.sha256()
    for path in sorted(p for d in SOURCE_PACKAGES for p in (base / d).rglob("*")
                       if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        h.update(path.relative_to(base).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def git_commit() -> str:
    """``WOA_COMMIT``, else the short commit of the tree this package runs from, else unknown."""
    if os.environ.get("WOA_COMMIT"):
        return os.environ["WOA_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=10, cwd=_ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def metadata(on_gpu: bool) -> dict:
    """The per-row metadata of this process (``run`` is the start time, UTC)."""
    import jax
    import torch
    import triton

    device = torch.cuda.get_device_name() if on_gpu else "cpu"
    return {
        "run": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
        "machine": machine_slug(device), "device": device,
        "python": platform.python_version(), "torch": torch.__version__,
        "triton": triton.__version__, "jax": jax.__version__,
        "cuda": torch.version.cuda if on_gpu else "", "commit": git_commit(),
        "source": source_digest(),
    }


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return " ".join(f"{x:.6g}" for x in v)
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return str(v)


def default_dir() -> pathlib.Path:
    """Where rows go without ``--results-dir``: the checkout's ``benchmarks/results`` when these
    packages run from a source checkout that has it, else ``$WOA_CACHE_DIR/results`` (default
    ``~/.cache/woa/results``); never a tree under the working directory."""
    tree = _ROOT / "benchmarks" / "results"
    if tree.is_dir():
        return tree
    cache = os.environ.get("WOA_CACHE_DIR") or pathlib.Path.home() / ".cache" / "woa"
    return pathlib.Path(cache) / "results"


def _header(path: pathlib.Path) -> tuple[str, ...]:
    with path.open(newline="") as f:
        return tuple(next(csv.reader(f), None) or ())


def check_appendable(path: pathlib.Path) -> bool:
    """Whether ``path`` is new (True) or a CSV of these columns or of an older harness's, a
    prefix of them (False); else ``ValueError``."""
    if not path.exists() or path.stat().st_size == 0:
        return True
    header = _header(path)
    if not header or header != COLUMNS[:len(header)]:
        raise ValueError(f"{path} has other columns than this harness writes; move it aside "
                         "or pass another --results-dir")
    return False


def _extend_header(path: pathlib.Path) -> None:
    """Rewrite an older harness's header as ``COLUMNS`` (its rows stay as they are: their
    missing trailing cells read empty)."""
    rest = path.read_bytes().partition(b"\n")[2]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(",".join(COLUMNS).encode() + b"\n" + rest)
    os.replace(tmp, path)


def append(path: pathlib.Path, meta: dict, rows: list[dict]) -> None:
    """Append ``rows`` (with ``meta``) to the CSV at ``path`` (in an existing directory),
    writing its header if new and extending an older one."""
    new = check_appendable(path)
    if not new and _header(path) != COLUMNS:
        _extend_header(path)
    with path.open("a", newline="") as f:
        w = csv.writer(f, lineterminator="\n")  # one line ending, whichever wrote the file
        if new:
            w.writerow(COLUMNS)
        for r in rows:
            w.writerow([_cell({**r, **meta}.get(c)) for c in COLUMNS])


def read(path: str | os.PathLike) -> list[dict]:
    """The rows of a results CSV, numbers as floats, empty cells as None (and the columns an
    older harness did not write)."""
    out = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = tuple(reader.fieldnames or ())
        later = COLUMNS[len(header):] if header == COLUMNS[:len(header)] else ()
        for r in reader:
            row: dict = dict.fromkeys(later)
            for k, v in r.items():
                if v is None or v == "":
                    row[k] = None
                elif k in ("G", "M", "N", "K", "sets", "chunk", "calls"):
                    row[k] = int(v)
                elif k in FLOAT_COLUMNS or k.startswith("vs_"):
                    row[k] = float(v)
                else:
                    row[k] = v
            out.append(row)
    return out


def newest_run(rows: list[dict]) -> list[dict]:
    """The rows of the newest run in ``rows``."""
    if not rows:
        return []
    last = max(r["run"] for r in rows)
    return [r for r in rows if r["run"] == last]


