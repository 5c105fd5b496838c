"""``--jax-step``: its options, a tiny CPU run, the checks' premises, ``vs_graph`` and the CSV
rows of older harnesses without that column."""

from __future__ import annotations

import json
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch_bridge.bench import build_parser, jax_step, main, problem, report, results  # noqa: E402

on_cpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rows of the harness")


def test_options_parse():
    args = build_parser().parse_args(["--jax-step", "--layers", "8,61", "--routes",
                                      "native,torch_graph", "--groups", "2", "--ms", "1,8192"])
    assert args.jax_step and args.layers == (8, 61) and args.routes == ("native", "torch_graph")
    assert jax_step.GPU.layers == (8, 61) and jax_step.GPU.groups == (2, 8, 16)
    assert jax_step.GPU.ms == (1, 16, 64, 256, 1024, 8192)


@pytest.mark.parametrize("argv, message", [
    (["--layers", "8"], "--layers applies to --jax-step only"),
    (["--routes", "native"], "--routes applies to --jax-step only"),
    (["--jax-step", "--routes", "native,nope"], "is not a non-empty subset of native,callback"),
    (["--jax-step", "--routes", ","], "is not a non-empty subset"),
    (["--jax-step", "--eager"], "--eager applies to the sweep and --tune"),
    (["--jax-step", "--plot", "x.png"], "--jax-step print tables only"),
])
def test_usage_errors(argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert message in str(e.value.code)


def test_jax_step_is_a_mode_of_its_own(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--jax-step", "--prefill"])
    assert "not allowed with argument" in capsys.readouterr().err


@on_cpu
def test_cpu_rows(bench):
    """Under the interpreter: no native route (a skip that says why), the callback route's last
    layer is the torch layer's bytes, XLA's BF16 step meets the oracle, the torch step by wall
    clock; every row records L and the route's switches."""
    rc, rows = bench("--jax-step", "--reps", "1")
    assert rc == 0
    by = {r["provider"]: r for r in rows}
    assert list(by) == [f"jax_step_{r}" for r in jax_step.ROUTES]
    assert {(r["mode"], r["kind"], r["G"], r["M"]) for r in rows} == {("jax_step", "jax_step",
                                                                       2, 1)}
    native = by["jax_step_native"]
    assert native["us"] is None
    assert native["check"].startswith("skipped: no native route here: JAX's default backend")
    cb = by["jax_step_callback"]
    assert cb["check"].startswith("bytes exact vs torch layer; relerr") and cb["us"] > 0
    assert cb["timer"] == "jit"
    assert json.loads(cb["config"]) == {"layers": 2, "WOA_JAX_NATIVE": "0",
                                        "WOA_JAX_COMMAND_BUFFER": "1", "XLA_FLAGS": ""}
    assert by["jax_step_xla_bf16"]["check"].startswith("relerr")
    graph = by["jax_step_torch_graph"]
    assert graph["timer"] == "wall" and graph["check"].startswith("bytes exact step vs eager")
    assert json.loads(graph["config"]) == {"layers": 2, "backend": "triton"}
    # No ratios or host times of interpreter wall times.
    assert all(r["vs_graph"] is None and r["host_us"] is None for r in rows)


def _row(route, layers, g, m, us):
    return {"mode": "jax_step", "provider": jax_step.provider(route), "G": g, "M": m, "us": us,
            "config": json.dumps({"layers": layers})}


def test_vs_graph_is_the_time_over_the_graph_of_the_same_shape():
    rows = [_row("torch_graph", 8, 2, 1, 10.0), _row("native", 8, 2, 1, 15.0),
            _row("callback", 8, 2, 1, None), _row("xla_bf16", 61, 2, 1, 30.0),
            _row("torch_graph", 61, 2, 1, 20.0), _row("native", 8, 16, 1, 5.0)]
    jax_step.add_ratios(rows)
    assert [r.get("vs_graph") for r in rows] == [None, 1.5, None, 1.5, None, None]


def test_report_shows_layers_and_vs_graph(capsys):
    from rich.console import Console

    rows = [_row("torch_graph", 61, 16, 64, 10.0), {**_row("native", 61, 16, 64, 12.5),
                                                    "vs_graph": 1.25, "check": "bytes exact"}]
    report.print_tables(rows, Console(width=200))
    out = capsys.readouterr().out
    assert "/ graph" in out and "1.25x" in out
    line = next(r for r in out.splitlines() if "jax_step_native" in r)
    assert [c.strip() for c in line.split("│")[1:6]] == ["jax_step_native", "61", "16", "64",
                                                         "-"]


def test_older_csv_reads_and_is_extended_before_appending(tmp_path):
    """A file written before ``vs_graph`` existed: its rows read with the cell empty, and the
    first append rewrites its header alone, leaving its rows' bytes as they were; lines it writes
    end in a bare newline."""
    old_columns = results.COLUMNS[:results.COLUMNS.index("vs_graph")]
    path = tmp_path / "nvidia-h200.csv"
    old_row = ["2025-01-01T00:00:00"] + [""] * (len(old_columns) - 2) + ["bytes exact"]
    body = ",".join(old_row) + "\r\n"
    path.write_bytes((",".join(old_columns) + "\r\n" + body).encode())
    (row,) = results.read(path)
    assert row["vs_graph"] is None and row["check"] == "bytes exact"
    assert results.check_appendable(path) is False
    results.append(path, {"run": "2025-01-02T00:00:00"},
                   [{"mode": "jax_step", "provider": "jax_step_native", "vs_graph": 1.5}])
    header, rest = path.read_bytes().split(b"\n", 1)
    assert header.decode().split(",") == list(results.COLUMNS)
    assert rest.startswith(body.encode()) and b"\r" not in rest[len(body):]
    old, new = results.read(path)
    assert old["vs_graph"] is None and new["vs_graph"] == 1.5 and new["mode"] == "jax_step"


def test_measured_columns_read_as_numbers(tmp_path):
    """Every measured column written by ``append`` reads back as a float, the host time too."""
    path = tmp_path / "nvidia-h200.csv"
    values = {k: 1.5 for k in results.COLUMNS if k in results.FLOAT_COLUMNS or k.startswith("vs_")}
    results.append(path, {"run": "2025-01-02T00:00:00"}, [{"provider": "gemm_triton", **values}])
    (row,) = results.read(path)
    assert {k: row[k] for k in values} == values and "host_us" in values


def test_csv_whose_header_is_not_a_prefix_is_refused(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text(",".join(results.COLUMNS[1:]) + "\n")
    with pytest.raises(ValueError, match="other columns"):
        results.check_appendable(path)


@pytest.mark.parametrize("m, g", [(1, 2), (8, 2), (16, 8), (64, 2), (64, 16), (1024, 2),
                                  (8192, 16)])
def test_native_kernels_are_the_gemm_launch_of_the_jax_launcher(m, g):
    """The check's reference for the native route runs the torch launcher with the tile the
    JAX launcher lowers (the pointer kernel, K split as torch splits it)."""
    from torch_bridge.backends.triton import jax_launch

    n, k, block, dh, rd = 1024, 4096, 128, 512, 64
    fused, cfg = jax_step._route_kernels("native", m, g, n, k, block, dh, rd, on_gpu=False)
    assert fused == jax_launch.wo_a_fp8_fits(m, g, n, k, block, dh, rd)
    if fused:
        assert cfg is None
        return
    import jax.numpy as jnp

    call = jax_launch.gemm_call(m, g, n, k, block, n // block, dtype=jnp.bfloat16)
    cx = dict(call.constexprs)
    assert (cfg.block_m, cfg.block_n, cfg.swap_ab, cfg.split_k, cfg.tma) == (
        cx["BLOCK_M"], cx["BLOCK_N"], cx["SWAP_AB"], cx["SPLIT_K"], False)
    assert (cfg.num_warps, cfg.num_stages) == (call.num_warps, call.num_stages)


@pytest.mark.parametrize("m, g", [(1, 2), (64, 2), (256, 2), (1, 16), (8192, 16)])
def test_callback_kernels_are_the_launchers_own(m, g, monkeypatch):
    """The callback route runs the torch launchers with their own config, recorded or not
    (split K on XLA's scratch): the fused kernel where the torch launcher fuses, else its
    quant, then its GEMM."""
    from torch_bridge.backends.triton import configs

    n, k, block, dh, rd = 1024, 4096, 128, 512, 64
    from torch_bridge.backends.triton import jax_launch

    dependent = jax_launch.chain_dependent(m, g, n, k, block, wgmma=jax_launch.wgmma_ok())
    fused = configs.wo_a_fp8_chosen(m, g, n, k, block, dependent=dependent)
    assert fused == (m == 1 and not (g == 2 and dependent))
    for flag in ("1", "0"):
        monkeypatch.setenv("WOA_JAX_COMMAND_BUFFER", flag)
        assert jax_step._route_kernels("callback", m, g, n, k, block, dh, rd,
                                       on_gpu=False) == (fused, None)


def test_fp8_check_falls_back_to_the_routes_kernels_and_still_catches_wrong_bits():
    """Where the torch layer launches other kernels, the route's output must equal the torch
    launcher running the route's kernels; a wrong output fails either way."""
    from torch_bridge.backends.triton import launch

    p = problem.make_problem(problem.CPU, 2, 1, "cpu", 0)
    y = launch.wo_a_fp8(p.o, p.pos, p.cos_bf16, p.sin_bf16, p.w, p.ws, p.g, single_kernel=False)

    def last_bit_flipped(t, i):  # within the oracle's tolerance, not the same bytes
        t = t.clone()
        t.view(torch.int16).view(-1)[i] ^= 1
        return t

    other = last_bit_flipped(y, 0)  # as if the layer's kernels rounded one sum otherwise
    assert jax_step.check_fp8(y, "callback", y, p, on_gpu=False).startswith(
        "bytes exact vs torch layer")
    msg = jax_step.check_fp8(y, "callback", other, p, on_gpu=False)
    assert msg.startswith("bytes exact vs torch launch of the same kernels (the layer")
    wrong = last_bit_flipped(y, 1)
    with pytest.raises(AssertionError, match="vs torch launch of the callback route's kernels"):
        jax_step.check_fp8(wrong, "callback", other, p, on_gpu=False)


@pytest.mark.parametrize("route", ["fp8", "xla_bf16"])
def test_the_step_is_laid_out_as_a_models(route, monkeypatch):
    """One rope table for every layer, each layer its own weight, each layer after the one
    before: the step's arguments are the tables, three weights and the step's inputs, and a
    barrier ties each layer after the first to the output before it."""
    import jax
    import jax.numpy as jnp

    from torch_bridge import interop

    monkeypatch.setenv("WOA_BACKEND", "triton")
    monkeypatch.setenv("WOA_JAX_NATIVE", "0")
    p = problem.make_problem(problem.CPU, 2, 1, "cpu", 0)
    j = interop.to_jax
    if route == "fp8":
        params = ((j(p.cos_bf16), j(p.sin_bf16)), ((j(p.w), j(p.ws)),) * 3)
        step = jax_step.fp8_step(2, "triton")
    else:
        params = ((j(p.cos32), j(p.sin32)), (j(p.w_bf16),) * 3)
        step = jax_step.bf16_step(2)
    args = (params, j(p.o), j(p.pos.to(torch.int32)), jnp.asarray(1.0, jnp.bfloat16),
            jnp.asarray(0, jnp.int32))
    lowered = jax.jit(step).lower(*args)
    assert len(jax.tree.leaves(args)) == 2 + (6 if route == "fp8" else 3) + 4
    # Two barriers tie layers 2 and 3 to the ones before; one more guards the outputs.
    assert lowered.as_text().count("optimization_barrier") == 3


def test_jax_rows_record_the_device_allocator_only_when_one_is_set(monkeypatch):
    """Step times move with JAX's device allocator, so a row taken under another one says so;
    the torch graph's row never carries JAX's settings."""
    monkeypatch.delenv("XLA_PYTHON_CLIENT_ALLOCATOR", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    assert jax_step._config("xla_bf16", 8) == {"layers": 8, "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async")
    assert jax_step._config("native", 61)["XLA_PYTHON_CLIENT_ALLOCATOR"] == "cuda_async"
    assert jax_step._config("torch_graph", 61) == {"layers": 61}


def test_step_timing_discards_one_repetition_before_timing():
    """Each variant once, then one untimed repetition, then ``reps`` timed ones (on CPU one
    step each): the first run of back-to-back steps never counts."""
    import jax.numpy as jnp

    calls = []

    def f(params, base_o, base_pos, scale, shift):
        calls.append(int(shift))
        return jnp.zeros(())

    times = jax_step.time_jax_step(f, None, (None, None), layers=2, reps=2, on_gpu=False)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert len(calls) == len(jax_step.VARIANTS) + 1 + 2


def test_step_host_time_is_one_dispatch_per_layer():
    """A step first, then each timed step after the last one's wait, over the variants: the
    median dispatch over the layers."""
    import jax.numpy as jnp

    calls = []

    def f(params, base_o, base_pos, scale, shift):
        calls.append(int(shift))
        time.sleep(0.002)
        return jnp.zeros(())

    us = jax_step.step_host_us(f, None, (None, None), layers=4, calls=3)
    assert calls == [0, 0, 1, 2]
    assert 500 <= us < 5000  # 2 ms a step over 4 layers, plus the call
