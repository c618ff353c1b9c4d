"""``hangwatch bench``: launch (optionally), check, measure, report, and always stop what was launched."""

from __future__ import annotations

import asyncio
import datetime as dt
import shlex
import signal
import sys
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from types import FrameType

from hangwatch import __version__
from hangwatch.analyse.bench.stats import bench_report
from hangwatch.bench.openai_stream import ServerProblem
from hangwatch.bench.options import BenchOptions
from hangwatch.bench.runner import Server
from hangwatch.bench.runner import discover_models
from hangwatch.bench.runner import no_trouble
from hangwatch.bench.runner import run_bench
from hangwatch.bench.servers import LaunchSpec
from hangwatch.bench.servers import SupervisedServer
from hangwatch.errors import HangwatchError
from hangwatch.model.bench import BenchReport
from hangwatch.model.bench import Boot
from hangwatch.model.bench import Prompt
from hangwatch.model.bench import RoundMeasurement
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.render.bench_html import write_bench_html
from hangwatch.render.bench_json import write_bench_json
from hangwatch.render.bench_progress import QuietProgress
from hangwatch.render.bench_progress import make_progress
from hangwatch.render.bench_text import bench_text
from hangwatch.render.files import write_outputs
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.signals import handling

# Exit codes besides run's (0 done, 2 usage, 3 stalled, 4 crashed, 5 timeout, 130 interrupted):
UNUSABLE_EXIT_CODE = 6  # a server could not be benchmarked: nothing listens, not OpenAI, every request failed
LAUNCH_GRACE_S = 10.0  # SIGTERM grace before SIGKILL when launched servers are stopped
READY_PROBE_TIMEOUT_S = 2.0


class ServerUnusableError(HangwatchError):
    exit_code = UNUSABLE_EXIT_CODE
    help_text = (
        "Check the URL (scheme, host, port) and that the server speaks the OpenAI API (GET /v1/models)."
    )


class BootFailedError(HangwatchError):
    """A launched server did not come up: its verdict (stalled, crashed, timeout) is the error."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message, "")
        self.exit_code = exit_code or UNUSABLE_EXIT_CODE  # an exit before ready is no success either


@contextmanager
def interrupt_on_term() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so launched servers are stopped on the way out."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    with handling(handler, (signal.SIGTERM, signal.SIGHUP)):
        yield


def launch_server(
    label: str, url: str, cmd: tuple[str, ...], options: BenchOptions, say: Callable[[str], None]
) -> SupervisedServer:
    """Start one server under supervision; it is ready when GET /v1/models answers 2xx."""
    watch = WatchOptions(
        engine=None,
        ready_url=url + "/v1/models",
        ready_pattern=None,
        waiting_patterns=(),
        stall_after_s=options.stall_after_s,
        timeout=options.boot_timeout_s,
        interval=1.0,
        report_json=None,
        quiet=True,
        probe_timeout=READY_PROBE_TIMEOUT_S,
        stacks=False,  # a stack dump pauses the server being measured
    )
    spec = LaunchSpec(label, cmd, watch, options.run_dir / f"server-{label}", LAUNCH_GRACE_S)
    server = SupervisedServer(spec, say)
    say(f"{label}: launching {shlex.join(redact_argv(cmd))}; log {server.log_path}")
    server.start()
    return server


def _wait_all_ready(launched: dict[str, SupervisedServer], say: Callable[[str], None]) -> None:
    for label, server in launched.items():
        verdict = server.wait_ready()
        if verdict.state is not State.READY:
            server.stop()
            raise BootFailedError(
                f"server {label} did not come up: {verdict.headline}\n"
                f"  report {server.report_path}\n  log {server.log_path}",
                verdict.exit_code,
            )
        say(f"{label}: {verdict.summary}")


def _models(servers: list[Server], options: BenchOptions) -> dict[str, str]:
    found = asyncio.run(discover_models(servers, options.workload.model, options.probe_timeout_s))
    models: dict[str, str] = {}
    problems: list[str] = []
    for s in servers:
        got = found[s.label]
        if isinstance(got, ServerProblem):
            problems.append(f"{s.label} {s.base_url}: {got.detail}")
        else:
            models[s.label] = got
    if problems:
        raise ServerUnusableError("cannot benchmark " + "; ".join(problems))
    return models


@dataclass
class Measured:
    models: dict[str, str] = field(default_factory=dict)
    measurements: dict[str, list[RoundMeasurement]] = field(default_factory=dict)
    boots: dict[str, Boot] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # A launched server that crashed or exited during the benchmark: its verdict decides the exit code.
    crashed: list[Verdict] = field(default_factory=list)


def measure(options: BenchOptions, prompts: tuple[Prompt, ...], progress: QuietProgress) -> Measured:
    """Launch what must be launched, benchmark, and stop the launched servers whatever happens."""
    labels = ("A", "B")[: len(options.urls)]
    launched: dict[str, SupervisedServer] = {}
    out = Measured()
    try:
        with interrupt_on_term():
            for label, url, cmd in zip(labels, options.urls, options.launch, strict=True):
                if cmd is not None:
                    launched[label] = launch_server(label, url, cmd, options, progress.note)
            _wait_all_ready(launched, progress.note)
            servers = [
                Server(
                    label, url, launched[label].trouble if label in launched else no_trouble, options.metrics
                )
                for label, url in zip(labels, options.urls, strict=True)
            ]
            out.models = _models(servers, options)
            out.measurements = asyncio.run(
                run_bench(servers, out.models, options.workload, prompts, progress)
            )
            out.boots = {label: boot for label, s in launched.items() if (boot := s.boot()) is not None}
    finally:
        progress.close()
        for label, server in launched.items():
            out.notes.append(f"{label}: cleanup: {server.stop()}")
    for label, server in launched.items():
        if server.failure is not None:
            out.crashed.append(server.failure)
            out.notes.append(
                f"{label}: {server.failure.state.value} during the benchmark: {server.failure.summary}"
            )
    return out


def run_bench_command(options: BenchOptions, prompts: tuple[Prompt, ...]) -> int:
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    m = measure(options, prompts, make_progress(options.quiet))
    labels = ("A", "B")[: len(options.urls)]
    servers = [(label, url, m.models.get(label, "")) for label, url in zip(labels, options.urls, strict=True)]
    report = bench_report(
        options.workload, servers, m.measurements,
        boots=m.boots, started_at=started_at, version=__version__, notes=m.notes,
    )  # fmt: skip
    code = emit(report, options)
    return (m.crashed[0].exit_code or UNUSABLE_EXIT_CODE) if m.crashed else code


def emit(report: BenchReport, options: BenchOptions) -> int:
    """Write the outputs; the exit code is 6 when a server answered no request at all."""
    print(bench_text(report), flush=True)
    write_outputs(
        [
            ("--report-json", options.report_json, lambda path: write_bench_json(report, path)),
            ("--report-html", options.report_html, lambda path: write_bench_html(report, path)),
        ]
    )
    useless = [s.label for s in report.servers if s.errors == s.requests]
    if useless:
        print(f"hangwatch: error: no successful request on {', '.join(useless)}", file=sys.stderr)
        return UNUSABLE_EXIT_CODE
    return 0
