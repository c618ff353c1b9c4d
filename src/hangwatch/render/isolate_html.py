"""The isolate report as one offline HTML page: the conclusion, the table, each trial's runs."""

from __future__ import annotations

from pathlib import Path

from hangwatch.model.isolate import IsolateReport
from hangwatch.model.vocabulary import State
from hangwatch.redact import scrub
from hangwatch.render.bench_html import get_environment
from hangwatch.render.files import write_atomically
from hangwatch.render.isolate_text import HEADERS
from hangwatch.render.isolate_text import trial_rows


def isolate_html(report: IsolateReport) -> str:
    trials = ([report.baseline] if report.baseline is not None else []) + list(report.trials)
    css = []
    for t in trials:
        if t.all_booted:
            css.append("ready")
        elif t.none_booted or (t.verdict.state is not State.READY and t.booted == 0):
            css.append("fail")
        else:
            css.append("mixed")
    template = get_environment().get_template("isolate.html.j2")
    return scrub(
        template.render(
            report=report,
            command=" ".join(report.command),
            header=f"--repeat {report.repeat}, {report.duration_s:.0f} s, stopped: {report.stopped}; "
            f"runs in {report.run_dir}",
            headers=HEADERS,
            rows=list(zip(trial_rows(report), css, strict=True)),
            trials=trials,
        )
    )


def write_isolate_html(report: IsolateReport, path: Path) -> None:
    write_atomically(path, isolate_html(report))
