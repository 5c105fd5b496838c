"""``torch_bridge.cli.output``: tables and prose fit the width, without trailing padding."""

from __future__ import annotations

import json

import pytest

from torch_bridge.cli import output

COLUMNS = ["op", "ok", "why"]
ROWS = [["quant", "yes", ""], ["gemm", "no", "the reason is long enough to need several lines "
                                           "at this width, so it wraps under its own column"]]


def test_last_column_wraps_under_itself():
    lines = output.table(COLUMNS, ROWS, cols=40)
    assert lines[:3] == ["op     ok   why", "-----  ---  " + "-" * 28, "quant  yes"]
    assert lines[3].startswith("gemm   no   the reason")
    assert all(len(line) <= 40 and line == line.rstrip() for line in lines)
    assert all(line.startswith(" " * 12) for line in lines[4:])
    assert " ".join(" ".join(lines[3:]).split()[2:]) == ROWS[1][2]


def test_last_column_moves_below_when_the_row_leaves_no_room():
    rows = [["a" * 30, "yes", "short enough on its own line"]]
    lines = output.table(COLUMNS, rows, cols=40)
    assert lines[2] == "a" * 30 + "  yes"
    assert lines[3] == "    short enough on its own line"


def test_right_aligned_columns_and_a_table_that_fits():
    lines = output.table(["case", "n", "result"], [["a", "1", "ok"], ["b", "100", "ok"]],
                         right=(1,), cols=80)
    assert lines[2:] == ["a       1  ok", "b     100  ok"]


def test_width_is_80_when_piped_unless_columns_says(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert output.width() == 80  # pytest captures stdout: not a terminal
    monkeypatch.setenv("COLUMNS", "120")
    assert output.width() == 120


def test_print_table_wraps_title_and_notes(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "30")
    output.print_table("a title that is longer than thirty columns", COLUMNS, ROWS[:1],
                       notes=["a note that is also longer than thirty columns"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["a title that is longer than", "thirty columns"]
    assert lines[-2:] == ["a note that is also longer", "  than thirty columns"]
    assert all(len(line) <= 30 and line == line.rstrip() for line in lines)


@pytest.mark.parametrize("frac, text", [(None, "-"), (1.0, "100 %"), (0.99999, "99.999 %")])
def test_percentages_keep_near_misses_visible(frac, text):
    assert output.pct(frac) == text


def test_json_to_a_file_or_stdout(tmp_path, capsys):
    output.write_json(str(tmp_path / "r.json"), {"a": 1})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    output.write_json("-", {"b": [1, 2]})
    assert json.loads(capsys.readouterr().out) == {"b": [1, 2]}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        output.check_json_dest(str(tmp_path / "no" / "r.json"))


def test_prose_breaks_between_phrases_not_inside_them():
    text = ("woa verify: v4-flash wo_a, layer 0 (compress rope), tp=8 rank 0: G=1 N=1024 K=4096 "
            "block 128, 32 tokens at positions 0..1000")
    assert output.wrap(text, cols=80) == [
        "woa verify: v4-flash wo_a, layer 0 (compress rope), tp=8 rank 0:",
        "G=1 N=1024 K=4096 block 128, 32 tokens at positions 0..1000"]
    # A phrase longer than a line still wraps between words, within the width.
    long = "a phrase with many words that cannot fit on one narrow line at all, then a tail"
    lines = output.wrap(long, cols=30, indent="  ")
    assert all(len(line) <= 30 for line in lines) and lines[-1] == "  line at all, then a tail"
    assert " ".join(" ".join(lines).split()) == long


def test_a_long_phrase_after_a_full_line_starts_on_the_next():
    lines = output.wrap("abcdefghij abcdefghij, averyveryverylongword and more words here",
                        cols=24)
    assert all(len(line) <= 24 for line in lines), lines
