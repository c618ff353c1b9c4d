"""The bench report as a plain-text table for a terminal: one column per server, then the verdict."""

from __future__ import annotations

from hangwatch.model.bench import BenchReport
from hangwatch.model.bench import Percentiles
from hangwatch.model.bench import ServerResult
from hangwatch.model.bench import SpecStats
from hangwatch.model.bench import Workload
from hangwatch.redact import scrub
from hangwatch.words import plural

LABEL_WIDTH = 28
MIN_COLUMN = 24


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    ms = value * 1000
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def _pcts(p: Percentiles) -> str:
    return " / ".join(_ms(v) for v in (p.p50, p.p90, p.p99))


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f} %" if x < 0.1 else f"{100 * x:.0f} %"


def _spec_rows(spec: SpecStats | None) -> tuple[str, str, str]:
    if spec is None:
        return "none", "-", "-"
    rate = _pct(spec.acceptance_rate)
    if spec.accepted_tokens is not None and spec.draft_tokens is not None:
        rate += f" ({spec.accepted_tokens} of {spec.draft_tokens})"
    length = f"{spec.mean_acceptance_length:.2f}" if spec.mean_acceptance_length is not None else "-"
    positions = " ".join(f"{p:.2f}" for p in spec.per_position) or "-"
    return rate, length, positions


def workload_line(w: Workload, servers: int) -> str:
    amount = plural(w.requests, "request") if w.requests is not None else f"{w.duration_s:g} s"
    pace = (
        f"rate {w.rate:g}/s (Poisson), at most {w.concurrency} at once"
        if w.rate
        else f"concurrency {w.concurrency}"
    )
    how_many = f"{servers} server{'s' if servers > 1 else ''}, {w.rounds} round{'s' if w.rounds > 1 else ''}"
    return (
        f"hangwatch bench: {how_many} x {amount}, "
        f"{w.endpoint.path}, max_tokens {w.max_tokens}{' (ignore_eos)' if w.ignore_eos else ''}, "
        f"temperature {w.temperature:g}, {pace}, {w.prompt_count} prompts ({w.prompts}), seed {w.seed}"
    )


def server_rows(s: ServerResult) -> list[tuple[str, str]]:
    rate, length, positions = _spec_rows(s.spec)
    m = s.server_metrics
    rows = [
        ("url", s.url),
        ("model", s.model),
        ("requests (failed)", f"{s.requests} ({s.errors})"),
        ("output tokens", str(s.output_tokens)),
        ("output tokens/s", f"{s.output_tokens_per_s:.1f}"),
        ("requests/s", f"{s.requests_per_s:.2f}"),
        ("TTFT ms p50/p90/p99", _pcts(s.ttft_s)),
        ("ITL ms p50/p90/p99", _pcts(s.itl_s)),
        ("TPOT ms p50/p90/p99", _pcts(s.tpot_s)),
        ("E2E ms p50/p90/p99", _pcts(s.e2e_s)),
        (
            "server: generated tokens",
            str(m.generation_tokens) if m and m.generation_tokens is not None else "-",
        ),
        (
            "server: running/waiting max",
            f"{m.running_max:g} / {m.waiting_max:g}"
            if m and m.running_max is not None and m.waiting_max is not None
            else "-",
        ),
        ("spec: acceptance rate", rate),
        ("spec: mean accept length", length),
        ("spec: per position", positions),
        ("output tokens/s by round", " ".join(f"{r.output_tokens_per_s:.0f}" for r in s.rounds) or "-"),
    ]
    rows.append(("errors", ", ".join(f"{k} {n}" for k, n in s.errors_by_kind.items()) or "none"))
    return rows


def bench_text(report: BenchReport) -> str:
    lines = [workload_line(report.workload, len(report.servers))]
    columns = [server_rows(s) for s in report.servers]
    widths = [max(MIN_COLUMN, *(len(v) + 2 for _, v in col)) for col in columns]
    header = "".ljust(LABEL_WIDTH) + "".join(
        s.label.ljust(w) for s, w in zip(report.servers, widths, strict=True)
    )
    lines.append(header.rstrip())
    for i, (label, _) in enumerate(columns[0] if columns else []):  # every column has the same rows
        cells = "".join(col[i][1].ljust(w) for col, w in zip(columns, widths, strict=True))
        lines.append((label.ljust(LABEL_WIDTH) + cells).rstrip())
    c = report.comparison
    if c is not None:
        ratios = ", ".join(
            f"{r.output_tokens_per_s_ratio:.2f}" if r.output_tokens_per_s_ratio is not None else "-"
            for r in c.rounds
        )
        overall = f"{c.output_tokens_per_s_ratio:.2f}x" if c.output_tokens_per_s_ratio is not None else "-"
        lines.append("")
        pair = f"{report.servers[1].label}/{report.servers[0].label}"
        lines.append(f"{pair} output tokens/s: {overall} (rounds: {ratios})")
        for name, spread in (("TTFT p50", c.ttft_p50), ("ITL p50", c.itl_p50), ("E2E p50", c.e2e_p50)):
            if spread.ratio is not None and spread.low is not None and spread.high is not None:
                lines.append(
                    f"{pair} {name}: {spread.ratio:.2f}x (rounds {spread.low:.2f}-{spread.high:.2f})"
                )
        lines.append(f"verdict: {c.verdict}")
    notes = report_notes(report)
    if notes:
        lines.append("notes:")
        lines.extend(f"  - {n}" for n in notes)
    return scrub("\n".join(lines))


def report_notes(report: BenchReport) -> list[str]:
    out: list[str] = []
    for s in report.servers:
        if s.aborted:
            out.append(f"{s.label}: {s.aborted}")
        for kind, detail in s.error_examples.items():
            out.append(f"{s.label}: {kind}: {detail}")
        if s.spec_note:
            out.append(f"{s.label}: {s.spec_note}")
        if s.metrics_note:
            out.append(f"{s.label}: {s.metrics_note}")
        if s.boot is not None:
            out.append(
                f"{s.label}: launched, ready after {s.boot.ready_after_s:.1f} s; log {s.boot.log_path}"
            )
    out.extend(report.notes)
    return out
