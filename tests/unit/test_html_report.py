"""The HTML report's structure, on a fixed report (tests/builders.py ``timeline_report``): one colour and
dash per rank in every chart, legends in rank order, coinciding lines apart, the last progress and the
stall window marked, phase labels whole, the processes table at the verdict with the clean-up apart."""

from __future__ import annotations

import dataclasses
import re

from builders import timeline_report
from hangwatch.render.html import html_report
from hangwatch.render.timeline_svg import rank_key
from hangwatch.render.timeline_svg import timeline_svg

PATH = re.compile(
    r'<path d="([^"]+)" stroke="([^"]+)"((?: stroke-dasharray="[^"]+")?) class="line"><title>([^<]+)'
)
LEGEND = re.compile(r'class="key"/><text [^>]*class="legend">([^<]+)</text>')


def panels(svg: str) -> dict[str, list[tuple[str, str, str, str]]]:
    """Panel title -> its lines as (label, stroke, dash, path), in drawing order."""
    out: dict[str, list[tuple[str, str, str, str]]] = {}
    for chunk in re.split(r'<rect x="150" y="[\d.]+" width="830" height="[\d.]+" class="panel"/>', svg)[1:]:
        title = re.search(r'class="title">([^<]+)</text>', chunk)
        assert title is not None
        out[title.group(1)] = [(m[3], m[1], m[2], m[0]) for m in PATH.findall(chunk)]
    return out


def test_legends_in_rank_order_with_one_style_per_rank_in_every_chart():
    svg = timeline_svg(timeline_report())
    legends = LEGEND.findall(svg)
    assert legends[:5] == ["TP0 [103]", "TP1 [101]", "TP2 [102]", "TP3 [104]", "launcher [100]"]  # CPU
    assert legends[5:9] == ["TP0 [103]", "TP1 [101]", "TP2 [102]", "TP3 [104]"]  # I/O: the launcher did none
    by_panel = panels(svg)
    cpu = {label: (stroke, dash) for label, stroke, dash, _ in by_panel["CPU"]}
    io = {label: (stroke, dash) for label, stroke, dash, _ in by_panel["I/O"]}
    assert cpu == {
        "TP0 [103]": ("#1f77b4", ""),
        "TP1 [101]": ("#ff7f0e", ' stroke-dasharray="7 3"'),
        "TP2 [102]": ("#2ca02c", ' stroke-dasharray="3 2"'),
        "TP3 [104]": ("#d62728", ' stroke-dasharray="10 2 2 2"'),
        "launcher [100]": ("#9467bd", ""),
    }
    assert all(io[label] == cpu[label] for label in io)


def test_coinciding_lines_are_drawn_apart():
    """TP0, TP1 and TP3 have the same CPU at every tick: their paths still differ (offset), and every one
    of the five lines is drawn."""
    cpu = panels(timeline_svg(timeline_report()))["CPU"]
    paths = {label: d for label, _, _, d in cpu}
    assert len(paths) == 5
    assert len({paths["TP0 [103]"], paths["TP1 [101]"], paths["TP3 [104]"]}) == 3
    last_y = [float(d.rsplit(",", 1)[1]) for d in paths.values()]
    assert len(set(last_y)) == 5  # all idle at the end, all visible


def test_last_progress_and_stall_window_are_marked():
    svg = timeline_svg(timeline_report())
    assert (
        '<rect x="668.8" y="46.0" width="311.2" height="755.0" class="stall-window">'
        "<title>stall window: no progress for 12.0 s, stall after 10 s</title></rect>"
    ) in svg
    assert (
        '<line x1="668.8" y1="46.0" x2="668.8" y2="801.0" class="progress-line">'
        "<title>last progress at 20.0 s</title></line>"
    ) in svg
    assert ">last progress 20.0 s</text>" in svg and ">no progress 12 s, stall after 10 s</text>" in svg


def test_no_stall_window_without_a_stall_nor_marks_without_a_last_progress():
    from hangwatch.model.vocabulary import State

    report = timeline_report()
    ready = dataclasses.replace(report, verdict=dataclasses.replace(report.verdict, state=State.READY))
    svg = timeline_svg(ready)
    assert 'class="stall-window"' not in svg and 'class="progress-line"' in svg
    assert 'class="progress-line"' not in timeline_svg(dataclasses.replace(report, last_progress_t=None))


def test_phase_labels_are_whole():
    svg = timeline_svg(timeline_report())
    labels = re.findall(
        r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="start" class="band-label">([^<]+)</text>', svg
    )
    assert labels == [
        ("154.0", "69.0", "launch"),
        ("257.8", "69.0", "load_weights"),
        ("411.4", "90.0", "kv_cache"),  # 0.6 s wide: on a row below the bands, whole
        ("428.9", "69.0", "cuda_graph"),
    ]


