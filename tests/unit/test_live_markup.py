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
