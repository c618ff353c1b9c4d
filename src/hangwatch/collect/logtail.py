"""The log boundary: the launched tree's output pipe, or a log file of a tree we attached to.

Robust to what real logs contain: binary junk (decoded with replacement), tqdm's carriage
returns (each update is a line), 10 MB lines (kept whole in the log file, cut for analysis),
and a last line with no newline (emitted once the stream has been quiet for a tick).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from hangwatch.model.samples import LogLines

MAX_LINE_CHARS = 8192  # longer lines are cut for analysis; the log file keeps every byte
_READ_CHUNK = 65536


class LineSplitter:
    """Bytes in, complete lines out; bounded memory whatever the input."""

    def __init__(self, max_chars: int = MAX_LINE_CHARS) -> None:
        self._max = max_chars
        self._partial = bytearray()
        self._overflowed = False
        self._stale = False

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        if data:
            self._stale = False
        start = 0
        for i, byte in enumerate(data):
            if byte in (0x0A, 0x0D):  # \n or \r: tqdm redraws with \r, each redraw is news
                self._append(data[start:i])
                if self._partial or self._overflowed:
                    lines.append(self._take())
                start = i + 1
        self._append(data[start:])
        return lines

    def flush_if_quiet(self) -> list[str]:
        """Emit a pending line that got no new bytes since the previous call."""
        if not self._partial:
            return []
        if self._stale:
            return [self._take()]
        self._stale = True
        return []

    def _append(self, piece: bytes) -> None:
        room = self._max - len(self._partial)
        if len(piece) > room:
            self._partial += piece[: max(room, 0)]
            self._overflowed = True
        else:
            self._partial += piece

    def _take(self) -> str:
        text = clean_text(bytes(self._partial))
        if self._overflowed:
            text += " …[line cut by hangwatch]"
        self._partial.clear()
        self._overflowed = False
        self._stale = False
        return text


# Terminal escape sequences (ECMA-48), whole: dropping only their ESC left "[31m" in every report.
_ESCAPE = re.compile(
    # CSI (ESC [ or the 8-bit CSI): parameters (private modes too: "?25l"), intermediates, a final byte.
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
    # OSC, DCS, SOS, PM, APC: a string up to BEL or ST (ESC \ or the 8-bit ST); a terminal ends one at
    # the next ESC too, and an unterminated one hides the rest of the line, as on a terminal.
    r"|(?:\x1b[]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c|(?=\x1b)|$)"
    # The rest: ESC, intermediates (nF: "ESC ( B"), one final byte (Fp, Fe, Fs: "ESC 7", "ESC =").
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]"
)


def clean_text(raw: bytes | str) -> str:
    """The one cleaning of log text for analysis and every report: decode, strip whole terminal escape
    sequences, then drop the control characters left (C0 but tab, DEL, C1): a log's escapes must not reach
    our terminal, and are noise in a report."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = _ESCAPE.sub("", text)
    return "".join(ch for ch in text if ch == "\t" or (ch >= " " and not "\x7f" <= ch <= "\x9f"))


