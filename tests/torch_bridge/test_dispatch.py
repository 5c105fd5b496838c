"""Backend selection: auto walk, explicit requests, env vars, unimportable backends, logging."""

from __future__ import annotations

import logging
import sys
import types

import numpy as np
import pytest
import torch
from inputs import rope_case

import torch_bridge as tb
from torch_bridge import _dispatch


@pytest.fixture
def args():
    return rope_case(np.random.default_rng(0), s=3, h=2, dh=128, rd=64, num_groups=1).torch()


def test_unimportable_backend_reports_a_reason(monkeypatch):
    monkeypatch.setitem(_dispatch.BACKEND_MODULES, "triton", "no_such_module_here")
    _dispatch.reset_caches()
    ok, reason = _dispatch.check("triton", "wo_a", _dispatch.Case(device_type="cpu"))
    assert not ok
    assert reason.startswith("Triton backend not importable: ") and "no_such_module_here" in reason


def test_module_without_backend_object(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_bridge.backends.empty_mod",
                        types.ModuleType("torch_bridge.backends.empty_mod"))
    monkeypatch.setitem(_dispatch.BACKEND_MODULES, "triton", "empty_mod")
    _dispatch.reset_caches()
    assert tb.available_backends()["triton"] == (
        False, "Triton backend not importable: torch_bridge.backends.empty_mod defines no BACKEND")


def test_auto_falls_back_to_torch_and_logs_each_rejection_once(args, triton_off, caplog):
    caplog.set_level(logging.INFO, logger="woa")
    for _ in range(3):
        tb.inverse_rope_group_quant(*args, 1, 128)
    rejections = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert rejections == [
        "inverse_rope_group_quant: backend aiter not used: AITER is not installed "
        "(no 'aiter' module)",
        "inverse_rope_group_quant: backend triton not used: disabled by WOA_USE_TRITON=0",
    ]


def test_explicit_backend_raises_with_reason(args):
    with pytest.raises(tb.BackendUnavailableError,
                       match="backend 'aiter' cannot run inverse_rope_group_quant: AITER is not "
                             "installed"):
        tb.inverse_rope_group_quant(*args, 1, 128, backend="aiter")
    with pytest.raises(tb.BackendUnavailableError, match="bf16 does not implement"):
        tb.inverse_rope_group_quant(*args, 1, 128, backend="bf16")


def test_env_backend_applies_and_argument_wins(args, monkeypatch):
    monkeypatch.setenv("WOA_BACKEND", "aiter")
    with pytest.raises(tb.BackendUnavailableError, match="backend 'aiter'"):
        tb.inverse_rope_group_quant(*args, 1, 128)
    q, _ = tb.inverse_rope_group_quant(*args, 1, 128, backend="torch")
    assert q.shape == (3, 1, 256)


def test_use_triton_switch(monkeypatch):
    monkeypatch.setenv("WOA_USE_TRITON", "0")
    _dispatch.reset_caches()
    assert tb.available_backends()["triton"] == (False, "disabled by WOA_USE_TRITON=0")
    monkeypatch.setenv("WOA_USE_AITER", "yes")
    _dispatch.reset_caches()
    with pytest.raises(ValueError, match="WOA_USE_AITER='yes' is not a valid switch"):
        tb.available_backends()


def test_interpreter_on_triton_before_3_7_with_numpy_2_4_is_refused(args, monkeypatch,
                                                                      caplog):
    """Triton 3.6's interpreter fails inside a kernel with numpy 2.4: the probe says so, auto
    takes the torch backend and an explicit request raises with the reason."""
    pytest.importorskip("triton")
    import triton

    from torch_bridge.backends.triton import _interpreter_reason

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(np, "__version__", "2.4.6")
    _dispatch.reset_caches()
    why = ("Triton 3.6.0's interpreter (TRITON_INTERPRET=1) cannot run with numpy 2.4.6: "
           "install triton>=3.8 (pip install 'woa[triton]') or numpy<2.4")
    assert tb.available_backends()["triton"] == (False, why)
    caplog.set_level(logging.INFO, logger="woa")
    q, _ = tb.inverse_rope_group_quant(*args, 1, 128)
    assert f"backend triton not used: {why}" in caplog.text
    np.testing.assert_array_equal(
        q.view(torch.uint8).numpy(),
        tb.inverse_rope_group_quant(*args, 1, 128, backend="torch")[0].view(torch.uint8).numpy())
    with pytest.raises(tb.BackendUnavailableError, match="numpy<2.4"):
        tb.inverse_rope_group_quant(*args, 1, 128, backend="triton")
    # Either side of the boundary runs: a newer Triton, an older numpy, a local build's tag.
    for versions in (("3.7.0", "2.4.6"), ("3.6.0", "2.3.5"), ("3.9.0+git1a2b3c", "2.4.0"),
                     ("3.10.0", "3.0.0")):
        assert _interpreter_reason(*versions) is None, versions
    assert _interpreter_reason("3.6.0+gitabc", "2.4.0rc1") is not None


