"""The ``woa`` command's exit codes, the errors that map to them, and its one-line parser."""

from __future__ import annotations

import argparse
import enum


class ExitCode(enum.IntEnum):
    """What a ``woa`` exit status means (``woa --help`` lists them)."""

    #: The command did its work; ``verify``: every FP8 backend that ran matches the oracle.
    OK = 0
    #: A correctness contract is broken: a backend's bytes or output differ from the oracle.
    BROKEN = 1
    #: A usage error: bad argument, path, file or environment value, or a backend asked for that
    #: cannot run here (one line on stderr).
    USAGE = 2
    #: ``verify`` compared no FP8 bytes: the checkpoint cannot take the FP8 path, or none of the
    #: chosen FP8 backends runs here.
    NOT_VERIFIED = 3
    #: The checkpoint's weight or scales hold NaN/Inf (or non-positive scales): corrupt data,
    #: found before any backend ran.
    CORRUPT = 4


_MEANINGS = {
    ExitCode.OK: "ok",
    ExitCode.BROKEN: "a backend breaks the byte contract",
    ExitCode.USAGE: "usage error (bad argument, path, file or environment value, or a backend "
                    "asked for that cannot run here)",
    ExitCode.NOT_VERIFIED: "verify compared nothing (no FP8 backend ran)",
    ExitCode.CORRUPT: "corrupt checkpoint (NaN/Inf in weight or scales)",
}


def exit_codes_help(*codes: ExitCode, **meanings: str) -> str:
    """``"Exit codes: 0 ok; 2 usage error (...)"`` for ``codes``; ``meanings`` (keyed by the
    code's lower-case name) replace the general wording where a command means something more
    precise."""
    return "Exit codes: " + "; ".join(
        f"{int(c)} {meanings.get(c.name.lower(), _MEANINGS[c])}" for c in codes)


EXIT_CODES_HELP = exit_codes_help(*ExitCode)


class UsageError(ValueError):
    """A command-line mistake the user can fix; printed as one line, exit code 2.

    ``prog`` is the command the line names (``woa verify: error: ...``).
    """

    def __init__(self, message: str, *, prog: str = "woa"):
        super().__init__(message)
        self.prog = prog


class NotVerifiedError(RuntimeError):
    """``woa verify`` has nothing to compare (e.g. an unquantized layer); exit code 3."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose mistakes raise ``UsageError`` (one line, exit 2) instead of printing the
    usage block: every ``woa`` command reports a mistake the same way, JSON included."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)", prog=self.prog)
