"""Run the real hangwatch CLI in a subprocess and read its JSON report (imported by tests as ``hwrun``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
PROGRAMS = TESTS / "programs"


@dataclass
class Outcome:
    rc: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None

    @property
    def verdict(self) -> dict[str, Any]:
        assert self.report is not None, (
            f"no report; rc={self.rc}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"
        )
        verdict: dict[str, Any] = self.report["verdict"]
        return verdict

    def pids(self) -> set[int]:
        assert self.report is not None
        return {p["pid"] for p in self.report["processes"]}

    def process(self, pid: int) -> dict[str, Any]:
        assert self.report is not None
        return next(p for p in self.report["processes"] if p["pid"] == pid)


def hangwatch_argv(*args: str) -> list[str]:
    """The real CLI, as a user runs it: ``python -m hangwatch ARGS``."""
    return [sys.executable, "-m", "hangwatch", *args]


def program(name: str, *args: str) -> list[str]:
    return [sys.executable, str(PROGRAMS / f"{name}.py"), *args]


def run_hangwatch(args: list[str], tmp_path: Path, timeout: float = 120, **kwargs: Any) -> Outcome:
    """``python -m hangwatch ARGS`` with a report in tmp_path; the whole tree is reaped afterwards."""
    from proc_helpers import kill_tree

    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "hangwatch", *args[:1], "--report-json", str(report), *args[1:]]
    if args[0] == "run" and "--run-dir" not in args:
        argv[4:4] = ["--run-dir", str(tmp_path / "run")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **kwargs.pop("env", {})}
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate()
        raise AssertionError(
            f"hangwatch did not finish in {timeout} s\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
        ) from None
    finally:
        kill_tree(proc)
    data = json.loads(report.read_text()) if report.exists() else None
    return Outcome(proc.returncode, out, err, data)


def assert_all_gone(report: dict[str, Any]) -> None:
    """No process of the report's tree is left: same pid with the same command line, not a zombie."""
    import psutil

    left = []
    for rec in report["processes"]:
        try:
            proc = psutil.Process(rec["pid"])
            if proc.status() != psutil.STATUS_ZOMBIE and proc.cmdline() == list(rec["cmdline"]):
                left.append((rec["pid"], rec["cmdline"]))
        except psutil.NoSuchProcess:
            continue
    assert not left, f"left behind: {left}"


def run_in_terminal(
    args: list[str],
    tmp_path: Path,
    timeout: float = 60,
    columns: int = 160,
    env: dict[str, str] | None = None,
) -> Outcome:
    """``python -m hangwatch ARGS`` on a pseudo-terminal (so the Rich live view is on), with a JSON report.

    Its stdout and stderr both go to the terminal: ``Outcome.stdout`` is everything shown there.
    """
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    from proc_helpers import kill_tree

    report = tmp_path / "report.json"
    argv = [sys.executable, "-m", "hangwatch", *args[:1], "--report-json", str(report), *args[1:]]
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    term_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    term_env.update({"TERM": "xterm-256color", "PYTHONUNBUFFERED": "1", **(env or {})})
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=term_env, start_new_session=True, close_fds=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
        else:
            raise AssertionError(f"hangwatch did not finish in {timeout} s:\n{b''.join(chunks)[-4000:]!r}")
        rc = proc.wait(timeout=10)
    finally:
        kill_tree(proc)
        os.close(master)
    data = json.loads(report.read_text()) if report.exists() else None
    return Outcome(rc, b"".join(chunks).decode("utf-8", "replace"), "", data)
