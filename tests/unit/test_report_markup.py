"""Text from the server is never markup in a report: HTML shows it escaped, Markdown shows it literally."""

from __future__ import annotations

from builders import report_with
from hangwatch.render.html import html_report
from hangwatch.render.markdown import markdown_report
from hangwatch.render.text import verdict_text

SERVER_TEXT = "<b>bold</b> `rm -rf` *x* [red]y[/red] [/models/foo]"


def test_html_escapes_server_text_and_never_makes_it_code():
    page = html_report(report_with(SERVER_TEXT))
    assert "<b>bold</b>" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "<code>rm -rf</code>" not in page  # a backtick in the summary is the server's, not ours
    assert "<code>py-spy dump --pid PID</code>" in page  # our own next steps keep their code spans


def test_markdown_keeps_server_text_literal():
    md = markdown_report(report_with(SERVER_TEXT))
    summary = next(line for line in md.splitlines() if "RuntimeError" in line and not line.startswith("log:"))
    assert "\\`rm -rf\\`" in summary and "\\*x\\*" in summary and "\\[red\\]" in summary
    assert "&lt;" not in md and "\\<b\\>" in summary


def test_verdict_text_is_plain_text():
    text = verdict_text(report_with(SERVER_TEXT))
    assert f"RuntimeError: {SERVER_TEXT}" in text
