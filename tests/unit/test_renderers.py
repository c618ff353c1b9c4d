"""Exact output of the renderers on reports built by hand (tests/builders.py), as memray and pystack pin
theirs: the verdict text, the stack tree at fixed widths, the live view's status line and table at 100
columns, the Markdown summary, and the HTML report's structure. The server's words carry markup-like
brackets, HTML, Markdown and backticks, and bytes that are not text: what the collect boundary lets
through (``clean_text``: control characters dropped, invalid UTF-8 replaced) must come out literally."""

from __future__ import annotations

import dataclasses
import io
import re
from html.parser import HTMLParser

from rich.console import Console

from builders import live_state
from builders import stalled_report
from hangwatch.collect.logtail import clean_text
from hangwatch.model.history import PhaseHistory
from hangwatch.render.html import html_report
from hangwatch.render.live import status_line
from hangwatch.render.live import status_table
from hangwatch.render.markdown import markdown_report
from hangwatch.render.stacktext import tree_lines
from hangwatch.render.text import verdict_text

# What a server may print: Rich markup, HTML, Markdown, a backtick fence, a terminal colour escape, a NUL
# and a byte that is not UTF-8. The log boundary strips the escape whole, drops the control characters and
# replaces the bad byte.
RAW = b" [bold]<b>`x``` \x1b[31m\x00\xff|#*_"
JUNK = " [bold]<b>`x``` \ufffd|#*_"


def test_the_log_boundary_lets_no_control_character_through():
    assert clean_text(RAW) == JUNK


VERDICT = """\
hangwatch verdict: STALLED (cause: cuda-graph-capture, high confidence)
  stalled: nothing progressed for 10 s; TP3 took another path
  phase: cuda_graph (capturing CUDA graphs, for 10 s)
  culprits: sglang::scheduler_TP3 [204] scheduler/TP3
  evidence:
    - log silent 10 s
    - last line: Capture cuda graph begin
  stacks: TP0-2 in Barrier.wait > Condition.wait; TP3 in broadcast > Condition.wait (odd one out)
    (2 samples; 4 processes, 4 threads)
    [TP0-3] spawn_main (serve.py:10) > run_scheduler (serve.py:20) > CudaGraphRunner.capture (serve.py:30)
    +- [TP0-2] capture_one (serve.py:10) > Barrier.wait (serve.py:20) > Condition.wait (serve.py:30) [unchanged]
    `- [TP3] broadcast_draft (serve.py:10) > broadcast (serve.py:20) > Condition.wait (serve.py:30) [unchanged] << odd one out
  next:
    - Confirm with --disable-cuda-graph (SGLang).
  notes:
    - cleanup: 5 processes stopped
  log: /tmp/run/output.log (the raw output, not redacted: mode 0600, readable by you only)"""


def test_verdict_text():
    assert verdict_text(stalled_report()) == VERDICT


def test_verdict_text_shows_the_servers_words_as_written():
    text = verdict_text(stalled_report(JUNK))
    assert text.splitlines()[1] == f"  stalled: nothing progressed for 10 s; TP3 took another path{JUNK}"
    assert text.splitlines()[3] == f"  culprits: sglang::scheduler_TP3{JUNK} [204] scheduler/TP3"
    assert text.splitlines()[10] == (
        f"    +- [TP0-2] capture_one (serve.py:10) > Barrier.wait (serve.py:20) > Condition.wait{JUNK} "
        "(serve.py:30) [unchanged]"
    )
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", text)


def test_stack_tree_clipped_at_72_columns_keeps_the_marks():
    assert tree_lines(stalled_report().stack_tree, width=72) == [
        "stacks: TP0-2 in Barrier.wait > Condition.wait; TP3 in broadcast > Co...",
        "  (2 samples; 4 processes, 4 threads)",
        "  [TP0-3] spawn_main (serve.py:10) > run_scheduler (serve.py:20) > Cu...",
        "  +- [TP0-2] capture_one (serve.py:10) > Barrier.wait (se... [unchanged]",
        "  `- [TP3] broadcast_draft (serve.py:10) >... [unchanged] << odd one out",
    ]


def test_stack_tree_cut_at_max_lines_says_where_the_rest_is():
    assert tree_lines(stalled_report().stack_tree, width=100, max_lines=2) == [
        "stacks: TP0-2 in Barrier.wait > Condition.wait; TP3 in broadcast > Condition.wait (odd one out)",
        "  (2 samples; 4 processes, 4 threads)",
        "  [TP0-3] spawn_main (serve.py:10) > run_scheduler (serve.py:20) > CudaGraphRunner.capture (serve...",
        "  ... 2 more lines in the JSON/HTML report",
    ]


