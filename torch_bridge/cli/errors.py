"""The ``woa`` command's exit codes and the errors that map to them."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What a ``woa`` exit status means (``woa --help`` lists them)."""

    #: The command did its work; ``verify``: every FP8 backend that ran matches the oracle.
    OK = 0
    #: A correctness contract is broken: a backend's bytes or output differ from the oracle.
    BROKEN = 1
    #: A usage error: bad argument, path, file or environment value (one line on stderr).
    USAGE = 2
    #: ``verify`` compared no FP8 bytes: the checkpoint cannot take the FP8 path, or none of the
    #: chosen FP8 backends runs here.
    NOT_VERIFIED = 3
    #: The checkpoint's weight or scales hold NaN/Inf (or non-positive scales): corrupt data,
    #: found before any backend ran.
    CORRUPT = 4


EXIT_CODES_HELP = (
    "exit codes: 0 ok; 1 a backend breaks the byte contract; 2 usage error (bad argument, "
    "path, file or environment value); 3 verify compared nothing (no FP8 backend ran); "
    "4 corrupt checkpoint (NaN/Inf in weight or scales)"
)


class UsageError(ValueError):
    """A command-line mistake the user can fix; printed as one line, exit code 2."""


class NotVerifiedError(RuntimeError):
    """``woa verify`` has nothing to compare (e.g. an unquantized layer); exit code 3."""
