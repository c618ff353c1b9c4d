"""Servers that ``bench --launch-a/--launch-b`` starts, under the same supervision as ``hangwatch run``.

The launch, the watch and the tear-down are ``hangwatch run``'s own (``supervise.session``), with three
differences: the watch keeps running in a thread after ``ready``, for as long as the benchmark runs, so a
boot that hangs ends in a stall verdict instead of a benchmark that waits forever, and a server that
crashes mid-benchmark stops the benchmark with the crash verdict; no stacks are taken (a dump pauses the
server being measured); and two trees are watched at once, so we do not become their subreaper (an adopted
orphan could not be told apart between the two trees). Members already seen stay members after
reparenting (start times), and cleanup signals each tree's whole session, which is what catches the rest.

Each server gets a run directory of its own, laid out as ``hangwatch run``'s: ``output.log``,
``report.json`` and ``run.json`` (so ``hangwatch cleanup --run DIR`` finds the tree if we are killed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.model.bench import Boot
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.render.json_report import write_report
from hangwatch.render.live import LiveState
from hangwatch.supervise.plan import Plan
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.plan import plan_for
from hangwatch.supervise.session import Supervised
from hangwatch.supervise.session import start_supervised


@dataclass(frozen=True)
class LaunchSpec:
    label: str
    command: tuple[str, ...]
    watch: WatchOptions  # ready_url set to the server's /v1/models; report_json unused
    run_dir: Path  # this server's own
    grace_s: float


class _EventView:
    """The watch's view: no echo (the bench owns the terminal), phase events passed on with the label."""

    def __init__(self, label: str, say: Callable[[str], None] | None) -> None:
        self._label = label
        self._say = say

    def echo(self, data: bytes) -> None:
        return None

    def update(self, state: LiveState) -> None:
        return None

    def event(self, text: str) -> None:
        if self._say is not None:
            self._say(f"{self._label}: {text}")

    def block(self, text: str) -> None:
        return None  # no --keep-running here: a trial, a bench server, ends at its verdict

    def close(self) -> None:
        return None


class SupervisedServer:
    """One launched server tree, watched in a thread from launch until :meth:`stop`."""

    def __init__(self, spec: LaunchSpec, say: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self._say = say
        self.plan: Plan = plan_for(spec.watch, spec.command)
        self._ready = threading.Event()  # set on ready, and on any other verdict
        self.ready_verdict: Verdict | None = None
        self.failure: Verdict | None = None  # a verdict other than ready: stalled, crashed, exited, timeout
        self._gpu = NvmlGpuSource()
        self._run: Supervised | None = None
        self._thread: threading.Thread | None = None
        self.log_path = spec.run_dir / "output.log"
        self.report_path = spec.run_dir / "report.json"
        self._stopped: str | None = None  # what stop() said, once it ran

    def start(self) -> None:
        self.spec.run_dir.mkdir(parents=True, exist_ok=True)
        view = _EventView(self.spec.label, self._say)
        self._run = start_supervised(
            self.spec.command, self.plan, self.spec.watch, self.spec.run_dir,
            view=view, gpu=self._gpu, adopt_orphans=False, watch_serving=False,
            flight_recorder=False,  # a benchmark measures the server as it is: nothing added to a collective
        )  # fmt: skip
        self._thread = threading.Thread(
            target=self._loop, name=f"hangwatch-bench-{self.spec.label}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        assert self._run is not None

        def until(v: Verdict) -> bool:
            if v.state is State.READY:
                self.ready_verdict = v
                self._ready.set()
                return False  # keep watching while the benchmark runs
            self.failure = v
            self._ready.set()
            return True

        try:
            self._run.watch.run(until)
        finally:
            self._ready.set()

    def wait_ready(self, poll_s: float = 0.2) -> Verdict:
        """Block until ready or another verdict (the watch's own --timeout bounds the wait)."""
        while not self._ready.wait(poll_s):
            if self._thread is not None and not self._thread.is_alive():
                break
        if self.failure is not None:
            return self.failure
        if self.ready_verdict is not None:
            if self._run is not None and self._run.prober is not None:
                self._run.prober.stop()  # serving: no more probe traffic to perturb the measurement
            return self.ready_verdict
        raise RuntimeError(f"server {self.spec.label}: the watch ended without a verdict")

    def trouble(self) -> str | None:
        """Why the benchmark must stop on this server's account (it crashed or exited); None while serving."""
        v = self.failure
        return f"server {self.spec.label} {v.headline}" if v is not None else None

    def boot(self) -> Boot | None:
        if self.ready_verdict is None or self._run is None:
            return None
        return Boot(
            command=redact_argv(self.spec.command),
            ready_after_s=round(self._run.assessor.ready_at or 0.0, 3),
            log_path=str(self.log_path),
            report_path=str(self.report_path),
        )

    def stop(self) -> str:
        """Stop watching, stop the tree (SIGTERM, grace, SIGKILL), write its report; say what happened."""
        run = self._run
        if run is None:
            self._gpu.close()
            return "not started"
        if self._stopped is not None:
            return self._stopped
        watch = run.watch
        watch.stop_requested.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.failure is None:
            # A last look before cleanup: the server may have died after the watch's last tick (a benchmark
            # that saw it vanish stops at once), and that death is the verdict, not our SIGTERM.
            last = watch.observe_last()
            if last is not None and last.state is not State.READY:
                self.failure = last
        result, gpu_note = run.tear_down(self._gpu, self.spec.grace_s)
        self._gpu.close()
        verdict = self.failure or self.ready_verdict or watch.interrupted()
        notes = ["bench: the server ran under hangwatch bench", "cleanup: " + result.describe()]
        notes += [*run.kit.notes, *([gpu_note] if gpu_note else [])]
        report = watch.report(
            verdict, self.plan.profile.name, "run", redact_argv(self.spec.command), tuple(notes)
        )
        write_report(report, self.report_path)
        self._stopped = result.describe()
        return self._stopped
