"""Doctor's report as text for a terminal, and as JSON (``dataclasses.asdict`` of the model)."""

from __future__ import annotations

import textwrap

from hangwatch.model.doctor import Check
from hangwatch.model.doctor import Coverage
from hangwatch.model.doctor import DoctorReport
from hangwatch.model.doctor import Status
from hangwatch.redact import scrub
from hangwatch.words import plural

WIDTH = 110
_LABEL = {Status.PASS: "ok", Status.WARN: "WARN", Status.FAIL: "FAIL"}
_MAX_MODULE_ROWS = 20


def headline(report: DoctorReport) -> str:
    fails = sum(c.status is Status.FAIL for c in report.checks)
    warns = sum(c.status is Status.WARN for c in report.checks)
    caps = f"GPU capability {', '.join(report.capabilities)}" if report.capabilities else "no GPU"
    verdict = (
        "all checks passed" if not fails and not warns else f"{fails} failed, {plural(warns, 'warning')}"
    )
    return f"hangwatch doctor ({report.mode}, {caps}): {verdict}"


def checks_table(checks: tuple[Check, ...] | list[Check]) -> list[str]:
    name_w = max((len(c.name) for c in checks), default=4)
    lines = []
    indent = " " * (2 + 4 + 2 + name_w + 2)
    for c in checks:
        first = f"  {_LABEL[c.status]:<4}  {c.name:<{name_w}}  "
        wrapped = textwrap.wrap(c.summary, WIDTH - len(first)) or [""]
        lines.append(first + wrapped[0])
        lines += [indent + more for more in wrapped[1:]]
    return lines


def details(checks: tuple[Check, ...] | list[Check]) -> list[str]:
    lines = []
    for c in checks:
        if c.status is Status.PASS:
            continue
        lines.append(f"  [{_LABEL[c.status]}] {c.name}")
        for e in c.evidence:
            lines += textwrap.wrap(e, WIDTH, initial_indent="      - ", subsequent_indent="        ")
        if c.fix:
            lines += textwrap.wrap(
                c.fix, WIDTH, initial_indent="      fix: ", subsequent_indent="           "
            )
    return lines


def modules_table(report: DoctorReport) -> list[str]:
    if not report.modules:
        return []
    counts = {v: sum(m.verdict is v for m in report.modules) for v in Coverage}
    lines = [
        f"GPU modules: {len(report.modules)} ({counts[Coverage.NATIVE]} native, {counts[Coverage.JIT]} jit, "
        f"{counts[Coverage.NONE]} none)"
    ]
    order = {Coverage.NONE: 0, Coverage.JIT: 1, Coverage.NATIVE: 2}
    shown = sorted(report.modules, key=lambda m: (order[m.verdict], m.path))[:_MAX_MODULE_ROWS]
    for m in shown:
        code = " ".join(m.sass + m.ptx)
        lines.append(f"  {m.verdict.value:<6}  {code[:38]:<38}  {m.path}")
    if len(report.modules) > len(shown):
        lines.append(f"  ... {len(report.modules) - len(shown)} more (all of them in --report-json)")
    return lines


def doctor_text(report: DoctorReport) -> str:
    lines = [headline(report), *checks_table(report.checks)]
    more = details(report.checks)
    if more:
        lines += ["", "details:", *more]
    table = modules_table(report)
    if table:
        lines += ["", *table]
    if report.notes:
        lines += ["", "notes:", *(f"  - {n}" for n in report.notes)]
    if report.timings:
        lines.append("timings: " + ", ".join(f"{k} {v:.2f}" for k, v in report.timings.items()))
    return scrub("\n".join(lines))


def preflight_text(checks: list[Check]) -> str:
    """What ``hangwatch run`` prints before launching: the failures and warnings only, each once, in one
    format: ``WARN name: summary``, the evidence the summary does not already say, the fix."""
    bad = [c for c in checks if c.status is not Status.PASS]
    if not bad:
        return ""
    lines = ["hangwatch preflight (the launch goes on; `hangwatch doctor` runs every check):"]
    for c in bad:
        head = c.summary if c.summary.startswith(c.name) else f"{c.name}: {c.summary}"
        lines += textwrap.wrap(
            f"{_LABEL[c.status]} {head}", WIDTH, initial_indent="  ", subsequent_indent="      "
        )
        for e in c.evidence:
            if e.strip() and e not in c.summary:
                lines += textwrap.wrap(e, WIDTH, initial_indent="    - ", subsequent_indent="      ")
        if c.fix:
            lines += textwrap.wrap(c.fix, WIDTH, initial_indent="    fix: ", subsequent_indent="         ")
    return scrub("\n".join(lines))