def test_live_status_line():
    assert status_line(live_state()) == (
        "  12.0s phase weights (5 s) | 1 process, CPU 50% | probe refused | stall verdict in 48 s | "
        "last progress: 2 s ago (I/O)"
    )
    assert status_line(live_state(time_to_stall_s=None, probe=None)).endswith(
        "| no probe | serving | last progress: 2 s ago (I/O)"
    )
    # With a phase history: the phase against its usual duration in earlier boots.
    usual = PhaseHistory("weights", 22.0, 25.0, 5, 7, 23.0)
    assert status_line(live_state(usual=usual)).startswith(
        "  12.0s phase weights (5 s, usual 22-25 s, 5 boots) |"
    )


LIVE_TABLE = """\
                  phase weights (loading weights) for 5 s — t=12 s                  
┏━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┓
┃ pid   ┃ role/rank ┃ name            ┃ state ┃ CPU % ┃ I/O /s ┃     RSS ┃ GPU mem ┃
┡━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━┩
│ 42    │           │ python serve.py │ S     │    50 │    0 B │ 3.0 GiB │       - │
└───────┴───────────┴─────────────────┴───────┴───────┴────────┴─────────┴─────────┘
       probe: refused | stall verdict in 48 s | last progress: 2 s ago (I/O)        
"""  # noqa: W291 - Rich centres the title and the caption with spaces


def test_live_table_at_100_columns():
    out = io.StringIO()
    Console(file=out, width=100, color_system=None, highlight=False).print(status_table(live_state()))
    assert out.getvalue() == LIVE_TABLE


MARKDOWN = """\
### hangwatch: **STALLED** — cause `cuda-graph-capture` (high confidence)

stalled: nothing progressed for 10 s; TP3 took another path

- engine profile: `sglang`, mode `run`, watched 10 s (started 2025-01-01T00:00:00+00:00)
- phase: cuda\\_graph (capturing CUDA graphs, for 10 s)
- culprits: sglang::scheduler\\_TP3 [204] scheduler/TP3
- command: `python serve.py`

<details><summary>Stacks merged across ranks</summary>

```text
stacks: TP0-2 in Barrier.wait > Condition.wait; TP3 in broadcast > Condition.wait (odd one out)
  (2 samples; 4 processes, 4 threads)
  [TP0-3] spawn_main (serve.py:10) > run_scheduler (serve.py:20) > CudaGraphRunner.capture (serve.py:30)
  +- [TP0-2] capture_one (serve.py:10) > Barrier.wait (serve.py:20) > Condition.wait (serve.py:30) [unchanged]
  `- [TP3] broadcast_draft (serve.py:10) > broadcast (serve.py:20) > Condition.wait (serve.py:30) [unchanged] << odd one out
```

</details>

Evidence:

```text
log silent 10 s
last line: Capture cuda graph begin
```

Next steps:

- Confirm with --disable-cuda-graph (SGLang).

Notes:

- cleanup: 5 processes stopped

_Report written by hangwatch._
"""


def test_markdown():
    assert markdown_report(stalled_report()) == MARKDOWN


def test_markdown_escapes_the_servers_words_outside_code_and_breaks_fences_inside():
    md = markdown_report(stalled_report(JUNK)).splitlines()
    escaped = " \\[bold\\]\\<b\\>\\`x\\`\\`\\` \ufffd\\|\\#\\*\\_"  # shown literally, never interpreted
    assert md[2] == f"stalled: nothing progressed for 10 s; TP3 took another path{escaped}"
    assert md[6] == f"- culprits: sglang::scheduler\\_TP3{escaped} [204] scheduler/TP3"
    assert md[-3] == f"- cleanup: 5 processes stopped{escaped}"
    fenced = " [bold]<b>`x`\u200b`\u200b` \ufffd|#*_"  # inside ```text: only the fence is broken up
    assert f"last line: Capture cuda graph begin{fenced}" in md
    assert sum(line.startswith("```") for line in md) == 4  # two blocks opened and closed, none by the server


def test_markdown_keeps_the_servers_entities_as_written():
    """``&amp;`` from the server is those five characters on GitHub, not an ampersand."""
    md = markdown_report(stalled_report(" AT&amp;T &lt;b&gt; & co")).splitlines()
    assert (
        md[2] == "stalled: nothing progressed for 10 s; TP3 took another path AT\\&amp;T \\&lt;b\\&gt; \\& co"
    )


