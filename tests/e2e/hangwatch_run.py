"""`python -m hangwatch run ...` as the end-to-end tests drive it: the process, its output, its tree, its report.

Shared by the tests that boot real engines (test_vllm_cpu.py, test_sglang_cpu.py, test_llamacpp.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

# Grace for SIGKILLed processes to be reaped after hangwatch exits (reparented orphans go via init).
REAP_GRACE_S = 5.0


class HangwatchRun:
    """`python -m hangwatch run ...` in its own session, with its merged output tailed by a thread.

    Every descendant ever seen is recorded with its start time, so the tree can be checked (and killed)
    after hangwatch has exited and its orphans have been reparented away from it. With ``watch_shm`` the
    /dev/shm files the descendants map are recorded too (once a second), so that a test can name what the
    tree left there, and :meth:`kill_all` removes them.
    """

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        *,
        watch_shm: bool = False,
        subcommand: str = "run",
    ) -> None:
        self.log_path = log_path
        self.watch_shm = watch_shm
        self.shm_seen: set[str] = set()
        self.started_at = time.time()
        self.exited_at: float | None = None
        self.lines: list[str] = []
        self.seen: dict[int, float] = {}  # pid -> create_time
        # (pid, create time) -> (first, last) wall time it was seen alive among the descendants (every
        # 0.25 s). Keyed by create time too: pid_max is 32768 here, and vLLM's threads take pids from the
        # same space, so one test's trials can see a pid of an earlier trial reused.
        self.alive: dict[tuple[int, float], tuple[float, float]] = {}
        # (pid, create time) -> what it was when last seen: its status, parent and name, so that a test
        # that finds a process alive too long can say whether it ran or lay unreaped, and whose child.
        self.last_seen_as: dict[tuple[int, float], str] = {}
        self._lock = threading.Condition()
        self._log = log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hangwatch", subcommand, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            env=env,
            start_new_session=True,
        )
        self._record(self.proc.pid)
        self._threads = [
            threading.Thread(target=self._read, name="hangwatch-stdout", daemon=True),
            threading.Thread(target=self._watch_tree, name="hangwatch-tree", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _record(self, pid: int) -> None:
        with contextlib.suppress(psutil.Error):
            # The latest incarnation: a pid reused within the run is the process alive now.
            self.seen[pid] = psutil.Process(pid).create_time()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            with self._lock:
                self.lines.append(line.rstrip("\n"))
                self._lock.notify_all()
        with self._lock:
            self._lock.notify_all()

    def _watch_tree(self) -> None:
        ticks = 0
        while self.proc.poll() is None:
            children = self.descendants()
            if self.watch_shm and ticks % 4 == 0:
                self.shm_seen |= mapped_shm(children)
            ticks += 1
            time.sleep(0.25)

    def descendants(self) -> list[psutil.Process]:
        try:
            children: list[psutil.Process] = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []
        now = time.time()
        for child in children:
            self._record(child.pid)
            with contextlib.suppress(psutil.Error):
                key = (child.pid, child.create_time())
                first, _ = self.alive.get(key, (now, now))
                self.alive[key] = (first, now)
                self.last_seen_as[key] = f"{child.status()} ppid {child.ppid()} {child.name()!r}"
        return children

    def spans(self, pid: int, created_from: float, created_until: float) -> list[tuple[float, float]]:
        """When ``pid`` was seen alive, for its incarnations created within the given wall times only."""
        return [span for _, span in self._incarnations(pid, created_from, created_until)]

    def seen_as(self, pid: int, created_from: float, created_until: float, after: float) -> list[str]:
        """Those incarnations seen alive after ``after``: what each was when last seen (status, parent,
        name) and until when."""
        return [
            f"{pid} {self.last_seen_as.get(key, '?')} until {span[1]:.2f}"
            for key, span in self._incarnations(pid, created_from, created_until)
            if span[1] >= after
        ]

    def _incarnations(
        self, pid: int, created_from: float, created_until: float
    ) -> list[tuple[tuple[int, float], tuple[float, float]]]:
        return [
            (key, span)
            for key, span in self.alive.items()
            if key[0] == pid and created_from <= key[1] <= created_until
        ]

    def wait_for_line(self, needle: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        start = 0
        with self._lock:
            while True:
                for line in self.lines[start:]:
                    if needle in line:
                        return line
                start = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._threads[0].is_alive()):
                    return None
                self._lock.wait(min(remaining, 1.0))

    def find_descendant(self, title: str, timeout: float) -> psutil.Process | None:
        """A descendant whose process title (setproctitle rewrites argv, so cmdline[0]) is `title`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            for proc in self.descendants():
                try:
                    argv0 = (proc.cmdline() or [""])[0].strip()
                except psutil.Error:
                    continue
                # comm is cut to 15 bytes ("VLLM::Worker_TP"), so match the full title in cmdline.
                if argv0 == title:
                    return proc
            time.sleep(0.2)
        return None

    def wait(self, timeout: float) -> int | None:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.exited_at = time.time()
        self._threads[0].join(timeout=5)
        return rc

    def survivors(self, extra_pids: list[int]) -> list[str]:
        """Processes of the tree still alive REAP_GRACE_S after hangwatch exited (ended zombies count as gone)."""
        end = self.exited_at or time.time()
        deadline = time.monotonic() + REAP_GRACE_S
        while True:
            alive = []
            for pid in sorted(set(self.seen) | set(extra_pids)):
                try:
                    proc = psutil.Process(pid)
                    created = proc.create_time()
                    # A pid created outside hangwatch's lifetime is a reuse, not one of ours.
                    if not self.started_at - 1 <= created <= end + 1:
                        continue
                    if pid in self.seen and abs(created - self.seen[pid]) > 0.05:
                        continue
                    # A zombie is gone once no thread of it is left (Z is its main thread's state).
                    if proc.status() == psutil.STATUS_ZOMBIE and proc.num_threads() <= 1:
                        continue
                    alive.append(f"{pid} {proc.status()} {' '.join(proc.cmdline())[:120]!r}")
                except psutil.Error:
                    continue
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)

    def kill_all(self) -> None:
        """SIGKILL every recorded descendant (children first, so nothing respawns), then hangwatch."""
        self.descendants()
        for pid, created in sorted(self.seen.items(), key=lambda item: -item[1]):
            if pid == self.proc.pid:
                continue
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) <= 0.05:
                    proc.kill()  # SIGKILL also ends a SIGSTOPped process
            except psutil.Error:
                pass
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for thread in self._threads:
            thread.join(timeout=5)
        self._log.close()
        # Every process of the tree is gone now, so nobody can use the segments it mapped.
        for path in self.shm_left():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def shm_left(self) -> list[str]:
        """The recorded /dev/shm files of the tree that still exist."""
        return sorted(p for p in self.shm_seen if os.path.exists(p))

    def tail(self, lines: int = 60, width: int = 400) -> str:
        """The last lines of hangwatch's output, each cut at ``width`` (SGLang's server_args= line is 20 kB)."""
        with self._lock:
            return "\n".join(
                line if len(line) <= width else line[:width] + " ..." for line in self.lines[-lines:]
            )