def test_interpreter_before_3_8_refuses_e4m3fnuz(args, monkeypatch, caplog):
    """Triton's interpreter before 3.8 has no e4m3fnuz: auto quantizes to it on the torch
    backend, an explicit triton request raises the reason, e4m3fn still runs on Triton."""
    pytest.importorskip("triton")
    import triton

    monkeypatch.setattr(triton, "__version__", "3.7.1")
    _dispatch.reset_caches()
    why = "Triton 3.7.1's interpreter has no float8_e4m3fnuz (3.8 or newer has)"
    caplog.set_level(logging.INFO, logger="woa")
    fnuz = dict(fp8_dtype=torch.float8_e4m3fnuz)
    q, _ = tb.inverse_rope_group_quant(*args, 1, 128, **fnuz)
    assert f"backend triton not used: {why}" in caplog.text and q.dtype == torch.float8_e4m3fnuz
    np.testing.assert_array_equal(
        q.view(torch.uint8).numpy(),
        tb.inverse_rope_group_quant(*args, 1, 128, backend="torch", **fnuz)[0]
        .view(torch.uint8).numpy())
    with pytest.raises(tb.BackendUnavailableError, match="has no float8_e4m3fnuz"):
        tb.inverse_rope_group_quant(*args, 1, 128, backend="triton", **fnuz)
    tb.inverse_rope_group_quant(*args, 1, 128, backend="triton")


def test_available_backends_and_explain(triton_off):
    avail = tb.available_backends()
    assert set(avail) == set(_dispatch.BACKENDS)
    assert avail["torch"][0] and avail["bf16"][0] and not avail["aiter"][0]
    every = tb.explain(device_type="cpu")
    assert set(every) == {"inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a"}
    wo_a = every["wo_a"]
    # What auto runs says so; the torch FP8 chain can run, but only when named.
    assert wo_a["bf16"] == (True, "auto picks it: the BF16 chain runs any validated wo_a call")
    assert wo_a["torch"] == (True, "FP8 chain on torch; only when named: auto does not take "
                                   "torch for wo_a")
    assert wo_a["aiter"] == (False, "AITER is not installed (no 'aiter' module)")
    assert every["inverse_rope_group_quant"]["bf16"][0] is False
    assert every["inverse_rope_group_quant"]["torch"][1].startswith("auto picks it: ")
    with pytest.raises(ValueError, match="op must be one of"):
        tb.explain("gemm")


def test_explain_follows_woa_backend(triton_off, monkeypatch):
    monkeypatch.setenv("WOA_BACKEND", "torch")
    wo_a = tb.explain("wo_a", device_type="cpu")
    assert wo_a["torch"] == (True, "WOA_BACKEND picks it: FP8 chain on torch")
    assert wo_a["bf16"][1].endswith("; not used: WOA_BACKEND=torch")
    monkeypatch.setenv("WOA_BACKEND", "triton")  # asked for, cannot run: nothing is picked
    wo_a = tb.explain("wo_a", device_type="cpu")
    assert not any(why.startswith(("auto", "WOA_BACKEND")) for _, why in wo_a.values())
    assert _dispatch.picked("wo_a", wo_a) is None


