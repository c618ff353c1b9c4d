"""Text from outside hangwatch is never Rich markup: the live view renders it literally, at a fixed width."""

from __future__ import annotations

import io
import time

from rich.console import Console

from hangwatch.model.samples import ProcessSample
from hangwatch.render.live import LiveState
from hangwatch.render.live import RichView
from hangwatch.render.live import event_text
from hangwatch.render.live import status_table

# What servers print: a path in brackets (a closing tag to Rich), PyTorch's rank prefix, a colour name.
SERVER_TEXT = "OSError: [/models/foo] not found; [rank1]: [red]boom[/red] [bold]"
RED = "\x1b[31m"


def console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, force_terminal=True, color_system="standard", highlight=False), out


def process(name: str) -> ProcessSample:
    return ProcessSample(
        pid=42, ppid=1, name=name, cmdline=(name,), state="S", cpu_s=1.0, cpu_delta_s=0.0,
        rchar=0, wchar=0, io_delta_bytes=0, threads=1, rss_bytes=0, listening_ports=(), role="[/w]", rank="[r]",
    )  # fmt: skip


def state(text: str) -> LiveState:
    return LiveState(
        t=3.0, phase="load[/x]", phase_label=text, in_phase_s=1.0, processes=(process("[/t] [red]x"),),
        interval_s=1.0, probe=None, time_to_stall_s=10.0, gpu=None, gpu_mem_by_pid={},
        last_progress=f"1 s ago ({text})",
    )  # fmt: skip


def plain(rendered: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", rendered)


def test_event_shows_the_prefix_and_server_text_as_written():
    c, out = console()
    c.print(event_text(f"verdict crashed: {SERVER_TEXT}"))
    text = out.getvalue()
    assert "[hangwatch] verdict crashed: " + SERVER_TEXT in plain(text)
    assert RED not in text  # [red] did not recolour the line


def test_table_cells_title_and_caption_are_literal():
    c, out = console()
    c.print(status_table(state(SERVER_TEXT)))  # raised MarkupError on [/models/foo]
    text = plain(out.getvalue())
    assert "[/models/foo]" in text
    assert "[rank1]" in text
    assert "[/t] [red]x" in text
    assert "load[/x]" in text
    assert "[/w]/[r]" in text
    assert RED not in out.getvalue()


def test_rich_view_echo_event_and_update_survive_markup():
    c, out = console()
    view = RichView(console=c)
    try:
        view.echo(f"{SERVER_TEXT}\n".encode())
        view.event(SERVER_TEXT)
        view.update(state(SERVER_TEXT))
        time.sleep(0.7)  # a refresh of the live table (2 per second) renders the caption
    finally:
        view.close()
    text = plain(out.getvalue())
    assert text.count(SERVER_TEXT) >= 2
    assert "[hangwatch] " + SERVER_TEXT in text


def test_every_line_the_views_print_is_redacted_as_the_reports_are(monkeypatch):
    """The live line said "verdict crashed: ... for token VALUE" while the block under it said ***: a
    secret of hangwatch's environment (which the tree inherits) and the known shapes are masked in the
    events, the plain status line and the Rich table alike."""
    from hangwatch import redact
    from hangwatch.render.live import PlainView

    secret = "hf_fakeTok3n9"  # too short for the hf_ shape: only HF_TOKEN's value says it is a secret
    shaped = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1"
    monkeypatch.setenv("HF_TOKEN", secret)
    redact._process_redactor.cache_clear()
    try:
        said = f"verdict crashed: RuntimeError: refused token {secret} and {shaped}"
        out = io.StringIO()
        view = PlainView(out, every_s=0)
        view.event(said)
        view.update(state(said))
        c, rich_out = console()
        c.print(event_text(said))
        c.print(status_table(state(said)))
        for text in (out.getvalue(), plain(rich_out.getvalue())):
            assert secret not in text and shaped not in text, text
            assert "refused token ***" in text
    finally:
        monkeypatch.delenv("HF_TOKEN")
        redact._process_redactor.cache_clear()
