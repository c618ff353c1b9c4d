"""Progress while ``bench`` runs: a rich progress bar on a terminal, one line per share otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn
from rich.progress import MofNCompleteColumn
from rich.progress import Progress
from rich.progress import TextColumn
from rich.progress import TimeElapsedColumn

from hangwatch.model.bench import LoadRun
from hangwatch.model.bench import RequestRecord
from hangwatch.redact import scrub
from hangwatch.render.live import event_text
from hangwatch.words import plural


def _share_summary(label: str, run: LoadRun) -> str:
    ok = [r for r in run.records if r.ok]
    tokens = sum(r.output_tokens or 0 for r in ok)
    rate = tokens / run.duration_s if run.duration_s > 0 else 0.0
    failed = len(run.records) - len(ok)
    text = (
        f"{label}: {plural(len(run.records), 'request')}, {failed} failed, "
        f"{tokens} output tokens in {run.duration_s:.1f} s ({rate:.0f} tok/s)"
    )
    return text + (f"; {run.aborted}" if run.aborted else "")


class QuietProgress:
    def share_started(
        self, label: str, round_: int, rounds: int, requests: int | None, duration_s: float | None
    ) -> None:
        return None

    def request_done(self, record: RequestRecord) -> None:
        return None

    def share_finished(self, label: str, run: LoadRun) -> None:
        return None

    def note(self, text: str) -> None:
        return None

    def close(self) -> None:
        return None


class PlainProgress(QuietProgress):
    """Not a terminal (CI logs): a line when each share starts and ends."""

    def __init__(self, out: TextIO = sys.stderr) -> None:
        self._out = out
        self._round = ""

    def share_started(
        self, label: str, round_: int, rounds: int, requests: int | None, duration_s: float | None
    ) -> None:
        self._round = f"round {round_ + 1}/{rounds}"
        amount = plural(requests, "request") if requests is not None else f"{duration_s:g} s"
        self.note(f"{label} {self._round}: {amount}")

    def share_finished(self, label: str, run: LoadRun) -> None:
        self.note(f"{self._round} " + _share_summary(label, run))

    def note(self, text: str) -> None:
        print(f"[bench] {scrub(text)}", file=self._out, flush=True)  # redacted as event_text is


class RichProgress(PlainProgress):
    """A bar per share on a terminal: requests done of the total, or seconds of the duration."""

    def __init__(self, out: TextIO = sys.stderr) -> None:
        super().__init__(out)
        self._console = Console(file=out)
        self._progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[status]}", markup=False), console=self._console,
            transient=False,
        )  # fmt: skip
        self._progress.start()
        self._task: Any = None
        self._by_time = False
        self._started = 0.0
        self._failed = 0
        self._tokens = 0

    def share_started(
        self, label: str, round_: int, rounds: int, requests: int | None, duration_s: float | None
    ) -> None:
        self._by_time = requests is None
        self._started = time.monotonic()
        self._failed = self._tokens = 0
        total = requests if requests is not None else int(duration_s or 0)
        self._task = self._progress.add_task(f"{label} round {round_ + 1}/{rounds}", total=total, status="")

    def request_done(self, record: RequestRecord) -> None:
        if self._task is None:
            return
        self._failed += 0 if record.ok else 1
        self._tokens += record.output_tokens or 0 if record.ok else 0
        status = f"{self._tokens} tok" + (f", {self._failed} failed" if self._failed else "")
        if self._by_time:
            self._progress.update(self._task, completed=int(time.monotonic() - self._started), status=status)
        else:
            self._progress.update(self._task, advance=1, status=status)

    def share_finished(self, label: str, run: LoadRun) -> None:
        if self._task is not None:
            self._progress.update(self._task, status=_share_summary(label, run).split(": ", 1)[1])
            self._task = None

    def note(self, text: str) -> None:
        self._progress.console.print(event_text(text, "[bench]"), highlight=False)

    def close(self) -> None:
        self._progress.stop()


def make_progress(quiet: bool, out: TextIO = sys.stderr) -> QuietProgress:
    if quiet:
        return QuietProgress()
    if out.isatty():
        return RichProgress(out)
    return PlainProgress(out)