def test_explain_for_a_device_that_is_not_here(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    table = tb.explain("wo_a", device_type="cuda")
    assert set(table.values()) == {(False, "no such device here: torch sees no CUDA or ROCm GPU")}


def test_import_touches_no_gpu_and_no_aiter():
    """Every torch_bridge module and backend imports without a CUDA call or aiter/triton."""
    code = """
import sys, torch
def touched(*a, **k):
    raise AssertionError("a torch.cuda call at import time")
for name in ("is_available", "device_count", "get_device_properties", "get_device_name",
             "current_device", "init", "synchronize"):
    setattr(torch.cuda, name, touched)
import torch_bridge, torch_bridge.ops, torch_bridge.projection, torch_bridge.tp
import torch_bridge.wo_b, torch_bridge.cli, torch_bridge.checkpoint, torch_bridge.jax_ops
import torch_bridge.backends.aiter, torch_bridge.backends.torch_ref, torch_bridge.backends.bf16
import torch_bridge.backends.triton
vendor = sorted(m for m in sys.modules if m.split(".")[0] in ("aiter", "triton"))
assert not vendor, vendor
"""
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_every_backend_satisfies_the_protocol():
    for name in _dispatch.BACKENDS:
        be = _dispatch.get_backend(name)
        assert isinstance(be, _dispatch.Backend), name
        assert be.name == name and be.ops <= {"inverse_rope_group_quant",
                                               "batched_gemm_a8w8_mxscale", "wo_a_fp8",
                                               "wo_a_bf16"}
    assert _dispatch.get_backend("bf16").ops == {"wo_a_bf16"}
    assert "wo_a_fp8" in _dispatch.get_backend("triton").ops


def test_backend_breaking_the_protocol_is_unavailable_with_the_reason(monkeypatch):
    module = types.ModuleType("torch_bridge.backends.partial_mod")

    class Partial:
        name = "triton"

        def is_available(self):
            return True, "yes"

    module.BACKEND = Partial()
    monkeypatch.setitem(sys.modules, "torch_bridge.backends.partial_mod", module)
    monkeypatch.setitem(_dispatch.BACKEND_MODULES, "aiter", "partial_mod")
    _dispatch.reset_caches()
    ok, reason = _dispatch.check("aiter", "inverse_rope_group_quant",
                                 _dispatch.Case(device_type="cpu"))
    assert not ok and reason == (
        "AITER backend object torch_bridge.backends.partial_mod.BACKEND does not satisfy the "
        "backend protocol: it lacks ops, rope_in_activation_dtype, supports")


def test_op_missing_from_ops_is_refused(args):
    with pytest.raises(tb.BackendUnavailableError,
                       match="backend 'bf16' cannot run batched_gemm_a8w8_mxscale: bf16 does "
                             "not implement batched_gemm_a8w8_mxscale"):
        tb.batched_gemm_a8w8_mxscale(*_gemm(), backend="bf16")


def _gemm():
    from inputs import gemm_operands, np_to_torch

    return [np_to_torch(a) for a in gemm_operands(np.random.default_rng(0), m=2, g=1, n=128,
                                                  k=128)]


def test_cases_of_jax_calls_are_built_without_torch():
    """``jax_ops`` describes its calls to the dispatcher with ``_dispatch``'s builders, which
    read shapes and dtype names only: no torch import."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import jax, jax.numpy as jnp\n"
        "from torch_bridge import _dispatch\n"
        "o = jax.ShapeDtypeStruct((3, 2, 512), jnp.bfloat16)\n"
        "cos = jax.ShapeDtypeStruct((64, 32), jnp.float32)\n"
        "x = jax.ShapeDtypeStruct((3, 2, 512), jnp.float8_e4m3fn)\n"
        "w = jax.ShapeDtypeStruct((2, 128, 512), jnp.float8_e4m3fn)\n"
        "q = _dispatch.rope_case(o, cos, 128, jnp.float8_e4m3fn, num_groups=2, amax_floor=1e-8,\n"
        "                        device_type='cuda')\n"
        "g = _dispatch.gemm_case(x, w, 128, jnp.bfloat16, device_type='cuda',\n"
        "                        x_k_contiguous=True)\n"
        "print(q.act_dtype, q.rope_dim, g.get('n'), 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["bfloat16", "64", "128", "False"]
