"""What the ``woa`` command prints: plain-text tables and prose wrapped to the terminal, and JSON.

Lines never end in padding and never run past the terminal width (80 columns when stdout is not
a terminal, or ``COLUMNS``), so output stays readable in pipes and CI logs; prose breaks between
phrases, not inside them. A table's last column wraps under itself; when the other columns leave
it too little room it moves below its row.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import sys
import textwrap
from collections.abc import Sequence

#: The narrowest a wrapped last column may get before it moves below its row.
_MIN_LAST = 20
_GAP = "  "
#: Where prose may break: after a phrase's punctuation, or before a parenthesis.
_PHRASES = re.compile(r"(?<=[,;:.]) (?=\S)| (?=\()")
_BELOW = "    "


def width() -> int:
    """Columns to fill: the terminal's, ``COLUMNS`` if set, else 80."""
    return shutil.get_terminal_size((80, 24)).columns


def wrap(text: str, *, indent: str = "", first: str = "", cols: int | None = None) -> list[str]:
    """``text`` as lines of at most ``cols`` characters, broken between phrases.

    A line breaks after ``,`` ``;`` ``:`` or ``.`` or before ``(`` when the next phrase does not
    fit, so ``G=1 N=1024 K=4096`` stays on one line; only a phrase longer than a line is broken
    between words. Words are never split.
    """
    cols = max(cols or width(), len(first) + 8, len(indent) + 8)
    lines: list[str] = []
    line = first
    for phrase in _PHRASES.split(" ".join(text.split())):
        sep = " " if line.strip() else ""
        if len(line) + len(sep) + len(phrase) <= cols:
            line += sep + phrase
            continue
        if line.strip() and len(indent) + len(phrase) <= cols:  # the phrase fits a new line
            lines.append(line.rstrip())
            line = indent + phrase
            continue
        # Longer than a line: words fill this line and the next ones.
        lead = line + sep if line.strip() else line
        if line.strip() and len(lead) + len(phrase.split(" ", 1)[0]) > cols:
            lines.append(line.rstrip())
            lead = indent
        parts = textwrap.wrap(phrase, cols, initial_indent=lead, subsequent_indent=indent,
                              break_long_words=False, break_on_hyphens=False)
        lines.extend(p.rstrip() for p in parts[:-1])
        line = parts[-1]
    lines.append(line.rstrip())
    return lines


def say(text: str, *, indent: str = "") -> None:
    """Print prose wrapped to the terminal (continuation lines indented by ``indent``)."""
    print("\n".join(wrap(text, indent=indent)))


def table(columns: Sequence[str], rows: Sequence[Sequence[object]], *,
          right: Sequence[int] = (), cols: int | None = None) -> list[str]:
    """The lines of a table: a header, a rule, one row per entry (the last column wrapped)."""
    cols = cols or width()
    cells = [[str(c) for c in columns]] + [[str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lead = sum(widths[:-1]) + len(_GAP) * (len(columns) - 1)
    room = cols - lead
    below = room < min(_MIN_LAST, widths[-1])

    def line(r: Sequence[str], last: str) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r[:-1], widths, strict=False))]
        return (_GAP.join(parts) + _GAP + last).rstrip()

    rule = len(cells[0][-1]) if below else min(widths[-1], max(room, len(cells[0][-1])))
    out = [line(cells[0], cells[0][-1]), line(["-" * w for w in widths], "-" * rule)]
    for r in cells[1:]:
        if below:
            out.append(line(r, ""))
            if r[-1]:
                out.extend(wrap(r[-1], indent=_BELOW, first=_BELOW, cols=cols))
            continue
        first, *rest = wrap(r[-1], cols=room) if r[-1] else [""]
        out.append(line(r, first))
        out.extend((" " * lead + t).rstrip() for t in rest)
    return out


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], *,
                right: Sequence[int] = (), notes: Sequence[str] = ()) -> None:
    """A title, the table, then the notes (each wrapped, continuation lines indented)."""
    say(title)
    print()
    print("\n".join(table(columns, rows, right=right)))
    if notes:
        print()
    for note in notes:
        say(note, indent="  ")


def check_json_dest(dest: str | None) -> None:
    """Fail before the work, not after it, when ``--json FILE`` cannot be written."""
    if dest in (None, "-"):
        return
    parent = pathlib.Path(dest).resolve().parent
    if not parent.is_dir():
        raise FileNotFoundError(f"--json {dest}: directory {parent} does not exist")


def write_json(dest: str | None, payload: dict) -> None:
    """``payload`` as JSON to file ``dest``, or to stdout for ``"-"``; nothing for ``None``."""
    if dest is None:
        return
    text = json.dumps(payload, indent=1, default=str)
    if dest == "-":
        sys.stdout.write(text + "\n")
    else:
        pathlib.Path(dest).write_text(text + "\n")


def pct(frac: float | None) -> str:
    """A fraction as a percentage; exactly 1 prints as ``100 %`` so near misses stand out."""
    if frac is None:
        return "-"
    return "100 %" if frac == 1.0 else f"{100 * frac:.3f} %"


def sci(v: float | None) -> str:
    return "-" if v is None else f"{v:.1e}"


def ms(sec: float | None) -> str:
    if sec is None:
        return "-"
    return f"{sec * 1e3:.1f} ms" if sec < 10 else f"{sec:.1f} s"