def load_report(path: Path, run: HangwatchRun) -> dict[str, Any]:
    if not path.is_file():
        pytest.fail(f"hangwatch wrote no report at {path}\n--- output tail ---\n{run.tail()}", pytrace=False)
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    assert report.get("schema") == "hangwatch.report/1", report.get("schema")
    return report


def describe(report: dict[str, Any], run: HangwatchRun) -> str:
    """Failure context: the verdict, the phases seen, and the end of the supervised output."""
    phases = [p.get("name") for p in report.get("phases", [])]
    return (
        f"verdict={json.dumps(report.get('verdict'), indent=1)}\nphases={phases}\n"
        f"--- output tail ({run.log_path}) ---\n{run.tail()}"
    )


def report_pids(report: dict[str, Any]) -> list[int]:
    return [int(p["pid"]) for p in report.get("processes", []) if isinstance(p.get("pid"), int)]


def mapped_shm(procs: list[psutil.Process]) -> set[str]:
    """The /dev/shm files the processes map or hold open (an unlinked one is skipped)."""
    found: set[str] = set()
    for proc in procs:
        with (
            contextlib.suppress(OSError),
            open(f"/proc/{proc.pid}/maps", encoding="utf-8", errors="replace") as maps,
        ):
            found |= {line.split(None, 5)[5].strip() for line in maps if " /dev/shm/" in line}
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{proc.pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
                    if target.startswith("/dev/shm/"):
                        found.add(target)
    return {p for p in found if not p.endswith(" (deleted)")}
