"""The isolate report for a terminal: the trials as a table, the change(s) that make it boot, the
conclusion."""

from __future__ import annotations

from hangwatch.model.isolate import IsolateReport
from hangwatch.model.isolate import TrialResult
from hangwatch.model.vocabulary import Confidence
from hangwatch.redact import scrub

HEADERS = ("trial", "change", "outcome", "cause", "phase", "time to verdict")
CHANGE_WIDTH = 44


def _time(trial: TrialResult) -> str:
    if not trial.durations_s:
        return "-"
    if len(trial.durations_s) == 1:
        return f"{trial.durations_s[0]:.1f} s"
    return f"{min(trial.durations_s):.1f}-{max(trial.durations_s):.1f} s"


def _change(trial: TrialResult) -> str:
    if not trial.edits:
        return "(baseline: as given)"
    text = f"{trial.name}: " + ", ".join(e.describe() for e in trial.edits)
    return text if len(text) <= CHANGE_WIDTH else text[: CHANGE_WIDTH - 1] + "…"


def trial_rows(report: IsolateReport) -> list[tuple[str, ...]]:
    trials = ([report.baseline] if report.baseline is not None else []) + list(report.trials)
    rows: list[tuple[str, ...]] = []
    for t in trials:
        v = t.verdict
        rows.append(
            (
                str(t.index),
                _change(t),
                t.outcome() + ("" if t.complete else f" (of {t.repeat} asked)"),
                v.cause.value if v.cause else "-",
                v.phase_name or "-",
                _time(t),
            )
        )
    return rows


def table_lines(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADERS)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(HEADERS), line(tuple("-" * w for w in widths)), *(line(r) for r in rows)]


def isolate_text(report: IsolateReport) -> str:
    c = report.conclusion
    lines = [
        f"hangwatch isolate: {len(report.trials) + (report.baseline is not None)} trial(s), "
        f"--repeat {report.repeat}, {report.duration_s:.0f} s; stopped: {report.stopped}"
    ]
    lines += ["", *table_lines(trial_rows(report)), ""]
    if c.minimal_changes:
        lines.append("makes it boot: " + ", ".join(c.minimal_changes))
    lines.append(
        f"conclusion ({c.confidence} confidence): {c.summary}"
        if c.confidence != Confidence.NONE
        else f"conclusion: {c.summary}"
    )
    if c.details:
        lines.append("  compared with the baseline:")
        lines.extend(f"    - {d}" for d in c.details)
    if report.not_run:
        lines.append(f"  not run: {', '.join(report.not_run)}")
    if report.notes:
        lines.append("  notes:")
        lines.extend(f"    - {n}" for n in report.notes)
    trial_notes = [
        f"trial {t.index} ({t.name}): {n}"
        for t in ([report.baseline] if report.baseline else []) + list(report.trials)
        for n in t.notes
    ]
    lines.extend(f"    - {n}" for n in trial_notes)
    lines.append(f"  runs: {report.run_dir} (each trial-NN: output.log, report.json, verdict.txt)")
    return scrub("\n".join(lines))
