"""The peer rows (vLLM's quant, DeepGEMM, their chain) where the peers are absent, the loader of
vLLM's quant file and its stand-ins, the ``vs_peer`` ratio and results files written before it."""

from __future__ import annotations

import csv
import io
import pathlib
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch_bridge.bench import peers, problem, report, results, sweep  # noqa: E402
from torch_bridge.bench.providers import DEFAULT, PROVIDERS  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
on_cpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rows of the harness")


def test_peer_rows_are_registered_in_the_default_sweep():
    kinds = {name: PROVIDERS[name].kind for name in
             ("quant_vllm", "gemm_deepgemm", "chain_peer", "chain_fp8")}
    assert kinds == {"quant_vllm": "quant", "gemm_deepgemm": "gemm", "chain_peer": "chain",
                     "chain_fp8": "chain"}
    assert set(kinds) <= set(DEFAULT)
    assert set(sweep.PEER_OF.values()) <= set(PROVIDERS)


@on_cpu
def test_peer_rows_skip_without_a_gpu_saying_why(bench):
    rc, rows = bench("--ms", "1", "--reps", "1", "--providers",
                     "quant_vllm,gemm_deepgemm,chain_peer")
    assert rc == 0
    checks = {r["provider"]: r["check"] for r in rows}
    assert checks["quant_vllm"].startswith("skipped: vLLM's kernel casts with .to(float8e4nv)")
    for name in ("gemm_deepgemm", "chain_peer"):
        assert checks[name] == "skipped: the DeepGEMM rows use its sm_90 recipe (fp32 scales): " \
                               "sm_90 GPUs only"
    assert all(r["us"] is None for r in rows)


@on_cpu
def test_deepgemm_backend_rows_skip_without_it_saying_why(bench):
    rc, rows = bench("--ms", "1", "--reps", "1", "--providers",
                     "gemm_deepgemm_op,chain_fp8_deepgemm")
    assert rc == 0
    for r in rows:
        assert r["us"] is None and r["check"].startswith(
            "skipped: the deepgemm backend cannot run here: "), r


def test_missing_vllm_file_is_a_skip_naming_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("WOA_PEERS_DIR", str(tmp_path))
    assert peers.peers_dir() == tmp_path
    with pytest.raises(problem.Skip) as e:
        peers.vllm_quant()
    msg = str(e.value)
    assert f"vLLM's quant file is not at {tmp_path / peers.VLLM_QUANT_FILE}" in msg
    assert "vllm 0.33.0 wheel" in msg and "WOA_PEERS_DIR" in msg
    monkeypatch.delenv("WOA_PEERS_DIR")
    assert peers.peers_dir() == REPO / "out" / "peers"


#: A file importing what vLLM's quant file imports and using it the same way: a kernel object
#: whose ``__call__`` returns ``(grid, kwargs)``, inputs bound to ``*_ptr`` and upper-case
#: arguments by name, a custom op under ``torch.ops.vllm``, the TMA-aligned size.
_FAKE_PEER = '''
import torch

from vllm.model_executor.warmup.jit_warmup import kernel_launcher
from vllm.model_executor.warmup.jit_warmup_triton_helper import (
    LaunchSpec, TritonWarmupTensor, VllmTritonJitKernel)
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton
from vllm.utils.torch_utils import direct_register_custom_op


class Twice(VllmTritonJitKernel["Twice.Key"]):
    @staticmethod
    @triton.jit
    def kernel(src_ptr, dst_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n) * SCALE, mask=offs < n)

    @kernel_launcher
    def __call__(self, src, dst, n, *, scale) -> LaunchSpec:
        return (1,), dict(dst_ptr=dst, BLOCK=16)


def _impl(src: torch.Tensor, scale: int) -> torch.Tensor:
    dst = torch.empty_like(src)
    _TWICE(src, dst, src.numel(), scale=scale)
    return dst


direct_register_custom_op(op_name="fake_twice", op_func=_impl, fake_impl=_impl)
_TWICE = Twice()


def fused_inv_rope_fp8_quant(src, scale):
    from vllm.utils.deep_gemm import get_tma_aligned_size

    pdl = current_platform.is_arch_support_pdl()
    return torch.ops.vllm.fake_twice(src, scale), get_tma_aligned_size(5, 4), pdl
'''


