"""``hangwatch run``: the fast preflight, then one supervised launch (supervise/session.py), the verdict
printed and the reports written."""

from __future__ import annotations

import sys

from hangwatch.supervise.plan import emit
from hangwatch.supervise.session import RunOptions
from hangwatch.supervise.session import supervise


def preflight(command: tuple[str, ...], engine: str | None) -> None:
    """Print what would make this launch hang or fail (wrong GPU architecture, port taken, ...), then go on:
    the checks inform, the verdict decides."""
    from hangwatch.doctor.session import fast_preflight  # only when asked: --no-doctor skips its imports
    from hangwatch.render.doctor_text import preflight_text

    text = preflight_text(fast_preflight(command, None, engine=engine))
    if text:
        print(text, file=sys.stderr, flush=True)


def run_supervised(options: RunOptions) -> int:
    outcome = supervise(options)
    emit(outcome.report, options.watch, said_at=outcome.said_at)
    if outcome.remaining:
        print(f"hangwatch: warning: processes of the tree remain: {outcome.remaining}", file=sys.stderr)
    return outcome.report.verdict.exit_code
