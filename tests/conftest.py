"""Shared test setup.

Without a GPU, Triton kernels run under the interpreter; the variable must be set before any
``@triton.jit`` kernel is defined, so it is set here, before test modules import the kernels.
The default ``-m 'not gpu'`` deselects the GPU tests; the summary says how many and how to run
them (under pytest-xdist the workers deselect, and report their count back at shutdown).
"""

from __future__ import annotations

import os

import numpy as np
import pytest


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_GPU = _has_gpu()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


_GPU_KEY = "woa_gpu_deselected"
_gpu_deselected = 0


def pytest_deselected(items):
    global _gpu_deselected
    _gpu_deselected += sum(1 for item in items if "gpu" in item.keywords)


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the count to the controller
        workeroutput[_GPU_KEY] = _gpu_deselected


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    global _gpu_deselected
    # Every worker collects the whole suite, so each saw the same deselection.
    _gpu_deselected = max(_gpu_deselected, getattr(node, "workeroutput", {}).get(_GPU_KEY, 0))


def pytest_terminal_summary(terminalreporter):
    if _gpu_deselected:
        terminalreporter.write_line(
            f"{_gpu_deselected} GPU test(s) deselected; on a CUDA or ROCm machine run them with: "
            "python -m pytest -m gpu tests")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def clean_dispatch(monkeypatch):
    """No WOA_* variables and no cached probes or backends, at the start and at the end (every
    torch_bridge test; op tests that go through the dispatcher)."""
    from torch_bridge import _capability, _dispatch

    for var in _capability.ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    _dispatch.reset_caches()
    yield
    _dispatch.reset_caches()