def tail_lines(path: Path, n: int = 30, max_bytes: int = 65536, max_chars: int = 400) -> tuple[str, ...]:
    """The last ``n`` lines of a log file, read from its last ``max_bytes`` only: each as a terminal
    showed it last (after its last carriage return: a progress bar's final state), control characters
    dropped, cut to ``max_chars``; blank lines skipped."""
    try:
        with path.open("rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - max_bytes - 1)
            f.seek(start)
            raw = f.read(max_bytes + 1)
    except OSError:
        return ()
    if start > 0:  # one byte before the window: up to its first newline is the end of an earlier line
        raw = raw[raw.find(b"\n") + 1 :] if b"\n" in raw else b""
    pieces = raw.split(b"\n")
    lines = []
    for piece in pieces:
        text = clean_text(piece.rstrip(b"\r").rsplit(b"\r", 1)[-1])
        if text.strip():
            lines.append(text if len(text) <= max_chars else text[: max_chars - 1] + "…")
    return tuple(lines[-n:])


LOG_MODE = 0o600  # the raw output keeps what the reports redact (a token the server printed)


def open_private_log(path: Path) -> BinaryIO:
    """``path`` for appending, readable by its owner only: created 0600 by open(2) itself, so that no
    moment exists when another user could open it (a chmod after the creation leaves one). A log left by
    an earlier run in the same folder is narrowed to 0600 too (where it is ours to change)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, LOG_MODE)
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, LOG_MODE)
    return os.fdopen(fd, "ab", buffering=0)


class PipeLog:
    """Reads the tree's stdout+stderr pipe in a thread: every byte to the log file, lines to a buffer."""

    def __init__(
        self,
        fd: int,
        log_path: Path,
        echo: Callable[[bytes], None] | None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._fd = fd
        self._clock = clock
        self._times: list[float] = []
        self._last_data = time.monotonic()
        self.path = log_path
        self._echo = echo
        self._splitter = LineSplitter()
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._bytes = 0
        self.closed = threading.Event()
        self._file = open_private_log(log_path)
        self._thread = threading.Thread(target=self._pump, name="hangwatch-log", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            while True:
                try:
                    data = os.read(self._fd, _READ_CHUNK)
                except OSError:
                    break
                if not data:
                    break
                self._file.write(data)
                if self._echo is not None:
                    self._echo(data)
                with self._lock:  # the splitter is shared with drain()
                    self._add(self._splitter.feed(data))
                    self._bytes += len(data)
                    self._last_data = time.monotonic()
        finally:
            with self._lock:
                # End of stream: whatever is pending is the last line, newline or not.
                self._add(self._splitter.flush_if_quiet() + self._splitter.flush_if_quiet())
            self.closed.set()

    def _add(self, lines: list[str]) -> None:
        self._lines.extend(lines)
        if self._clock is not None and lines:
            now = round(self._clock(), 3)
            self._times.extend(now for _ in lines)

    def settle(self, quiet_s: float = 0.05, limit_s: float = 0.3) -> None:
        """Let the last lines of a process that just ended reach us: wait until the pipe has been quiet
        for ``quiet_s`` (or closed), at most ``limit_s``. Its traceback names the cause of its death."""
        deadline = time.monotonic() + limit_s
        while not self.closed.is_set() and time.monotonic() < deadline:
            with self._lock:
                idle = time.monotonic() - self._last_data
            if idle >= quiet_s:
                return
            time.sleep(quiet_s / 2)

    def drain(self) -> LogLines:
        with self._lock:
            self._add(self._splitter.flush_if_quiet())
            times = tuple(self._times) if len(self._times) == len(self._lines) else ()
            chunk = LogLines(tuple(self._lines), self._bytes, times)
            self._lines = []
            self._times = []
            self._bytes = 0
        return chunk

    def close(self, timeout: float = 2.0) -> None:
        """Wait briefly for the writers' last bytes (they are gone once the tree is), then close."""
        self.closed.wait(timeout)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._file.close()


# A followed log file is read when the kernel says it was written (inotify), so a line is stamped within
# a few milliseconds of its writing (causes.AROUND_S is set from it). Polling instead cost 0.9 % of a core
# at 40 reads a second (benchmarks/bench_log_follow.py), for nothing while the file is quiet.
IN_MODIFY = 0x00000002
IN_CLOEXEC = 0o2000000
STOP_CHECK_S = 0.5  # how soon close() is noticed while the file stays quiet
POLL_EVERY_S = 0.1  # without inotify (its watches exhausted): read this often instead


class _Inotify:
    """One inotify watch on one file, through libc: the kernel's word that the file was written."""

    def __init__(self, path: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self.fd, os.fsencode(path), IN_MODIFY) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, "inotify_add_watch")

    def wait(self, timeout: float) -> bool:
        """True when the file was written (the events are consumed), False on the timeout."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        os.read(self.fd, 65536)
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class FileLog:
    """Follows a log file someone else writes, from its end at the moment we attach.

    With a ``clock``, a thread reads it as soon as the kernel says it was written and stamps each line
    then, as PipeLog does for a launched tree: a line's time is when it was written, not when the next
    tick read it. Attach ordered a SIGKILL after the exception it caused when both fell within one tick
    (SGLang's TP0 raised 57 ms after TP1 was killed: the exception was read at the tick, 0.2 s after the
    death, and taken for the tear-down's reason).
    """

    def __init__(
        self, path: Path, from_start: bool = False, clock: Callable[[], float] | None = None
    ) -> None:
        self.path = path
        self._splitter = LineSplitter()
        self._offset = 0 if from_start else path.stat().st_size
        self._clock = clock
        self._lock = threading.Lock()  # the splitter and the buffers are shared with the thread
        self._lines: list[str] = []
        self._times: list[float] = []
        self._bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notify: _Inotify | None = None
        if clock is not None:
            with contextlib.suppress(OSError):
                self._notify = _Inotify(path)
            self._thread = threading.Thread(target=self._follow, name="hangwatch-logfile", daemon=True)
            self._thread.start()

    def _follow(self) -> None:
        assert self._clock is not None
        while not self._stop.is_set():
            if self._notify is not None:
                if not self._notify.wait(STOP_CHECK_S):
                    continue
            elif self._stop.wait(POLL_EVERY_S):
                return
            with self._lock:
                lines, total = self._read()
                self._bytes += total
                if lines:
                    now = round(self._clock(), 3)
                    self._lines.extend(lines)
                    self._times.extend(now for _ in lines)

    def _read(self) -> tuple[list[str], int]:
        """The complete lines written since the last read, and how many bytes came."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return [], 0
        if size < self._offset:  # truncated or rotated: start over
            self._offset = 0
        if size == self._offset:
            return [], 0
        lines: list[str] = []
        total = 0
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                while total < 16 * _READ_CHUNK * 16:  # bounded per read; the rest comes next time
                    data = f.read(_READ_CHUNK)
                    if not data:
                        break
                    total += len(data)
                    lines.extend(self._splitter.feed(data))
        except OSError:
            return lines, total
        finally:
            self._offset += total
        return lines, total

    def drain(self) -> LogLines:
        with self._lock:
            lines, total = self._read()
            lines = self._lines + lines
            total += self._bytes
            times = [*self._times]
            if self._clock is not None:
                now = round(self._clock(), 3)
                times.extend(now for _ in range(len(lines) - len(times)))
            # A last line without its newline is emitted once the file has been quiet for a tick.
            quiet = self._splitter.flush_if_quiet()
            if quiet and self._clock is not None:
                times.extend(round(self._clock(), 3) for _ in quiet)
            lines.extend(quiet)
            self._lines, self._times, self._bytes = [], [], 0
        return LogLines(tuple(lines), total, tuple(times) if self._clock is not None else ())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * STOP_CHECK_S)
        if self._notify is not None:
            self._notify.close()
