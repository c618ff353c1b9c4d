"""What to watch and how, shared by ``run`` and ``attach``: options, profile, scanner, assessor, probe."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit
from urllib.parse import urlunsplit

from hangwatch import engines
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import watch_policy
from hangwatch.analyse.logscan import LogScanner
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.collect.http_probe import Prober
from hangwatch.collect.own_request import OwnRequester
from hangwatch.collect.serving_metrics import ServingPoller
from hangwatch.engines.profile import Profile
from hangwatch.model.history import PhaseHistory
from hangwatch.model.report import Report
from hangwatch.model.vocabulary import CLI_WORDS
from hangwatch.render.files import write_outputs
from hangwatch.render.html import write_html
from hangwatch.render.json_report import write_report
from hangwatch.render.markdown import write_markdown
from hangwatch.render.text import recap_text
from hangwatch.render.text import verdict_text


@dataclass(frozen=True)
class WatchOptions:
    engine: str | None
    ready_url: str | None
    ready_pattern: re.Pattern[str] | None
    waiting_patterns: tuple[re.Pattern[str], ...]
    stall_after_s: float
    timeout: float | None
    interval: float
    report_json: Path | None
    quiet: bool
    probe_timeout: float
    report_html: Path | None = None
    report_md: Path | None = None
    stacks: bool = True  # take stacks when the tree goes quiet (--no-stacks turns it off)
    # Serving: send hangwatch's own one-token completion (run: on unless --no-own-request; attach:
    # only with --own-request).
    own_request: bool = False
    # At a gpu-spin verdict, name the running kernels with cuda-gdb, pausing each GPU process's host for
    # seconds (run: on unless --no-kernel-names, the tree is stopped next anyway; attach: --kernel-names).
    kernel_names: bool = False
    # --stall-after auto (run, isolate): each boot phase's own window, drawn from the phase history at
    # launch (supervise/history.launch_history); a phase not here, and serving, keep ``stall_after_s``.
    stall_auto: bool = False
    phase_windows: tuple[tuple[str, float], ...] = ()
    # Each phase's usual duration in comparable earlier boots, read at launch: the live view shows it.
    phase_usual: tuple[PhaseHistory, ...] = ()
    # attach's window: the watch's own end (a timeout unless ``timeout`` is shorter; a server serving then
    # is healthy). None: run, and the sidecar, which never ends by itself.
    window_s: float | None = None


@dataclass(frozen=True)
class Plan:
    profile: Profile
    probe_url: str | None
    notes: tuple[str, ...]


def plan_for(options: WatchOptions, cmdline: tuple[str, ...]) -> Plan:
    profile = engines.by_name(options.engine) if options.engine else engines.detect(cmdline)
    notes: list[str] = []
    probe_url = options.ready_url or profile.health_url(cmdline)
    if probe_url is None and options.ready_pattern is None and not profile.ready_patterns:
        notes.append(
            "no readiness rule: --ready-url or --ready-pattern gives one "
            "(without, only a tree idle on a listening port reads as ready)"
        )
    return Plan(profile, probe_url, tuple(notes))


def make_scanner(plan: Plan, options: WatchOptions) -> LogScanner:
    ready = (options.ready_pattern,) if options.ready_pattern else ()
    # Access-log lines of hangwatch's own requests beside the probe's (each tick's ProbeMarks): the /metrics
    # scrape's, our own request's model lookup (clients rarely ask for it; our one-token completion itself
    # is real work, not an echo).
    ours = ('"GET /metrics HTTP', '"GET /v1/models HTTP') if plan.profile.openai_api else ()
    return LogScanner(plan.profile, ready, options.waiting_patterns, ours)


def make_assessor(
    plan: Plan,
    options: WatchOptions,
    root_pids: set[int],
    stacks: StackHistory | None = None,
    reader: LogScanner | None = None,
) -> Assessor:
    policy = watch_policy(
        plan.profile,
        stall_after_s=options.stall_after_s,
        timeout=options.timeout,
        window_s=options.window_s,
        ready_url=options.ready_url,
        ready_pattern=options.ready_pattern is not None,
        probe_url=plan.probe_url,
        phase_windows=options.phase_windows,
        words=CLI_WORDS,
    )
    return Assessor(plan.profile, policy, root_pids, stacks, reader)


def make_prober(plan: Plan, options: WatchOptions, clock: Callable[[], float]) -> Prober | None:
    if plan.probe_url is None:
        return None
    prober = Prober(
        plan.probe_url,
        clock=clock,
        interval_s=max(options.interval, 1.0),
        timeout_s=options.probe_timeout,
    )
    prober.start()
    return prober


def make_own_requester(plan: Plan, options: WatchOptions, clock: Callable[[], float]) -> OwnRequester | None:
    """Our own one-token completion, for engines that serve the OpenAI API (vLLM, SGLang)."""
    if plan.probe_url is None or not plan.profile.openai_api:
        return None
    parts = urlsplit(plan.probe_url)
    # A deadline a little past the stall window: an answer later than that is no answer.
    return OwnRequester(
        urlunsplit((parts.scheme, parts.netloc, "", "", "")), clock, options.stall_after_s + 5
    )


def emit(report: Report, options: WatchOptions, said_at: float | None = None) -> None:
    """The verdict first, then the reports: a report that cannot be written is said, and costs nothing.
    ``said_at``: the verdict is a stall already said in full at that time (run --keep-running): said short."""
    print(verdict_text(report) if said_at is None else recap_text(report, said_at), flush=True)
    write_outputs(report_outputs(report, options))


def report_outputs(
    report: Report, options: WatchOptions
) -> list[tuple[str, Path | None, Callable[[Path], None]]]:
    """The report files asked for, each with its writer (for render.files.write_outputs)."""
    return [
        ("--report-json", options.report_json, lambda path: write_report(report, path)),
        ("--report-html", options.report_html, lambda path: write_html(report, path)),
        ("--report-md", options.report_md, lambda path: write_markdown(report, path)),
    ]


def make_serving_poller(plan: Plan, clock: Callable[[], float]) -> ServingPoller | None:
    """Scrape the engine's /metrics (beside its health URL) to see a server wedged while serving."""
    names = plan.profile.metrics
    if names is None or plan.probe_url is None:
        return None
    parts = urlsplit(plan.probe_url)
    poller = ServingPoller(
        urlunsplit((parts.scheme, parts.netloc, "/metrics", "", "")),
        names,
        clock=clock,
    )
    poller.start()
    return poller
