"""Fixtures of the torch_bridge tests: clean dispatch state, Triton off, the fake AITER."""

from __future__ import annotations

import pathlib
import sys

import pytest

from torch_bridge import _capability, _dispatch

FAKE_AITER = pathlib.Path(__file__).resolve().parents[1] / "fake_aiter"


@pytest.fixture(autouse=True)
def clean_dispatch(clean_dispatch):
    """Each test starts and ends with no WOA_* variables and no cached probes or backends
    (``tests/conftest.py``)."""


@pytest.fixture
def triton_off(monkeypatch):
    """Keep the auto walks off the Triton backend (its own tests cover it)."""
    monkeypatch.setenv("WOA_USE_TRITON", "0")
    _dispatch.reset_caches()


@pytest.fixture
def fake_aiter(monkeypatch, triton_off):
    """``install(flavour, arch=..., rocm=...)``: put a fake ``aiter`` on ``sys.path`` and make the
    capability probes report a ROCm torch on ``arch``, with CPU tensors standing in for GPU ones.
    """

    def install(flavour: str = "main", *, arch: str | None = "gfx950", rocm: bool = True):
        sys.modules.pop("aiter", None)
        monkeypatch.syspath_prepend(str(FAKE_AITER))
        monkeypatch.syspath_prepend(str(FAKE_AITER / flavour))
        monkeypatch.setattr(_capability, "is_rocm_build", lambda: rocm)
        monkeypatch.setattr(_capability, "gpu_arch", lambda device_index=0: arch)
        monkeypatch.setattr(_capability, "accelerator_device_type", lambda: "cpu")
        _dispatch.reset_caches()
        import aiter_contract_double

        aiter_contract_double.CALLS.clear()
        return aiter_contract_double.CALLS

    yield install
    sys.modules.pop("aiter", None)
    sys.modules.pop("aiter_contract_double", None)
    _dispatch.reset_caches()