def test_stand_ins_run_a_file_written_against_vllm_modules(run_python, tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / peers.VLLM_QUANT_FILE).write_text(_FAKE_PEER)
    script = textwrap.dedent("""
        import torch
        from torch_bridge.bench import peers
        f = peers.vllm_quant()
        assert peers.vllm_quant() is f  # loaded once
        y, aligned, pdl = f(torch.arange(10, dtype=torch.float32), 3)
        assert y.tolist() == [3.0 * i for i in range(10)], y
        assert aligned == 8 and pdl is False
        print("ok")
    """)
    proc = run_python("-c", script, cwd=tmp_path, pythonpath=REPO,
                      env={"WOA_PEERS_DIR": str(tmp_path), "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@on_cpu
def test_vllm_quant_file_runs_under_the_interpreter(run_python, tmp_path):
    """vLLM's own file, where it was extracted: its scales (computed without the fp8 cast the
    interpreter gets wrong) equal the oracle's, in DeepGEMM's MN-major TMA-aligned layout."""
    if not (peers.peers_dir() / peers.VLLM_QUANT_FILE).is_file():
        pytest.skip(f"no vLLM quant file under {peers.peers_dir()} (benchmarks/README.md, Peers)")
    script = textwrap.dedent("""
        from torch_bridge import interop
        from torch_bridge.bench import problem, providers, peers
        from woa_jax.testing import assert_bitwise_equal
        p = problem.make_problem(problem.CPU, 2, 5, "cpu", 0)
        q, s = providers._vllm_quant_call(peers.vllm_quant(), p)()
        assert tuple(q.shape) == (5, 2, 512) and q.stride() == (512, 5 * 512, 1), q.stride()
        assert tuple(s.shape) == (5, 2, 4) and s.stride() == (1, 4 * 8, 8), s.stride()
        _, scale = problem.oracle(p, "quant_cuda_floor")
        assert_bitwise_equal(interop.e8m0_bytes(s), scale, name="vLLM scale")
        print("ok")
    """)
    proc = run_python("-c", script, cwd=tmp_path, pythonpath=REPO,
                      env={"WOA_PEERS_DIR": str(peers.peers_dir()), "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_vs_peer_divides_ours_by_the_peer_row():
    rows = {name: {"kind": PROVIDERS[name].kind, "us": us} for name, us in
            [("quant_triton", 3.0), ("quant_vllm", 4.0), ("chain_fp8", 10.0),
             ("chain_fp8_triton", 9.0), ("chain_fp8_deepgemm", 6.0), ("chain_peer", 12.0),
             ("gemm_triton", 5.0), ("gemm_deepgemm", None)]}
    sweep.add_ratios(rows)
    assert rows["quant_triton"]["vs_peer"] == 0.75
    assert rows["chain_fp8"]["vs_peer"] == 10.0 / 12.0
    assert rows["chain_fp8_triton"]["vs_peer"] == 0.75
    assert rows["chain_fp8_deepgemm"]["vs_peer"] == 0.5
    assert {n for n, r in rows.items() if "vs_peer" in r} == set(sweep.PEER_OF)
    assert "vs_deepgemm" not in rows["gemm_triton"]  # the peer row was skipped


def _quant_problem(seed: int = 0):
    """A problem holding only a made-up quant oracle: ``[3, 2, 256]`` fp8, 1 x 128 scales."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 0x7F, (3, 2, 256), dtype=np.uint8)
    s = rng.integers(110, 130, (3, 2, 2), dtype=np.uint8)
    p = problem.Problem(*[None] * 10)
    p.cache["quant_cuda_floor"] = (q, s)
    return p, torch.from_numpy(q.copy()), torch.from_numpy(s.copy())


def test_peer_quant_check_reports_rounding_boundaries_and_fails_wrong_bytes():
    p, q, s = _quant_problem()
    assert problem.check_quant_near(q, s, p, "quant_cuda_floor") == "bytes exact"
    s[1, 0, 1] += 1  # a scale on the other side of a power of two: its group's bytes differ
    q[1, 0, 128:] ^= 0x80
    assert problem.check_quant_near(q, s, p, "quant_cuda_floor") == \
        "bytes differ: fp8 128/1536, scale 1/12"
    s[0, 1, 0] += 2
    with pytest.raises(AssertionError, match="differs from the quant_cuda_floor oracle's by 2"):
        problem.check_quant_near(q, s, p, "quant_cuda_floor")
    p, q, s = _quant_problem()
    q[0, 0, :2] ^= 1  # under equal scales: two bytes where one is allowed
    with pytest.raises(AssertionError, match="2 of 1536 fp8 bytes under equal scales differ"):
        problem.check_quant_near(q, s, p, "quant_cuda_floor")


def test_results_of_earlier_columns_are_upgraded_when_appended(tmp_path):
    """Rows written before ``vs_peer`` (here: the committed H200 rows, cut to the columns
    before it) stay as they were when a run appends to their file."""
    path = tmp_path / "nvidia-h200.csv"
    older = results.COLUMNS[:results.COLUMNS.index("vs_peer")]
    with (REPO / "benchmarks" / "results" / "nvidia-h200.csv").open(newline="") as f:
        kept = [row[:len(older)] for row in list(csv.reader(f))[1:]]
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([older, *kept])
    before = results.read(path)
    assert results.check_appendable(path) is False
    results.append(path, {"run": "r", "machine": "nvidia-h200"},
                   [{"mode": "sweep", "provider": "quant_triton", "us": 2.0, "vs_peer": 0.5}])
    after = results.read(path)
    assert len(after) == len(before) + 1
    assert after[:-1] == before and after[-1]["vs_peer"] == 0.5
    with path.open(newline="") as f:
        assert tuple(f.readline().rstrip("\r\n").split(",")) == results.COLUMNS


def test_tables_show_vs_peer_and_read_rows_without_it():
    from rich.console import Console

    old = {"mode": "sweep", "provider": "gemm_triton", "G": 2, "M": 1, "timer": "graph",
           "us": 5.0, "check": "relerr 1e-3"}
    new = {**old, "provider": "quant_triton", "vs_peer": 0.8}
    out = io.StringIO()
    report.print_tables([old, new], Console(file=out, width=200))
    assert "/ peer" in out.getvalue() and "0.80x" in out.getvalue()
    out = io.StringIO()
    report.print_tables([old], Console(file=out, width=200))
    assert "/ peer" not in out.getvalue() and "gemm_triton" in out.getvalue()
