"""Each ``woa`` subcommand with each kind of mistake: one line on stderr, the documented exit
code, no traceback; with ``--json`` to stdout, a JSON error there too."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

from torch_bridge import _dispatch, cli

GOOD = f"{pathlib.Path(__file__).parent / 'good_impl.py'}:inverse_rope_group_quant"
#: Subcommand -> its arguments for a run that would do work (before the mistake is added).
RUNS = {"verify": ["verify", "--tokens", "2"], "probe": ["probe"],
        "inspect": ["inspect", "ckpt"], "conformance": ["conformance", GOOD, "--quick"],
        "bench": ["bench", "--ms", "1", "--reps", "1"]}
#: Kind of mistake -> subcommand -> (extra arguments, fragments of the one line).
MISTAKES = {
    "unknown option": {cmd: (["--no-such-flag"], ["unrecognized arguments: --no-such-flag"])
                       for cmd in RUNS},
    "bad value": {
        "verify": (["--tokens", "x"], ["argument --tokens: invalid int value: 'x'"]),
        "probe": (["--device", "tpu"], ["argument --device: invalid choice: 'tpu'"]),
        "inspect": (["--tp", "x"], ["argument --tp: invalid int value: 'x'"]),
        "conformance": (["--group-size", "96"], ["argument --group-size: invalid choice"]),
        "bench": (["--reps", "x"], ["argument --reps: invalid int value: 'x'"]),
    },
    "missing path": {
        "verify": (["--checkpoint", "/nonexistent/ckpt"], ["/nonexistent/ckpt does not exist"]),
        "probe": (["--json", "/nonexistent/dir/p.json"], ["/nonexistent/dir does not exist"]),
        "inspect": (["/nonexistent/ckpt"], ["/nonexistent/ckpt does not exist"]),
        "conformance": (["/nonexistent/impl.py:fn"], ["file /nonexistent/impl.py does not exist"]),
        "bench": (["--results-dir", "/nonexistent/dir"], ["--results-dir /nonexistent/dir: does "
                                                          "not exist"]),
    },
}


def _run(argv, capsys) -> tuple[int, str, str]:
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as e:  # the harness's own parser exits itself
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code, err, fragments, want=2):
    assert code == want, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("woa") and ": error: " in lines[0], lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.mark.parametrize("kind, cmd", [(k, c) for k, per in MISTAKES.items() for c in per])
def test_each_subcommand_with_each_kind_of_mistake(kind, cmd, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written here
    extra, fragments = MISTAKES[kind][cmd]
    argv = [*RUNS[cmd], *extra]
    if kind == "missing path" and cmd in ("inspect", "conformance"):  # the path is the target
        argv = [cmd, *extra, *RUNS[cmd][2:]]
    code, _, err = _run(argv, capsys)
    _one_line(code, err, fragments)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def backend_env(monkeypatch):
    """``set(**env)``: WOA_* variables for one in-process run, dispatch caches reset around."""

    def set_env(**env: str) -> None:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        _dispatch.reset_caches()

    yield set_env
    monkeypatch.undo()
    _dispatch.reset_caches()


@pytest.mark.parametrize("cmd", ["verify", "conformance", "bench", "probe"])
def test_a_woa_value_the_library_rejects(cmd, capsys, backend_env):
    backend_env(WOA_BACKEND="nope")
    code, _, err = _run(RUNS[cmd], capsys)
    _one_line(code, err, ["WOA_BACKEND='nope' is not a backend"])


@pytest.mark.parametrize("cmd, fragment", [
    ("verify", "not run: backend 'triton' cannot run wo_a: disabled by WOA_USE_TRITON=0"),
    ("conformance", "not run: backend 'triton' cannot run inverse_rope_group_quant: disabled "
                    "by WOA_USE_TRITON=0"),
])
def test_an_explicit_backend_that_cannot_run_is_not_run(cmd, fragment, capsys, backend_env,
                                                        tmp_path):
    """Not a broken contract (exit 1): nothing was compared, and the line says why (exit 2)."""
    backend_env(WOA_BACKEND="triton", WOA_USE_TRITON="0")
    argv = RUNS[cmd] if cmd == "verify" else ["conformance",
                                              "torch_bridge:inverse_rope_group_quant", "--quick"]
    code, _, err = _run(argv, capsys)
    _one_line(code, err, [fragment])


def test_probe_answers_for_an_explicit_backend_that_cannot_run(capsys, backend_env):
    backend_env(WOA_BACKEND="triton", WOA_USE_TRITON="0")
    code, out, _ = _run(["probe", "--json"], capsys)
    assert code == 0
    assert set(json.loads(out)["picked"].values()) == {None}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the issue's case is a CPU machine")
def test_triton_asked_for_on_a_cpu_without_the_interpreter(woa, one_line_error):
    """``WOA_BACKEND=triton woa verify --tokens 2`` as a user types it (no TRITON_INTERPRET)."""
    one_line_error(woa("verify", "--tokens", "2", env={"WOA_BACKEND": "triton"}),
                   "not run: backend 'triton' cannot run wo_a: no GPU", "TRITON_INTERPRET")


@pytest.mark.parametrize("argv, command", [
    (["verify", "--tokens", "x", "--json"], "verify"),
    (["verify", "--json", "--tokens", "0"], "verify"),
    (["probe", "--json", "--device", "tpu"], "probe"),
    (["inspect", "/nonexistent/ckpt", "--json"], "inspect"),
    (["conformance", "torch_bridge:wo_a_fp8", "--json"], "conformance"),
    (["--json"], None),
])
def test_json_usage_errors_write_json_to_stdout(argv, command, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    report = json.loads(out)
    assert report == {"command": command, "ok": False, "exit": 2,
                      "error": err.strip().split(": error: ", 1)[1]}


def test_help_is_fast_because_nothing_heavy_is_imported():
    code = ("import sys, torch_bridge.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = {'torch', 'jax', 'numpy'} & set(sys.modules)\n"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)


def test_verify_shows_progress_on_a_terminal(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code = cli.main(["verify", "--tokens", "2", "--backends", "torch", "--json",
                     tmp_path / "v.json"])
    err = capsys.readouterr().err
    assert code == 0, err
    stages = [s.split(" (")[0] for s in err.split("\r\033[K") if s]
    assert stages[:4] == ["woa verify: reading the layer", "woa verify: 2 attention outputs",
                          "woa verify: the float64 truth", "woa verify: the oracle's BF16 chain"]
    assert "woa verify: torch from jax" in stages and err.endswith("\r\033[K")


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_each_help_lists_its_own_exit_codes_and_says_what_options_do(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    inspect_help = _help(["inspect"], capsys)
    assert "Exit codes: 0 ok; 2 usage error" in inspect_help
    assert "4 a wo_a holds NaN/Inf in its weight or scales" in inspect_help
    assert "verify compared nothing" not in inspect_help and "byte contract" not in inspect_help
    probe_help = _help(["probe"], capsys)
    assert "Exit codes: 0 ok; 2 usage error" in probe_help and "4 " not in probe_help
    conformance_help = _help(["conformance"], capsys)
    assert "1 the implementation breaks the contract" in conformance_help
    assert "--seed SEED seed of the sweep's random inputs" in conformance_help
    verify_help = _help(["verify"], capsys)
    assert "--seed SEED seed of the attention outputs" in verify_help
    assert "default 8: 1 of V4-Flash's 8 groups, 2 of V4-Pro's 16" in verify_help
    assert "3 verify compared nothing" in verify_help
