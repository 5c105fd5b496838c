"""The harness on CPU at tiny shapes: every row checked, timed by wall clock, written as data."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch_bridge.bench import build_parser, main, results  # noqa: E402

#: What a CPU run records; on a GPU machine tests/bench/test_harness_gpu.py checks the GPU rows.
on_cpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rows of the harness")


@on_cpu
def test_cpu_sweep_checks_each_provider_and_writes_the_machine_csv(bench, tmp_path):
    png = tmp_path / "sweep.png"
    rc, rows = bench("--ms", "1", "--reps", "1", "--plot", png, "--providers",
                     "read_weight,quant_triton,gemm_triton,gemm_bf16,gemm_scaled_mm,chain_bf16,"
                     "chain_bf16_ref")
    assert rc == 0
    by = {r["provider"]: r for r in rows}
    assert set(by) == {"read_weight", "quant_triton", "gemm_triton", "gemm_bf16",
                       "gemm_scaled_mm", "chain_bf16", "chain_bf16_ref"}  # copy only if asked
    assert by["quant_triton"]["check"] == "bytes exact"
    assert by["read_weight"]["check"] == "sums exact" and by["read_weight"]["kind"] == "read"
    for name in ("gemm_triton", "gemm_bf16", "chain_bf16", "chain_bf16_ref"):
        assert by[name]["check"].startswith("relerr"), by[name]
        assert by[name]["us"] > 0 and by[name]["timer"] == "wall"
    assert by["gemm_scaled_mm"]["check"].startswith("skipped: ")
    assert by["gemm_scaled_mm"]["us"] is None
    meta = rows[0]
    assert meta["machine"] == "cpu" and meta["device"] == "cpu"
    assert meta["source"] == results.source_digest() and meta["commit"]
    assert all(r["run"] == meta["run"] and r["torch"] and r["jax"] for r in rows)
    for r in rows:  # what a CPU run does not measure stays empty
        assert r["TFLOP/s"] is None and r["pct_ceiling"] is None and r["vs_bf16"] is None
        assert r["clock"] is None and r["G"] == 2 and r["M"] == 1
    assert png.stat().st_size > 0


@on_cpu
def test_read_weight_check_fails_on_a_wrong_sum(monkeypatch):
    """The floor row checks what its kernel read: a program that skipped bytes fails it."""
    from torch_bridge.bench import problem, read_floor

    sweep = problem.Sweep(groups=(2,), ms=(1,), heads_per_group=1, n=256)
    sets = problem.make_sets(sweep, 2, 1, False, 0)
    _, msg = read_floor.read_weight(sets, False)
    assert msg == "sums exact"
    real = read_floor.read_kernel

    class Short:  # leaves the weight's last word unread
        def __getitem__(self, grid):
            return lambda words, sums, n, **kw: real[grid](words, sums, n - 1, **kw)

    monkeypatch.setattr(read_floor, "read_kernel", Short())
    with pytest.raises(AssertionError, match="differs from torch's"):
        read_floor.read_weight(sets, False)


@on_cpu
def test_runs_append_to_the_same_csv(bench, tmp_path):
    bench("--ms", "1", "--reps", "1", "--providers", "copy")
    rc, rows = bench("--ms", "1", "--reps", "1", "--providers", "copy")
    assert rc == 0 and [r["provider"] for r in rows] == ["copy"]
    every = results.read(tmp_path / "res" / "cpu.csv")
    assert len(every) == 2 and every[0]["run"] != every[1]["run"]


@on_cpu
def test_cpu_table_omits_unmeasured_columns(bench, capsys):
    bench("--ms", "1", "--reps", "1", "--providers", "quant_triton")
    out = capsys.readouterr().out
    assert "bytes exact" in out and "wall" in out
    for header in ("TFLOP/s", "% ceiling", "vs BF16", "cuBLAS", "copy"):
        assert header not in out


@on_cpu
def test_jax_rows_time_back_to_back_calls(bench):
    rc, rows = bench("--ms", "1", "--reps", "1", "--providers", "gemm_jax,chain_fp8_jax_cb")
    by = {r["provider"]: r for r in rows}
    assert rc == 0
    assert by["gemm_jax"]["timer"] == "jit" and by["gemm_jax"]["us"] > 0
    assert by["gemm_jax"]["check"].startswith("relerr")
    assert by["gemm_jax"]["device_us"] is None  # in-jit device time is a GPU measurement
    assert by["chain_fp8_jax_cb"]["check"] == "skipped: command buffers exist on GPUs only"


def test_back_to_back_cycles_the_sets_for_a_steady_loop(monkeypatch):
    """Each repetition makes ``BACK_TO_BACK_CALLS`` calls over the sets in turn (two or four
    sets alone would time the first dispatch and the final wait, not a loop)."""
    import jax
    import jax.numpy as jnp

    from torch_bridge.bench.jax_providers import BACK_TO_BACK_CALLS, JaxTimed

    seen = []
    monkeypatch.setattr(jax, "jit", lambda fn: lambda a, bump: seen.append(a) or jnp.zeros(1))
    timed = JaxTimed(step=None, args=["set0", "set1", "set2"], bump_only=None)
    times = timed.back_to_back_us(2)
    assert len(times) == 2 and all(t > 0 for t in times)
    warm = seen[:3]
    assert warm == ["set0", "set1", "set2"]
    assert seen[3:] == [f"set{i % 3}" for i in range(BACK_TO_BACK_CALLS)] * 2
    seen.clear()
    timed.back_to_back_us(1, calls=1)  # never fewer calls than sets
    assert seen[3:] == ["set0", "set1", "set2"]


@on_cpu
def test_host_cost_mode_times_each_public_op_beside_torch(bench):
    rc, rows = bench("--host-cost", "--reps", "1")
    assert rc == 0
    by = {r["provider"]: r for r in rows}
    assert list(by) == ["inverse_rope_group_quant", "inverse_rope_group_quant, buffers",
                        "batched_gemm_a8w8_mxscale", "batched_gemm_a8w8_mxscale, out",
                        "wo_a_fp8", "wo_a_bf16", "WoAProjection FP8", "WoAProjection BF16",
                        "torch._scaled_mm", "torch.bmm", "bare Triton launch"]
    assert {r["M"] for r in rows} == {1} and {r["mode"] for r in rows} == {"host_cost"}
    for name, r in by.items():
        if name == "torch._scaled_mm":
            assert r["us"] is None and r["check"].startswith("skipped: ")
        else:
            assert r["us"] > 0 and r["timer"] == "host" and r["calls"] >= 1, r


@on_cpu
def test_prefill_rows_total_each_chain(bench):
    rc, rows = bench("--prefill")
    assert rc == 0
    assert [r["provider"] for r in rows] == ["chain_bf16", "chain_bf16_ref", "chain_fp8"]
    for r in rows:
        assert r["mode"] == "prefill" and r["M"] == 40 and r["chunk"] == 16
        assert len(r["runs_ms"].split()) == 3 and r["us"] > 0


@on_cpu
def test_from_csv_prints_and_plots_without_measuring(bench, tmp_path, capsys):
    bench("--ms", "1", "--reps", "1", "--providers", "quant_triton")
    png = tmp_path / "again.png"
    assert main(["--from-csv", str(tmp_path / "res" / "cpu.csv"), "--plot", str(png)]) == 0
    assert "quant_triton" in capsys.readouterr().out and png.stat().st_size > 0


@pytest.mark.parametrize("argv, message", [
    (["--providers", "nope"], "unknown providers ['nope']"),
    (["--tune-kinds", "gemm,x"], "unknown --tune-kinds ['x']"),
    (["--sustained", "--prefill"], "--sustained applies to the sweep and --tune"),
    (["--eager", "--host-cost"], "--eager applies to the sweep and --tune"),
    (["--reps", "0"], "--reps must be at least 1"),
    (["--tune", "--plot", "x.png"], "--plot draws the sweep"),
    (["--tuned", "/nonexistent/t.csv"], "--tuned: cannot read /nonexistent/t.csv"),
    (["--from-csv", "/nonexistent/r.csv"], "--from-csv: cannot read /nonexistent/r.csv"),
])
def test_usage_errors_say_what_was_wrong(argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert message in str(e.value.code)


def test_csv_that_is_not_results_is_refused(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit) as e:
        main(["--from-csv", str(other)])
    assert "holds no results rows" in str(e.value.code)


@on_cpu
def test_tuned_without_tuning_rows_says_how_to_get_them(bench, tmp_path):
    bench("--ms", "1", "--reps", "1", "--providers", "copy")
    with pytest.raises(SystemExit) as e:
        main(["--tuned", str(tmp_path / "res" / "cpu.csv")])
    assert "no timed tuning rows" in str(e.value.code) and "--tune" in str(e.value.code)


@on_cpu
def test_plot_of_a_run_without_sweep_rows_is_a_usage_error(bench, tmp_path):
    bench("--host-cost", "--reps", "1")
    with pytest.raises(SystemExit) as e:
        main(["--from-csv", str(tmp_path / "res" / "cpu.csv"), "--plot", str(tmp_path / "p.png")])
    assert "nothing to plot" in str(e.value.code)


def test_modes_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--tune", "--prefill"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("name, slug", [("NVIDIA H200", "nvidia-h200"), ("cpu", "cpu"),
                                        ("AMD Instinct MI355X", "amd-instinct-mi355x")])
def test_machine_slug(name, slug):
    assert results.machine_slug(name) == slug


def test_csv_with_other_columns_is_not_appended_to(tmp_path):
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    path = tmp_path / f"{results.machine_slug(device)}.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="other columns"):
        results.append(path, {}, [{"mode": "sweep"}])
    with pytest.raises(SystemExit) as e:  # refused before anything is measured
        main(["--results-dir", str(tmp_path), "--providers", "copy", "--no-progress"])
    assert f"{path.name} has other columns" in str(e.value.code)
    assert path.read_text() == "a,b\n1,2\n"


def test_eager_rows_carry_their_graph_ratio_and_host_time(monkeypatch):
    """An eager row is judged against the same calls' graph time and host time, taken in its
    own process: ``vs_graph`` is eager over graph, ``host_us`` the host's time per call."""
    from torch_bridge.bench import sweep, timing

    calls = [lambda: None, lambda: None]  # two input sets
    asked = []

    def time_cuda(fns, *, reps, graph=True, clock="burst"):
        asked.append(("eager", "graph")[graph])
        return [30.0, 31.0, 32.0] if not graph else [20.0, 20.0, 20.0]

    def host_us(fn, *, calls, reps=5, sync=None):
        asked.append(("host", calls))
        return [50.0, 48.0, 52.0]  # per round of both sets

    monkeypatch.setattr(timing, "time_cuda", time_cuda)
    monkeypatch.setattr(timing, "host_us", host_us)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    row = sweep.time_calls(calls, on_gpu=True, reps=3, graph=False)
    assert asked == ["eager", "graph", ("host", timing.EAGER_CALLS // 2)]
    assert (row["timer"], row["clock"], row["us"]) == ("eager", "burst", 31.0)
    assert row["vs_graph"] == pytest.approx(31.0 / 20.0) and row["host_us"] == 25.0
    asked.clear()
    row = sweep.time_calls(calls, on_gpu=True, reps=3)
    assert asked == ["graph"] and "vs_graph" not in row and "host_us" not in row


def test_eager_flag_reaches_the_tune_timer(monkeypatch, tmp_path):
    """``--eager --tune`` times the candidates eagerly, as the flag's help says."""
    from torch_bridge.bench import tune

    seen = []

    def time_calls(calls, *, on_gpu, reps, graph=True, clock="burst"):
        seen.append(graph)
        return {"timer": "wall", "clock": None, "us": 1.0}

    monkeypatch.setattr(tune, "time_calls", time_calls)
    for flags, graph in ((["--eager"], False), ([], True)):
        seen.clear()
        rc = main(["--tune", *flags, "--tune-kinds", "quant", "--ms", "1", "--reps", "1",
                   "--no-progress", "--results-dir", str(tmp_path)])
        assert rc == 0 and seen and set(seen) == {graph}


def test_graph_timer_captures_in_thread_local_mode(monkeypatch):
    """The oracle's JAX runtime threads call the driver while a row is captured; a global-mode
    capture is invalidated by them, so the timer captures thread-local."""
    import contextlib

    from torch_bridge.bench import timing

    modes = []

    class Event:
        def __init__(self, **_):
            pass

        record = synchronize = lambda self: None
        elapsed_time = lambda self, other: 1.0  # noqa: E731

    @contextlib.contextmanager
    def graph(g, **kw):
        modes.append(kw.get("capture_error_mode", "global"))
        yield

    class Graph:
        replay = lambda self: None  # noqa: E731

    class Stream:
        wait_stream = lambda self, other: None  # noqa: E731

    for name, value in {"synchronize": lambda: None, "Stream": Stream, "CUDAGraph": Graph,
                        "graph": graph, "Event": Event, "current_stream": Stream,
                        "stream": lambda s: contextlib.nullcontext()}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    calls = []
    assert timing.time_cuda([lambda: calls.append(1)], reps=2, warmup=1) == [1000.0] * 2
    assert modes and set(modes) == {"thread_local"}