def test_processes_table_at_the_verdict_with_the_cleanup_apart():
    page = html_report(timeline_report())
    table = page.split("<h2>Processes</h2>", 1)[1].split("</table>", 1)[0]
    assert (
        "<tr><th>pid</th><th>name</th><th>role/rank</th><th>state at verdict</th><th>exit at verdict</th>"
        "<th>clean-up</th><th>seen</th></tr>"
    ) in table
    rows = re.findall(r"<tr><td>.*</tr>", table)
    assert rows == [
        "<tr><td>103</td><td>sglang::scheduler_TP0</td><td>scheduler/TP0</td><td>S</td><td></td>"
        "<td>SIGTERM: -15</td><td>0.0-33.0 s</td></tr>",
        "<tr><td>101</td><td>sglang::scheduler_TP1</td><td>scheduler/TP1</td><td>S</td><td></td>"
        "<td>SIGTERM: -15</td><td>0.0-33.0 s</td></tr>",
        "<tr><td>102</td><td>sglang::scheduler_TP2</td><td>scheduler/TP2</td><td>S</td><td></td>"
        "<td>SIGTERM: -15</td><td>0.0-33.0 s</td></tr>",
        "<tr><td>104</td><td>sglang::scheduler_TP3</td><td>scheduler/TP3</td><td>S</td><td></td>"
        "<td>SIGTERM: -15</td><td>0.0-33.0 s</td></tr>",
        "<tr><td>100</td><td>launcher</td><td></td><td>S</td><td></td><td>SIGTERM: -15</td><td>0.0-33.0 s</td></tr>",
    ]


def test_processes_table_without_a_cleanup_shows_what_was_seen():
    """attach cleans nothing up: no clean-up column, the last state and exit as they are."""
    report = timeline_report()
    seen = tuple(
        dataclasses.replace(p, verdict_state=None, cleanup=None, state="gone" if p.pid == 102 else "S",
                            exit_code=1 if p.pid == 102 else None)
        for p in report.processes
    )  # fmt: skip
    table = html_report(dataclasses.replace(report, processes=seen)).split("<h2>Processes</h2>", 1)[1]
    assert "<th>clean-up</th>" not in table
    assert (
        "<tr><td>102</td><td>sglang::scheduler_TP2</td><td>scheduler/TP2</td><td>gone</td><td>1</td>" in table
    )


def test_rank_order_is_numeric():
    ranks = ["TP10", "rank3", None, "TP2", "TP0", "PP1-TP0", "rank12"]
    assert sorted(ranks, key=rank_key) == ["PP1-TP0", "TP0", "TP2", "TP10", "rank3", "rank12", None]


def test_cleanup_outcomes_from_the_records_at_the_verdict():
    from hangwatch.model.report import ProcessRecord
    from hangwatch.supervise.session import with_cleanup
    from hangwatch.supervise.teardown import CleanupResult

    def rec(pid: int, state: str, code: int | None = None) -> ProcessRecord:
        return ProcessRecord(pid, 1, f"p{pid}", (), None, None, state, code)

    final = (
        rec(1, "gone", -15),
        rec(2, "gone", -9),
        rec(3, "gone", 1),
        rec(4, "D"),
        rec(5, "gone", 0),
        rec(6, "gone", 0),
    )
    at_verdict = {1: rec(1, "S"), 2: rec(2, "T"), 3: rec(3, "gone", 1), 4: rec(4, "D"), 5: rec(5, "R")}
    report = dataclasses.replace(timeline_report(), processes=final)
    result = CleanupResult(terminated=(1,), killed=(2,), remaining=(4,))
    got = {p.pid: (p.verdict_state, p.cleanup) for p in with_cleanup(report, at_verdict, result).processes}
    assert got == {
        1: ("S", "SIGTERM: -15"),
        2: ("T", "SIGKILL: -9"),
        3: ("gone", None),  # ended before the verdict: nothing for the clean-up to do
        4: ("D", "REMAINS after SIGKILL"),
        5: ("R", "ended: 0"),  # ended by itself while the tree shut down, before we signalled it
        6: (None, None),  # first seen during the clean-up
    }


def test_a_stall_closed_early_is_not_said_to_follow_the_rule():
    report = dataclasses.replace(timeline_report(), stall_after_s=60.0)
    assert ">no progress 12 s, before --stall-after 60 s</text>" in timeline_svg(report)
