from __future__ import annotations

from hangwatch.collect.logtail import LineSplitter
from hangwatch.collect.logtail import clean_text


def test_newlines_and_carriage_returns_split_lines():
    s = LineSplitter()
    assert s.feed(b"a\nb\r\nLoading: 10%\rLoading: 20%\r") == ["a", "b", "Loading: 10%", "Loading: 20%"]


def test_partial_line_waits_one_quiet_drain():
    s = LineSplitter()
    assert s.feed(b"no newline yet") == []
    assert s.flush_if_quiet() == []  # first quiet drain: maybe more is coming
    assert s.flush_if_quiet() == ["no newline yet"]


def test_huge_line_is_cut_for_analysis_with_bounded_memory():
    s = LineSplitter(max_chars=100)
    lines = s.feed(b"x" * 10_000_000 + b"\nnext\n")
    assert len(lines) == 2 and lines[0].startswith("x" * 100) and "cut by hangwatch" in lines[0]
    assert lines[1] == "next"


def test_binary_junk_and_terminal_escapes_are_neutralised():
    assert clean_text(b"\x00\xff ok \x1b[31mred\x07") == "\ufffd ok [31mred"
