"""Servers that ``bench --launch-a/--launch-b`` starts, under the same supervision as ``hangwatch run``.

Built from the pieces ``run`` uses (launch, the tree sampler, the log pipe, the probe, the assessor, the
watch loop) with one difference: the watch keeps running in a thread after ``ready``, for as long as the
benchmark runs, so a boot that hangs ends in a stall verdict instead of a benchmark that waits forever,
and a server that crashes mid-benchmark stops the benchmark with the crash verdict.

Two trees are watched at once, so we do not become their subreaper: an adopted orphan could not be told
apart between the two trees. Members already seen stay members after reparenting (start times), and
cleanup signals each tree's whole session, which is what catches the rest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hangwatch.collect.logtail import PipeLog
from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.collect.proctree import TreeSampler
from hangwatch.model.bench import Boot
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.render.json_report import write_report
from hangwatch.render.live import LiveState
from hangwatch.supervise import cleanup
from hangwatch.supervise.launcher import Launched
from hangwatch.supervise.launcher import launch
from hangwatch.supervise.launcher import reap
from hangwatch.supervise.plan import Plan
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.plan import make_assessor
from hangwatch.supervise.plan import make_prober
from hangwatch.supervise.plan import make_scanner
from hangwatch.supervise.plan import plan_for
from hangwatch.supervise.watch import Collectors
from hangwatch.supervise.watch import Watch


@dataclass(frozen=True)
class LaunchSpec:
    label: str
    command: tuple[str, ...]
    watch: WatchOptions  # ready_url set to the server's /v1/models; report_json unused
    run_dir: Path
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
        self._launched: Launched | None = None
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self.log_path = spec.run_dir / f"server-{spec.label}.log"
        self.report_path = spec.run_dir / f"server-{spec.label}.report.json"
        self._stopped: str | None = None  # what stop() said, once it ran

    def start(self) -> None:
        w = self.spec.watch
        self.spec.run_dir.mkdir(parents=True, exist_ok=True)
        launched = launch(list(self.spec.command))
        self._launched = launched
        t0 = time.monotonic()
        sampler = TreeSampler(
            [launched.pid], self.plan.profile.role_of, reap=reap, reaped_status=reap.status_of
        )
        log = PipeLog(launched.output_fd, self.log_path, echo=None)
        prober = make_prober(self.plan, w, t0)
        watch = Watch(
            Collectors(sampler, log, prober, NvmlGpuSource()),
            make_scanner(self.plan, w, prober),
            make_assessor(self.plan, w, {launched.pid}),
            _EventView(self.spec.label, self._say),
            w.interval,
        )
        watch.on_members = launched.tell_guardian
        self._watch = watch
        self._thread = threading.Thread(
            target=self._loop, name=f"hangwatch-bench-{self.spec.label}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        assert self._watch is not None

        def until(v: Verdict) -> bool:
            if v.state is State.READY:
                self.ready_verdict = v
                self._ready.set()
                return False  # keep watching while the benchmark runs
            self.failure = v
            self._ready.set()
            return True

        try:
            self._watch.run(until)
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
            if self._watch is not None and self._watch.c.prober is not None:
                self._watch.c.prober.stop()  # serving: no more probe traffic to perturb the measurement
            return self.ready_verdict
        raise RuntimeError(f"server {self.spec.label}: the watch ended without a verdict")

    def trouble(self) -> str | None:
        """Why the benchmark must stop on this server's account (it crashed or exited); None while serving."""
        v = self.failure
        return f"server {self.spec.label} {v.state.value}: {v.summary}" if v is not None else None

    def boot(self) -> Boot | None:
        if self.ready_verdict is None or self._watch is None:
            return None
        return Boot(
            command=redact_argv(self.spec.command),
            ready_after_s=round(self._watch.assessor.ready_at or 0.0, 3),
            log_path=str(self.log_path),
            report_path=str(self.report_path),
        )

    def stop(self) -> str:
        """Stop watching, stop the tree (SIGTERM, grace, SIGKILL), write its report; say what happened."""
        launched, watch = self._launched, self._watch
        if launched is None or watch is None:
            return "not started"
        if self._stopped is not None:
            return self._stopped
        watch.stop_requested.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        c = watch.c
        if self.failure is None:
            # A last look before cleanup: the server may have died after the watch's last tick (a benchmark
            # that saw it vanish stops at once), and that death is the verdict, not our SIGTERM.
            tick = watch.tick()
            watch.recorder.add(tick)
            last = watch.assessor.observe(tick)
            if last is not None and last.state is not State.READY:
                self.failure = last
        if c.prober is not None:
            c.prober.stop()
        result = cleanup.stop_tree(
            c.tree.identities() | launched.guardian_known, launched.pid, reap, self.spec.grace_s
        )
        watch.recorder.add(watch.tick())  # record the exits of the cleanup
        if c.log is not None:
            c.log.close()
        launched.release_guardian()
        c.tree.close()
        c.gpu.close()
        verdict = self.failure or self.ready_verdict or watch.interrupted()
        notes = ("bench: the server ran under hangwatch bench", "cleanup: " + result.describe())
        report = watch.report(verdict, self.plan.profile.name, "run", redact_argv(self.spec.command), notes)
        write_report(report, self.report_path)
        self._stopped = result.describe()
        return self._stopped
