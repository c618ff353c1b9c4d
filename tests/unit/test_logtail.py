from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from hangwatch.collect.logtail import FileLog
from hangwatch.collect.logtail import LineSplitter
from hangwatch.collect.logtail import PipeLog
from hangwatch.collect.logtail import clean_text
from hangwatch.collect.logtail import tail_lines


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
    assert clean_text(b"\x00\xff ok \x1b[31mred\x07") == "\ufffd ok red"


# Whole escape sequences go, not only their ESC byte (that left "[31m" in every report).
ESCAPES = [
    (b"\x1b[31mERROR\x1b[0m boom", "ERROR boom"),  # SGR colour
    (b"\x1b[1;38;5;196mbold red\x1b[m", "bold red"),  # 256 colours, the empty reset
    (b"\x1b[?25lhidden cursor\x1b[?25h", "hidden cursor"),  # private modes
    (b"\x1b[2K\x1b[1Gprogress 50%", "progress 50%"),  # tqdm's erase-line and column
    (b"\x1b]0;my title\x07text", "text"),  # OSC ended by BEL
    (b"\x1b]8;;https://x.example\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink, ended by ST
    (b"\x1b]0;cut short\x1b[32mgreen", "green"),  # an OSC that a new escape ends
    (b"\x1b(Bcharset \x1b7saved\x1b8 \x1b=keypad", "charset saved keypad"),  # two-byte and nF escapes
    ("\u009b31mC1 CSI\u009b0m".encode(), "C1 CSI"),  # the 8-bit CSI, as UTF-8
    (b"\x1bPq#0;2;0;0;0\x1b\\after DCS", "after DCS"),  # a device control string (sixel)
    (b"tail \x1b", "tail "),  # a lone ESC at the end
    (b"plain [31m brackets stay", "plain [31m brackets stay"),  # no ESC: the server's own text
]


def test_whole_escape_sequences_are_stripped():
    for raw, clean in ESCAPES:
        assert clean_text(raw) == clean, raw


def test_the_tail_of_a_log_file_has_no_escape_left(tmp_path: Path):
    path = tmp_path / "output.log"
    path.write_bytes(b"\x1b[31mERROR\x1b[0m first\n\x1b]0;t\x07\x1b[?25lsecond\r\x1b[2Kthird\n")
    assert tail_lines(path) == ("ERROR first", "third")


def test_the_pipe_log_is_created_for_its_owner_only(tmp_path: Path):
    """output.log keeps the raw output, secrets included (the reports redact, the log cannot): mode 0600
    from its creation, whatever the umask; an older one of a reused run folder is narrowed too."""
    for existing in (False, True):
        path = tmp_path / f"output-{existing}.log"
        if existing:
            path.write_bytes(b"earlier run\n")
            path.chmod(0o644)
        read_end, write_end = os.pipe()
        old_umask = os.umask(0o002)
        try:
            log = PipeLog(read_end, path, echo=None)
        finally:
            os.umask(old_umask)
        try:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            os.write(write_end, b"token hf_secret\n")
        finally:
            os.close(write_end)
            log.close()
        assert path.read_bytes().endswith(b"token hf_secret\n")


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


def test_a_nodes_log_tail_is_cleaned_as_every_log_line_is(tmp_path: Path):
    """``collect``'s bundle reads the tail of a node's log itself: the same cleaning, not its own."""
    from hangwatch.nodes.collector import CollectOptions
    from hangwatch.nodes.collector import log_tails

    path = tmp_path / "server.log"
    path.write_bytes(b"\x1b[31mRuntimeError\x1b[0m: boom\n\x1b]0;title\x07\x1b[?25lready\n")
    errors: list = []  # type: ignore[type-arg]
    (tail,) = log_tails(CollectOptions(logs=(path,)), [], Path("/proc"), errors)
    assert tail.lines == ("RuntimeError: boom", "ready") and not errors
