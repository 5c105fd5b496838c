"""The ``woa`` command (also ``python -m torch_bridge``).

Subcommands: ``verify`` (the cross-framework correctness report), ``bench`` (the benchmark
harness, arguments forwarded), ``probe`` (which backend runs here and why not), ``inspect PATH``
(a checkpoint's ``wo_a`` layers and their FP8 eligibility) and ``conformance MODULE:FUNCTION``
(the oracle's sweep on another implementation). Errors are one line on stderr (``woa verify:
error: ...``; ``--debug`` shows the traceback instead), and with ``--json`` to stdout also a
JSON object ``{"ok": false, "exit": code, "error": line}`` there; ``ExitCode`` lists the exit
statuses.

Nothing heavy is imported until a subcommand runs, so ``woa --help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from . import conformance, inspect, probe, verify
from .errors import EXIT_CODES_HELP, ExitCode, NotVerifiedError, OneLineParser, UsageError

#: Errors a user can cause (bad path, file, layer, argument or value): one line, exit 2.
_USER_ERRORS = (OSError, ValueError, KeyError, TypeError, ImportError)
#: Subcommands that run backends, so read the WOA_* switches (probe reports them itself).
_RUNS_BACKENDS = ("verify", "conformance", "bench")


def _cmd_bench(args: argparse.Namespace) -> int:
    from torch_bridge.bench import main as bench_main

    try:
        return int(bench_main(list(args.rest)) or 0)
    except SystemExit as e:  # the harness reports its usage errors as SystemExit(message)
        if isinstance(e.code, str):
            raise UsageError(e.code, prog="woa bench") from None
        raise
    except _USER_ERRORS as e:  # anything else from inside the harness is a bug: keep the trace
        raise RuntimeError(f"woa bench failed: {type(e).__name__}: {e}") from e


def build_parser() -> argparse.ArgumentParser:
    """The ``woa`` argument parser with every subcommand."""
    parser = OneLineParser(prog="woa", description="DeepSeek V4 wo_a in FP8: verify, benchmark, "
                           "probe backends, inspect checkpoints, check other implementations.",
                           epilog=EXIT_CODES_HELP + ".")
    parser.add_argument("--version", action="version", version=f"woa {_own_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    verify.add_parser(sub)
    b = sub.add_parser("bench", help="benchmark harness (arguments go to the harness)",
                       description="Forward to the benchmark harness; try `woa bench --help`.",
                       add_help=False)
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(func=_cmd_bench)
    probe.add_parser(sub)
    inspect.add_parser(sub)
    conformance.add_parser(sub)
    return parser


def _own_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("woa")
    except metadata.PackageNotFoundError:
        return "unknown"


def _json_to_stdout(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for JSON on stdout (``--json`` without a file, or ``--json -``)."""
    for i, a in enumerate(argv):
        if a in ("--json=-", "--json=") or (a == "--json" and (
                i + 1 == len(argv) or argv[i + 1] == "-" or argv[i + 1].startswith("-"))):
            return True
    return False


def _fail(code: ExitCode, message: str, *, prog: str = "woa", command: str | None = None,
          as_json: bool = False) -> int:
    """One line on stderr (any multi-line message joined), and the JSON error when asked."""
    line = " ".join(str(message).split())
    print(f"{prog}: error: {line}", file=sys.stderr)
    if as_json:
        sys.stdout.write(json.dumps({"command": command, "ok": False, "exit": int(code),
                                     "error": line}, indent=1) + "\n")
    return code


def _classify(e: BaseException) -> tuple[ExitCode, str] | None:
    """The exit code and line of an error a user can act on; ``None`` for a bug (traceback)."""
    checkpoint = sys.modules.get("torch_bridge.checkpoint")  # imported if it can have raised
    from .._dispatch import BackendUnavailableError

    if checkpoint is not None and isinstance(e, checkpoint.NonFiniteTensorError):
        return ExitCode.CORRUPT, f"corrupt checkpoint: {e}"
    if isinstance(e, NotVerifiedError):
        return ExitCode.NOT_VERIFIED, f"not verified: {e}"
    if isinstance(e, BackendUnavailableError):
        return ExitCode.USAGE, f"not run: {e}"
    if isinstance(e, _USER_ERRORS):
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        if isinstance(e, OSError) and e.filename and str(e.filename) not in message:
            message = f"{message}: {e.filename}"
        return ExitCode.USAGE, message
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``woa`` console script; returns the exit code."""
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    parser = build_parser()
    first = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    command = argv[first] if first is not None else None
    as_json = _json_to_stdout(argv) and command != "bench"
    try:
        if command == "bench":
            # Everything after `bench` belongs to the harness's own parser (including --help).
            args = parser.parse_args(argv[: first + 1])
            args.rest = argv[first + 1:]
        else:
            args = parser.parse_args(argv)
    except UsageError as e:
        return _fail(ExitCode.USAGE, str(e), prog=e.prog, command=command, as_json=as_json)
    if args.command is None:
        parser.print_help()
        return ExitCode.USAGE
    as_json = as_json or getattr(args, "json", None) == "-"
    try:
        if args.command in _RUNS_BACKENDS:  # a bad WOA_* value is a usage error, said first
            probe.check_environment()
        return int(args.func(args))
    except BrokenPipeError:  # `woa probe --json | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except Exception as e:
        found = None if args.debug else _classify(e)
        if found is None:
            raise
        return _fail(*found, prog=f"woa {args.command}", command=args.command, as_json=as_json)


__all__ = ["ExitCode", "UsageError", "build_parser", "main"]
