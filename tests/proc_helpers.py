"""Process helpers for tests that run real programs: spawn and reap whole trees, wait on real state.

* :func:`spawn` starts a command in its own session and, however the ``with`` block ends, kills the
  whole process tree it grew, descendants first, then reaps it (psutil ``reap_children`` style).
* :func:`wait_for_file` and :func:`wait_until` replace sleep-and-hope with a readiness handshake or a
  polled predicate, failing with a clear ``AssertionError`` on timeout.
* :func:`proc_state`, :func:`proc_cpu_seconds`, :func:`proc_io` and :func:`proc_comm` read /proc
  directly, the way the tool under test does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import TypeVar

import psutil

T = TypeVar("T")

#: Seconds a tree gets to exit after SIGTERM before it is SIGKILLed.
TERM_GRACE = 3.0

#: Seconds to wait for SIGKILLed processes to disappear before giving up loudly.
KILL_WAIT = 10.0

#: ``python -c`` code whose main thread ends alone (the exit syscall, not exit_group) while a thread of it
#: sleeps for ``{sleep}`` s: /proc then shows state Z, the main thread's, yet the process runs on and
#: cannot be reaped. ``{ignore_term}``: whether it ignores SIGTERM (then only SIGKILL ends it early).
MAIN_THREAD_EXITS = """
import ctypes, platform, signal, threading, time
if {ignore_term}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
threading.Thread(target=time.sleep, args=({sleep},)).start()
ctypes.CDLL(None).syscall({{"x86_64": 60, "aarch64": 93}}[platform.machine()], 0)
"""


def _session_members(sid: int) -> list[psutil.Process]:
    """Every process whose session id is ``sid``.

    A process that :func:`spawn` started is a session leader, so its session holds exactly its
    descendants (including orphans re-parented to init), unless one of them called setsid() itself.
    The kernel never hands out a pid still used as a session id, so this cannot reach a stranger.
    Only a session leader's session is scanned (``sid`` must be the leader's pid).
    """
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getsid(proc.pid) == sid:
                members.append(proc)
    return members


def tree_of(pid: int, session_only: bool = False) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants (by parentage and by session), deepest first.

    With ``session_only`` only the members of session ``pid`` are returned: use it once ``pid`` itself
    has been reaped, when the number may already name an unrelated new process (a pid that is still
    some process's session id is never reused, so the session scan stays safe).
    """
    found: dict[int, psutil.Process] = {}
    root = None
    if not session_only:
        try:
            root = psutil.Process(pid)
            for child in root.children(recursive=True):
                found[child.pid] = child
        except psutil.NoSuchProcess:
            root = None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        for member in _session_members(pid):
            found.setdefault(member.pid, member)
    found.pop(pid, None)

    def depth(proc: psutil.Process) -> int:
        level = 0
        with contextlib.suppress(psutil.Error):
            for parent in proc.parents():
                level += 1
                if parent.pid == pid:
                    break
        return level

    ordered = sorted(found.values(), key=depth, reverse=True)
    return [*ordered, root] if root is not None else ordered


def _gone(proc: psutil.Process) -> bool:
    """True once ``proc`` has exited: vanished, or a zombie waiting for its parent."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if sig != signal.SIGKILL and proc.status() == psutil.STATUS_STOPPED:
                # A stopped process keeps SIGTERM pending until it runs again.
                proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if not _gone(p)]
    return alive


def kill_tree(popen: subprocess.Popen[Any], term_grace: float = TERM_GRACE) -> None:
    """Kill ``popen``'s whole tree, descendants first: SIGCONT+SIGTERM, wait, SIGKILL, wait, reap.

    Repeats while new descendants keep showing up (a launcher may start ranks while it dies).
    Raises AssertionError if something in the tree survives SIGKILL.
    """
    for _ in range(5):
        procs = tree_of(popen.pid, session_only=popen.returncode is not None)
        procs = [p for p in procs if not _gone(p)]
        if not procs:
            break
        _signal_all(procs, signal.SIGTERM)
        survivors = _wait_gone(procs, term_grace)
        _signal_all(survivors, signal.SIGKILL)
        survivors = _wait_gone(survivors, KILL_WAIT)
        if survivors:
            raise AssertionError(f"processes survived SIGKILL: {[p.pid for p in survivors]}")
    popen.wait(timeout=KILL_WAIT)  # reap our direct child; its orphans are reaped by init
    for stream in (popen.stdin, popen.stdout, popen.stderr):
        if stream is not None:
            stream.close()


@contextlib.contextmanager
def spawn(argv: list[str], **popen_kwargs: Any) -> Iterator[subprocess.Popen[Any]]:
    """Start ``argv`` in a new session; on exit kill and reap its whole process tree.

    Keyword arguments go to :class:`subprocess.Popen` (``start_new_session`` defaults to True).
    """
    popen_kwargs.setdefault("start_new_session", True)
    popen = subprocess.Popen(argv, **popen_kwargs)
    try:
        yield popen
    finally:
        kill_tree(popen)


def wait_until(
    predicate: Callable[[], T], timeout: float, interval: float = 0.05, what: str = "condition"
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def wait_for_file(
    path: str | os.PathLike[str], timeout: float, popen: subprocess.Popen[Any] | None = None
) -> str:
    """Wait until ``path`` exists and return its text; fail early if ``popen`` exits first."""
    target = Path(path)

    def ready() -> bool:
        if target.exists():
            return True
        if popen is not None and popen.poll() is not None:
            raise AssertionError(f"pid {popen.pid} exited with {popen.returncode} before writing {target}")
        return False

    wait_until(ready, timeout, what=f"file {target}")
    return target.read_text()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the ``(comm)`` field, which may itself hold spaces and parens."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2 :].split()


def proc_state(pid: int) -> str:
    """One-letter scheduler state from /proc/PID/stat: R, S, D, T, t, Z, ... ('' if the pid is gone)."""
    try:
        return _stat_fields(pid)[0]
    except (FileNotFoundError, ProcessLookupError):
        return ""


def proc_ended(pid: int) -> bool:
    """No thread of ``pid`` is left: gone from /proc, or a zombie with one thread (state Z is the main
    thread's; num_threads, stat field 20, counts the others until they are released)."""
    try:
        fields = _stat_fields(pid)
    except (FileNotFoundError, ProcessLookupError):
        return True
    return fields[0] in ("Z", "X") and int(fields[17]) <= 1


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) from /proc/PID/stat."""
    fields = _stat_fields(pid)
    # stat field 14 is utime and 15 stime; fields[0] here is field 3 (state).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_io(pid: int) -> dict[str, int]:
    """/proc/PID/io as a dict (rchar, wchar, syscr, syscw, read_bytes, write_bytes, ...)."""
    out = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = int(value)
    return out


def proc_comm(pid: int) -> str:
    """/proc/PID/comm without its newline (at most 15 bytes)."""
    return Path(f"/proc/{pid}/comm").read_text().rstrip("\n")


def proc_cmdline(pid: int) -> str:
    """/proc/PID/cmdline with NULs turned into spaces and trailing padding dropped."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def children_pids(pid: int) -> list[int]:
    """Pids of the direct children of ``pid``, oldest first."""
    kids = psutil.Process(pid).children()
    return [kid.pid for kid in sorted(kids, key=lambda kid: kid.create_time())]


def cpu_delta(pid: int, seconds: float) -> float:
    """CPU seconds ``pid`` used during the next ``seconds`` of wall time (a measurement window)."""
    before = proc_cpu_seconds(pid)
    time.sleep(seconds)
    return proc_cpu_seconds(pid) - before
