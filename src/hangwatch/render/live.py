"""The live view while supervising: rich on a terminal, plain lines otherwise.

Every line hangwatch prints here is redacted as the reports are (``redact.scrub``: the secrets of its
environment, which the tree inherits, and the known token shapes): the events, the status line, the
table. The echo is the tree's own output, as it would print it without hangwatch, and stays raw (its
``output.log`` keeps it, mode 0600).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Protocol
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hangwatch.model.history import PhaseHistory
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ProcessSample
from hangwatch.redact import scrub
from hangwatch.render.history_text import usual_range
from hangwatch.words import human_bytes
from hangwatch.words import plural


@dataclass(frozen=True)
class LiveState:
    t: float
    phase: str
    phase_label: str
    in_phase_s: float
    processes: tuple[ProcessSample, ...]
    interval_s: float
    probe: ProbeResult | None
    time_to_stall_s: float | None  # None while serving
    gpu: GpuSample | None
    gpu_mem_by_pid: dict[int, int]
    last_progress: str
    usual: PhaseHistory | None = None  # the phase's usual duration in earlier boots (none: no history)


class View(Protocol):
    def echo(self, data: bytes) -> None: ...

    def update(self, state: LiveState) -> None: ...

    def event(self, text: str) -> None: ...

    def block(self, text: str) -> None:
        """A verdict block printed while the watch goes on (``run --keep-running``), as it is at the end."""
        ...

    def close(self) -> None: ...


class QuietView:
    """--quiet: no echo, no live view; the verdict is still printed."""

    def echo(self, data: bytes) -> None:
        return None

    def update(self, state: LiveState) -> None:
        return None

    def event(self, text: str) -> None:
        return None

    def block(self, text: str) -> None:
        print(scrub(text), flush=True)  # --quiet still prints every verdict

    def close(self) -> None:
        return None


class PlainView:
    """Not a terminal: echo the tree's output as is, plus one status line on phase changes and every 15 s."""

    def __init__(self, out: TextIO = sys.stdout, every_s: float = 15.0, echo_output: bool = True) -> None:
        self._out = out
        self._midline = False
        self._every = every_s
        self._last = -every_s
        self._lock = threading.Lock()
        self._echo = echo_output

    def echo(self, data: bytes) -> None:
        if not self._echo:
            return
        with self._lock:
            self._out.flush()
            buffer = getattr(self._out, "buffer", None)
            if buffer is not None:
                buffer.write(data)
                buffer.flush()
            else:
                self._out.write(data.decode("utf-8", "replace"))
            if data:
                # A last line without its newline (SGLang ends on one): what we print next starts a line.
                self._midline = not data.endswith((b"\n", b"\r"))

    def _end_line(self) -> None:
        if self._midline:
            self._out.write("\n")
            self._midline = False

    def event(self, text: str) -> None:
        with self._lock:
            self._end_line()
            print(f"[hangwatch] {scrub(text)}", file=self._out, flush=True)

    def block(self, text: str) -> None:
        with self._lock:
            self._end_line()
            print(scrub(text), file=self._out, flush=True)

    def update(self, state: LiveState) -> None:
        if state.t - self._last < self._every:
            return
        self._last = state.t
        self.event(status_line(state))

    def close(self) -> None:
        with self._lock:
            self._end_line()
        self._out.flush()


def status_line(state: LiveState) -> str:
    cpu = sum(p.cpu_delta_s for p in state.processes) / max(state.interval_s, 1e-3)
    probe = f"probe {state.probe.describe()}" if state.probe else "no probe"
    stall = (
        f"stall verdict in {state.time_to_stall_s:.0f} s" if state.time_to_stall_s is not None else "serving"
    )
    usual = f", {usual_range(state.usual)}" if state.usual is not None else ""
    return (
        f"{state.t:6.1f}s phase {state.phase} ({state.in_phase_s:.0f} s{usual}) | "
        f"{plural(len(state.processes), 'process')}, CPU {cpu:.0%} | {probe} | {stall} | "
        f"last progress: {state.last_progress}"
    )


def event_text(text: str, prefix: str = "[hangwatch]") -> Text:
    """An event line for a Rich console: our prefix styled, ``text`` literal (never parsed as markup) and
    redacted."""
    return Text.assemble((prefix, "bold cyan"), " ", scrub(text))


def status_table(state: LiveState) -> Table:
    """The live table. Every string in it is a ``Text``: process titles, phase labels and log lines come
    from the server, and a ``[...]`` in them must show as written, not be parsed as Rich markup."""
    title = Text.assemble(
        "phase ",
        (scrub(state.phase), "bold"),
        scrub(f" ({state.phase_label}) for {state.in_phase_s:.0f} s{_usual(state)} — t={state.t:.0f} s"),
    )
    table = Table(title=title, caption=Text(scrub(_caption(state))), expand=False)
    for column in ("pid", "role/rank", "name", "state", "CPU %", "I/O /s", "RSS", "GPU mem"):
        numeric = column in ("CPU %", "I/O /s", "RSS", "GPU mem")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=True, min_width=5)
    for p in state.processes[:24]:
        gpu = state.gpu_mem_by_pid.get(p.pid)
        cells = (
            str(p.pid),
            f"{p.role or ''}{'/' + p.rank if p.rank else ''}",
            p.name[:32],
            p.state,
            f"{100 * p.cpu_delta_s / max(state.interval_s, 1e-3):.0f}",
            human_bytes(p.io_delta_bytes / max(state.interval_s, 1e-3)),
            human_bytes(p.rss_bytes),
            human_bytes(gpu) if gpu else "-",
        )
        table.add_row(*(Text(scrub(c)) for c in cells))
    return table


def _usual(state: LiveState) -> str:
    return f" ({usual_range(state.usual)})" if state.usual is not None else ""


def _caption(state: LiveState) -> str:
    probe = f"probe: {state.probe.describe()}" if state.probe else "no probe"
    stall = (
        f"stall verdict in {state.time_to_stall_s:.0f} s" if state.time_to_stall_s is not None else "serving"
    )
    return f"{probe} | {stall} | last progress: {state.last_progress}"


class RichView:
    """A live table on a terminal; the tree's output scrolls above it.

    Nothing from outside hangwatch is ever parsed as Rich markup: the echo goes out raw, events and
    table cells are ``Text`` objects (see ``event_text``, ``status_table``).
    """

    def __init__(self, console: Console | None = None) -> None:
        from rich.live import Live

        self._console = console if console is not None else Console()
        self._live = Live(console=self._console, refresh_per_second=2, transient=True, redirect_stdout=False)
        self._live.start()
        self._lock = threading.Lock()

    def echo(self, data: bytes) -> None:
        text = data.decode("utf-8", "replace").replace("\r", "\n").rstrip("\n")
        if text:
            with self._lock:
                # Console.out: no markup, no emoji, no highlighting; the server's bytes as they are.
                self._console.out(text, highlight=False)

    def event(self, text: str) -> None:
        with self._lock:
            self._console.print(event_text(text), highlight=False)

    def block(self, text: str) -> None:
        with self._lock:
            self._console.print(Text(scrub(text)), highlight=False)

    def update(self, state: LiveState) -> None:
        table = status_table(state)
        with self._lock:
            self._live.update(table)

    def close(self) -> None:
        with self._lock:
            self._live.stop()


def make_view(quiet: bool, out: TextIO = sys.stdout) -> View:
    if quiet:
        return QuietView()
    if out.isatty():
        return RichView()
    return PlainView(out)
