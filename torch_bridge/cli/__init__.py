"""The ``woa`` command (also ``python -m torch_bridge``).

Subcommands: ``verify`` (the cross-framework correctness report), ``bench`` (the benchmark
harness, arguments forwarded), ``probe`` (which backend runs here and why not), ``inspect PATH``
(a checkpoint's ``wo_a`` layers and their FP8 eligibility) and ``conformance MODULE:FUNCTION``
(the oracle's sweep on another implementation). Errors are one line on stderr (``woa: error:
...``; ``--debug`` shows the traceback instead); ``ExitCode`` lists the exit statuses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import conformance, inspect, probe, verify
from .errors import EXIT_CODES_HELP, ExitCode, NotVerifiedError, UsageError

#: Errors a user can cause (bad path, file, layer, argument or value): one line, exit 2.
_USER_ERRORS = (OSError, ValueError, KeyError, TypeError, ImportError)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``woa verify: error: ...``) instead of usage + message."""

    def error(self, message: str):
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _cmd_bench(args: argparse.Namespace) -> int:
    from torch_bridge.bench import main as bench_main

    try:
        return int(bench_main(list(args.rest)) or 0)
    except SystemExit as e:  # the harness reports its usage errors as SystemExit(message)
        if isinstance(e.code, str):
            raise UsageError(e.code) from None
        raise
    except _USER_ERRORS as e:  # anything else from inside the harness is a bug: keep the trace
        raise RuntimeError(f"woa bench failed: {type(e).__name__}: {e}") from e


def build_parser() -> argparse.ArgumentParser:
    """The ``woa`` argument parser with every subcommand."""
    parser = _Parser(prog="woa", description="DeepSeek V4 wo_a in FP8: verify, benchmark, "
                     "probe backends, inspect checkpoints, check other implementations.",
                     epilog=EXIT_CODES_HELP + ".")
    parser.add_argument("--version", action="version", version=f"woa {_own_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
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


def _fail(code: ExitCode, message: str) -> int:
    print(f"woa: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``woa`` console script; returns the exit code."""
    from ..checkpoint import NonFiniteTensorError

    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    parser = build_parser()
    first = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if first is not None and argv[first] == "bench":
        # Everything after `bench` belongs to the harness's own parser (including --help).
        args = parser.parse_args(argv[: first + 1])
        args.rest = argv[first + 1:]
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return ExitCode.USAGE
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `woa probe --json | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except NonFiniteTensorError as e:
        if args.debug:
            raise
        return _fail(ExitCode.CORRUPT, f"corrupt checkpoint: {e}")
    except NotVerifiedError as e:
        if args.debug:
            raise
        return _fail(ExitCode.NOT_VERIFIED, f"not verified: {e}")
    except _USER_ERRORS as e:
        if args.debug:
            raise
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        if isinstance(e, OSError) and e.filename and str(e.filename) not in message:
            message = f"{message}: {e.filename}"
        return _fail(ExitCode.USAGE, message)


__all__ = ["ExitCode", "UsageError", "build_parser", "main"]
