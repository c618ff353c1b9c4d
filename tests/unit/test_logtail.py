from __future__ import annotations

import time
from pathlib import Path

from hangwatch.collect.logtail import FileLog
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


def test_a_followed_file_stamps_each_line_when_it_was_written(tmp_path: Path):
    """Attach's log: a line is stamped as it comes, not when the next tick reads it."""
    path = tmp_path / "server.log"
    path.write_bytes(b"before attach\n")
    started = time.monotonic()
    log = FileLog(path, clock=lambda: time.monotonic() - started)
    try:
        with path.open("ab", buffering=0) as f:
            time.sleep(0.2)
            written_first = time.monotonic() - started  # just before the write; stamps are rounded to 1 ms
            f.write(b"first\n")
            time.sleep(0.5)
            written_second = time.monotonic() - started
            f.write(b"second\npartial")
            time.sleep(0.3)
        chunk = log.drain()
        assert chunk.lines == ("first", "second")
        assert chunk.new_bytes == len(b"first\nsecond\npartial")
        first, second = chunk.times
        # Read when the kernel says the file was written: far sooner than the 1 s between two ticks.
        assert written_first - 0.001 <= first <= written_first + 0.15, (written_first, first)
        assert written_second - 0.001 <= second <= written_second + 0.15, (written_second, second)
        # The last line without a newline comes once the file has been quiet since the drain before.
        last = log.drain()
        assert last.lines == ("partial",) and len(last.times) == 1
    finally:
        log.close()


def test_a_followed_file_that_is_truncated_is_read_again_from_its_start(tmp_path: Path):
    path = tmp_path / "server.log"
    path.write_bytes(b"old line that is long enough\n")
    log = FileLog(path, clock=time.monotonic)
    try:
        path.write_bytes(b"new\n")
        time.sleep(0.2)
        assert log.drain().lines == ("new",)
    finally:
        log.close()


def test_without_a_clock_the_file_is_read_at_each_drain(tmp_path: Path):
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    log = FileLog(path)
    path.write_bytes(b"a\nb\n")
    chunk = log.drain()
    assert chunk.lines == ("a", "b") and chunk.times == ()
    log.close()


def test_without_inotify_the_file_is_polled(tmp_path: Path, monkeypatch):
    import hangwatch.collect.logtail as logtail

    def refuse(path: Path) -> None:
        raise OSError(28, "inotify watches exhausted")

    monkeypatch.setattr(logtail, "_Inotify", refuse)
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    log = FileLog(path, clock=time.monotonic)
    try:
        path.write_bytes(b"polled\n")
        time.sleep(3 * logtail.POLL_EVERY_S)
        chunk = log.drain()
        assert chunk.lines == ("polled",) and len(chunk.times) == 1
    finally:
        log.close()