class Elements(HTMLParser):
    """Every element of the page as (tag, attributes, its whole text, how many <li> enclose it)."""

    VOID = frozenset({"br", "meta", "link", "img", "hr", "input"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict[str, str], list[str], int]] = []
        self.open: list[tuple[str, dict[str, str], list[str], int]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        depth = sum(1 for e in self.open if e[0] == "li")
        element = (tag, {k: v or "" for k, v in attrs}, [], depth)
        self.found.append(element)
        if tag not in self.VOID:
            self.open.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self.open:
            if self.open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self.open:
            element[2].append(data)

    def text(self, element: tuple[str, dict[str, str], list[str], int]) -> str:
        return " ".join("".join(element[2]).split())

    def all(self, tag: str, cls: str | None = None) -> list[tuple[str, dict[str, str], list[str], int]]:
        return [
            e for e in self.found if e[0] == tag and (cls is None or cls in e[1].get("class", "").split())
        ]

    def by_id(self, ident: str) -> tuple[str, dict[str, str], list[str], int]:
        return next(e for e in self.found if e[1].get("id") == ident)


def page(report_text: str = "") -> Elements:
    html = html_report(stalled_report(report_text))
    body = html[html.index("<body>") :]
    parsed = Elements()
    parsed.feed(re.sub(r'<div class="svgwrap">.*?</div>', "", body, flags=re.S))  # the timeline: elsewhere
    return parsed


def test_html_structure():
    p = page()
    assert [p.text(e) for e in p.all("h2")] == [
        "Evidence", "Next steps", "Timeline", "Stacks merged across ranks", "Processes", "Notes",
    ]  # fmt: skip
    assert p.text(p.by_id("verdict")) == (
        "STALLED — cause cuda-graph-capture (high confidence) stalled: nothing progressed for 10 s; TP3 took "
        "another path phase: cuda_graph (capturing CUDA graphs, for 10 s) culprits: sglang::scheduler_TP3 "
        "[204] rank TP3"
    )
    assert [p.text(e) for e in p.all("li") if "class" not in e[1]] == [
        "log silent 10 s",
        "last line: Capture cuda graph begin",
        "Confirm with --disable-cuda-graph (SGLang).",
        "cleanup: 5 processes stopped",
    ]
    nodes = [e for e in p.all("li") if "class" in e[1]]  # the stack tree's: depth, label, odd or not
    labels = [p.text(e) for e in p.all("span", "label")]
    tree = [(e[3], label, e[1]["class"]) for e, label in zip(nodes, labels, strict=True)]
    assert tree == [(0, "TP0-3", ""), (1, "TP0-2", ""), (1, "TP3", "odd")]
    assert [p.text(e) for e in p.all("summary")] == [
        "TP0-3spawn_main (serve.py:10) > run_scheduler (serve.py:20) > CudaGraphRunner.capture (serve.py:30) "
        "(4 threads)",
        "TP0-2capture_one (serve.py:10) > Barrier.wait (serve.py:20) > Condition.wait (serve.py:30) "
        "[unchanged] (3 threads)",
        "TP3broadcast_draft (serve.py:10) > broadcast (serve.py:20) > Condition.wait (serve.py:30) "
        "[unchanged] odd one out (1 thread)",
    ]
    assert [p.text(e) for e in p.all("tr")] == [
        "pidnamerole/rankstate at verdictexit at verdictseen",
        "201sglang::scheduler_TP0scheduler/TP0S0.0-10.0 s",
        "202sglang::scheduler_TP1scheduler/TP1S0.0-10.0 s",
        "203sglang::scheduler_TP2scheduler/TP2S0.0-10.0 s",
        "204sglang::scheduler_TP3scheduler/TP3S0.0-10.0 s",
        "200python -m sglang.launch_servermainS0.0-10.0 s",
    ]
    assert [p.text(e) for e in p.all("ul", "notes")] == ["cleanup: 5 processes stopped"]


def test_html_shows_the_servers_words_as_text_never_as_markup():
    p = page(JUNK)
    shown = " ".join(JUNK.split())
    assert p.text(p.all("ul", "notes")[0]) == f"cleanup: 5 processes stopped {shown}"
    assert p.text(p.all("ul", "evidence")[0]).endswith(f"last line: Capture cuda graph begin {shown}")
    assert p.text(p.all("td")[1]) == f"sglang::scheduler_TP0 {shown}"
    # The only elements are ours: the server's <b> is text, and no <script> or other tag came from it.
    assert len(p.all("b")) == 1 and not p.all("script")
    assert {e[0] for e in p.found} <= {
        "body", "h1", "h2", "p", "div", "b", "code", "span", "br", "ul", "li", "details", "summary", "table",
        "tr", "th", "td",
    }  # fmt: skip
    html = html_report(stalled_report(JUNK))
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", html)


def test_the_recap_of_a_stall_said_before_has_its_headline_and_the_tree_not_the_diagnosis():
    from hangwatch.render.text import recap_text

    r = dataclasses.replace(
        stalled_report(), tree_action="left running after the stall at 5.0 s", notes=("n1",)
    )
    text = recap_text(r, 5.0)
    assert text.splitlines()[0] == verdict_text(r).splitlines()[0]
    assert (
        "as said at 5.0 s above" in text and "tree: left running after the stall" in text and "- n1" in text
    )
    assert r.verdict.summary not in text and "stacks:" not in text
