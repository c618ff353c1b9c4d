"""``hangwatch demo``: the ranks it can run, and its reports."""

from __future__ import annotations

import os
import subprocess

import pytest

from hwrun import hangwatch_argv

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("ranks", "words"), [("1", "at least 2"), ("0", "at least 2"), ("x", "not a whole")])
def test_ranks_it_cannot_run_are_a_usage_error(tmp_path, ranks, words):
    proc = subprocess.run(
        hangwatch_argv("demo", "--ranks", ranks), capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and words in proc.stderr, (proc.stdout, proc.stderr)
    assert "verdict" not in proc.stdout  # refused before anything started


def test_small_demo_writes_html_and_markdown(tmp_path):
    html, md = tmp_path / "demo.html", tmp_path / "demo.md"
    proc = subprocess.run(
        hangwatch_argv("demo", "--ranks", "2", "--stall-after", "4", "--quiet", "--report-html", str(html),
                       "--report-md", str(md)),
        capture_output=True, text=True, timeout=100, cwd=tmp_path,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},  # its run folder: not in ~/.local
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "hangwatch verdict: STALLED" in proc.stdout
    assert "preflight" not in proc.stderr  # the demo's engine is a story: no checks of this host for it
    assert "<html" in html.read_text() and md.read_text().startswith("### hangwatch: **STALLED**")
