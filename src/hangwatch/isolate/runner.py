"""One run of one trial: exactly ``hangwatch run --until-ready``'s supervision, in a run directory of its own.

The launch, watch and tear-down are ``supervise.session.supervise`` (the same stall window, timeout,
readiness rule, clean-up: the tree stopped and reaped, GPU memory waited for, the engine's /dev/shm
leftovers removed). Before each launch the trial's port must be free: a server from the previous trial
that is still closing its socket would turn the next trial into ``port-in-use``; we wait for it
(bounded) and say so when it stays busy. The trial's environment changes are made around the launch
only, and undone after it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from hangwatch.collect import procfs
from hangwatch.isolate.toggles import Applied
from hangwatch.model.isolate import RunResult
from hangwatch.model.report import Report
from hangwatch.render.files import write_atomically
from hangwatch.render.json_report import write_report
from hangwatch.render.live import View
from hangwatch.render.text import culprit_labels
from hangwatch.render.text import verdict_text
from hangwatch.supervise.launcher import reap
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.plan import plan_for
from hangwatch.supervise.session import RunOptions
from hangwatch.supervise.session import supervise

PORT_WAIT_S = 10.0
_POLL_S = 0.05


def probe_port(command: tuple[str, ...], watch: WatchOptions) -> tuple[str, int] | None:
    """The host and port the readiness probe asks (the server's own port), if there is one."""
    url = plan_for(watch, command).probe_url
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.port is None:
        return (parts.hostname or "127.0.0.1", 443 if parts.scheme == "https" else 80)
    return (parts.hostname or "127.0.0.1", parts.port)


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (with SO_REUSEADDR, as servers do)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno not in (errno.EADDRINUSE, errno.EACCES)
    return True


def wait_port_free(host: str, port: int, limit_s: float = PORT_WAIT_S) -> float | None:
    """Seconds waited until the port was free, or None when it stayed busy for ``limit_s``."""
    start = time.monotonic()
    while True:
        if port_free(host, port):
            return time.monotonic() - start
        if time.monotonic() - start >= limit_s:
            return None
        time.sleep(_POLL_S)


@contextlib.contextmanager
def environment(applied: Applied) -> Iterator[None]:
    """The trial's variables set (and unset) in our environment, which the launch copies; undone after."""
    names = [k for k, _ in applied.env_set] + list(applied.env_unset)
    saved = {k: os.environ.get(k) for k in names}
    try:
        for name in applied.env_unset:
            os.environ.pop(name, None)
        for name, value in applied.env_set:
            os.environ[name] = value
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def pids_alive(report: Report) -> list[int]:
    """The processes of a finished run still there (their pid alive with the same start time is checked
    by clean-up; here: any of its pids still in /proc with a thread left). Those that have ended and are
    ours (orphans re-parented to us) are reaped on the way: a zombie of ours stays in the process table,
    beside the next trial, until isolate exits."""
    reap(p.pid for p in report.processes)
    alive = []
    for p in report.processes:
        stat = procfs.read_stat(p.pid)
        if stat is not None and not stat.exited:
            alive.append(p.pid)
    return alive


def run_once(
    applied: Applied,
    watch: WatchOptions,
    run_dir: Path,
    *,
    grace: float,
    view: View,
    port: tuple[str, int] | None,
) -> RunResult:
    """Launch the trial's command once, supervised until its first verdict, and clean up."""
    started = time.monotonic()
    notes: list[str] = []
    if port is not None:
        waited = wait_port_free(*port)
        if waited is None:
            notes.append(f"port {port[1]} still busy after {PORT_WAIT_S:g} s: launched anyway")
        elif waited > 0.2:
            notes.append(f"waited {waited:.1f} s for port {port[1]} to be free")
    run_dir.mkdir(parents=True, exist_ok=True)
    options = RunOptions(
        watch=replace(watch, report_json=None, report_html=None, report_md=None, quiet=True),
        command=applied.argv,
        until_ready=True,
        run_dir=run_dir,
        grace=grace,
    )
    with environment(applied):
        outcome = supervise(options, view)
    report = outcome.report
    if outcome.remaining:
        notes.append(f"clean-up could not stop {len(outcome.remaining)} process(es): {outcome.remaining}")
    left = pids_alive(report)
    deadline = time.monotonic() + 5.0
    while left and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        left = pids_alive(report)
    if left:
        notes.append(f"processes of this run still there after clean-up: {left}")
    write_report(report, run_dir / "report.json")
    write_atomically(run_dir / "verdict.txt", verdict_text(report) + "\n")
    wall = time.monotonic() - started
    return RunResult(
        verdict=report.verdict,
        duration_s=report.duration_s,
        run_dir=str(run_dir),
        culprits=tuple(culprit_labels(report)),
        overhead_s=max(0.0, wall - report.duration_s),
        notes=tuple(notes),
    )
