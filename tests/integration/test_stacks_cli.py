"""`hangwatch stacks`, the reports (JSON, HTML, Markdown), and no false stalls with stacks on."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from hwrun import program
from proc_helpers import free_port
from proc_helpers import proc_state
from proc_helpers import spawn
from proc_helpers import tree_of
from proc_helpers import wait_for_file
from proc_helpers import wait_until

pytestmark = pytest.mark.timeout(180)


def _stacks(*args: str, user: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "hangwatch", "stacks", *args]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def test_stacks_snapshot_of_a_lock_deadlock_is_read_only(tmp_path):
    ready = tmp_path / "ready"
    with spawn(program("lock_deadlock", "--ready-file", str(ready)), stdout=subprocess.DEVNULL) as popen:
        wait_for_file(ready, 30, popen)
        report = tmp_path / "stacks.json"
        out = _stacks("--pid", str(popen.pid), "--samples", "2", "--every", "1", "--report-json", str(report))
        assert out.returncode == 0, out.stderr
        assert "cause: lock-deadlock, high confidence" in out.stdout
        assert "worker-A waits at lock_deadlock.py:34 `with lock_b:" in out.stdout
        assert "take_a_then_b (lock_deadlock.py:34)" in out.stdout and "[unchanged]" in out.stdout
        data = json.loads(report.read_text())
        assert data["schema"] == "hangwatch.stacks/1" and len(data["stacks"]) == 2
        assert data["diagnosis"]["cause"] == "lock-deadlock" and data["diagnosis"]["culprits"] == [popen.pid]
        assert data["stack_tree"]["threads"] == 3
        assert proc_state(popen.pid) == "S"


def test_stacks_skips_a_stopped_rank_and_leaves_it_stopped(tmp_path):
    ready = tmp_path / "ready"
    argv = program("self_stop", "--ranks", "2", "--victim", "1", "--delay", "0.2", "--ready-file", str(ready))
    with spawn(argv, stdout=subprocess.DEVNULL) as popen:
        wait_for_file(ready, 30, popen)
        victim = wait_until(
            lambda: next((p.pid for p in tree_of(popen.pid) if proc_state(p.pid) == "T"), None),
            20,
            what="stop",
        )
        out = _stacks("--pid", str(popen.pid))
        assert out.returncode == 0, out.stderr
        assert "cause: stopped" in out.stdout and str(victim) in out.stdout
        assert "stopped (state T): not dumped" in out.stdout
        # Stopped before we came: stopped after we left. Nothing else was left stopped.
        assert proc_state(victim) == "T"
        assert all(proc_state(p.pid) != "T" for p in tree_of(popen.pid) if p.pid != victim)


def test_non_python_processes_are_recorded_with_the_reason(tmp_path):
    with spawn(["sh", "-c", "sleep 600 & wait"], stdout=subprocess.DEVNULL) as popen:
        wait_until(lambda: tree_of(popen.pid)[:-1], 10, what="the sleep child")
        out = _stacks("--pid", str(popen.pid))
        assert out.returncode == 0, out.stderr
        assert "not-python (not a Python process" in out.stdout
        assert "cause: unknown" in out.stdout


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_permission_failure_says_how_to_fix_it(tmp_path):
    """An unprivileged user cannot ptrace root's processes: the reason and the fix, not a traceback."""
    ready = tmp_path / "ready"
    with spawn(program("lock_deadlock", "--ready-file", str(ready)), stdout=subprocess.DEVNULL) as popen:
        wait_for_file(ready, 30, popen)
        out = _stacks("--pid", str(popen.pid), user="65534")
        unusable = ("Permission denied" in out.stderr and "python" in out.stderr.lower()) or (
            "No module named hangwatch"
            in out.stderr  # the checkout is not readable by that user (a 0700 dir)
        )
        if unusable and out.returncode != 0:
            pytest.skip(f"this interpreter is not usable by uid 65534: {out.stderr[-200:]}")
        assert out.returncode == 0, out.stderr
        assert "denied (permission denied" in out.stdout
        assert "ptrace_scope" in out.stdout and "SYS_PTRACE" in out.stdout
        assert "Traceback" not in out.stderr


def test_stacks_usage_errors():
    assert _stacks("--pid", "999999999").returncode == 2
    assert _stacks("--pid", "1", "--samples", "0").returncode == 2


HOSTILE = (
    "import sys, time\n"
    "print('RuntimeError: <script>alert(\"pwned\")</script> token=hf_abcdefghijklmnopqrstuvwxyz0123',\n"
    "      flush=True)\n"
    "time.sleep(3600)\n"
)


def test_reports_escape_and_redact_what_came_from_the_server(hw, tmp_path):
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    out = hw(
        "run",
        "--quiet",
        "--stall-after",
        "6",
        "--report-html",
        str(html),
        "--report-md",
        str(md),
        "--",
        sys.executable,
        "-c",
        HOSTILE,
    )
    assert out.rc == 3 and out.verdict["cause"] == "exception"
    page = html.read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in page
    assert "<svg" in page and "timeline" in page
    assert 'src="http' not in page and 'href="http' not in page  # nothing fetched: works offline
    text = md.read_text()
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in text
    # Outside code blocks and spans (where Markdown shows text as is) nothing is raw HTML.
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```text\n.*?```", "", text, flags=re.S))
    assert "<script>" not in prose and "\\<script\\>" in prose
    assert text.startswith("### hangwatch: **STALLED**")
    # The stack tree made it into every report.
    assert out.report["stack_tree"] is not None
    assert "Stacks merged across ranks" in page and "Stacks merged across ranks" in text
    assert "stacks:" in out.stdout


def test_html_report_renders_in_headless_chromium(hw, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip(
            "chromium is not installed (Debian: apt-get install -y chromium); the HTML render is untested"
        )
    html = tmp_path / "r.html"
    ready = tmp_path / "ready"
    out = hw(
        "run",
        "--quiet",
        "--stall-after",
        "60",
        "--report-html",
        str(html),
        "--",
        *program("lock_deadlock", "--ready-file", str(ready)),
    )
    assert out.verdict["cause"] == "lock-deadlock"
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            html.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert shot.exists(), proc.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1200, 1600)
    assert len(png) > 30_000, "a blank page compresses to a few KB; the report has text and a chart"


def test_silent_compile_in_workers_is_sampled_but_never_stalled(hw):
    """CPU-only progress: stacks are taken (quiet but for CPU); the burners are work, not a spin."""
    port = free_port()
    out = hw(
        "run",
        "--until-ready",
        "--quiet",
        "--stall-after",
        "5",
        "--ready-url",
        f"http://127.0.0.1:{port}/health",
        "--",
        *program("silent_compile", "--seconds", "16", "--workers", "2", "--port", str(port)),
    )
    assert out.verdict["state"] == "ready", out.verdict
    assert len(out.report["stacks"]) >= 2, "quiet but for CPU: stacks must have been sampled"


def test_no_stacks_turns_capture_off(hw, tmp_path):
    out = hw(
        "run",
        "--quiet",
        "--stall-after",
        "5",
        "--no-stacks",
        "--",
        *program("lock_deadlock", "--ready-file", str(tmp_path / "ready")),
    )
    assert out.verdict["state"] == "stalled"
    assert out.report["stacks"] == [] and out.report["stack_tree"] is None
    assert any("--no-stacks" in n for n in out.report["notes"])
