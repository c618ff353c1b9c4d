"""Options every command shares, through the real CLI: output files are checked before anything starts,
and a report that cannot be written at the end never costs the verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def hangwatch(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hangwatch", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


# Each command, with what it needs besides the output option; the option goes right after the command.
COMMANDS = {
    "run": (
        ["--", sys.executable, "-c", "print('should never start')"],
        ("--report-json", "--report-html", "--report-md"),
    ),
    "attach": (["--pid", "1", "--window", "1"], ("--report-json", "--report-html", "--report-md")),
    "stacks": (["--pid", "1"], ("--report-json",)),
    "doctor": (["--fast"], ("--report-json",)),
    "bench": (["--url", "http://127.0.0.1:1"], ("--report-json", "--report-html")),
    "demo": ([], ("--report-json",)),
}
CASES = [(name, flag) for name, (_, flags) in COMMANDS.items() for flag in flags]


def _usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert "usage:" not in proc.stderr  # one line that says what to do, not the whole usage
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    assert "should never start" not in proc.stdout


@pytest.mark.parametrize(("command", "flag"), CASES)
def test_a_folder_as_report_path_is_refused_before_starting(tmp_path, command, flag):
    folder = tmp_path / "reports"
    folder.mkdir()
    rest, _ = COMMANDS[command]
    proc = hangwatch(command, flag, str(folder), *rest, cwd=tmp_path)
    _usage_error(proc, flag, "is a folder", str(folder / "report."))
    assert list(folder.iterdir()) == [] and not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(("command", "flag"), CASES)
def test_a_report_path_in_a_missing_folder_is_refused_before_starting(tmp_path, command, flag):
    rest, _ = COMMANDS[command]
    proc = hangwatch(command, flag, str(tmp_path / "no" / "such" / "r.out"), *rest, cwd=tmp_path)
    _usage_error(proc, flag, "does not exist", "mkdir -p")


def test_a_report_that_cannot_be_written_at_the_end_keeps_the_verdict(tmp_path):
    """The program makes the report paths folders while it runs: the check at start passed, the
    write at the end fails; the verdict is printed all the same, the other report is written, and
    no PATH.tmp is left."""
    html, md, js = tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.json"
    code = f"import os; os.mkdir({str(html)!r}); os.mkdir({str(md)!r})"
    proc = hangwatch(
        "run", "--quiet", "--no-doctor", "--run-dir", str(tmp_path / "run"), "--report-html", str(html),
        "--report-md", str(md), "--report-json", str(js), "--", sys.executable, "-c", code,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "hangwatch verdict: EXITED" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert f"--report-html {html}: not written" in proc.stderr
    assert f"--report-md {md}: not written" in proc.stderr
    assert js.is_file() and '"exited"' in js.read_text()
    assert not list(tmp_path.glob("*.tmp")), list(tmp_path.iterdir())


# Every duration option of every command, with what the command needs besides it.
DURATIONS = [
    ("run", flag, ["--", "true"])
    for flag in ("--stall-after", "--timeout", "--interval", "--probe-timeout", "--grace")
] + [
    ("attach", flag, ["--pid", "1"])
    for flag in ("--window", "--stall-after", "--timeout", "--interval", "--probe-timeout")
] + [
    ("cleanup", flag, ["--pid", "999999999"]) for flag in ("--grace", "--gpu-wait")
] + [
    ("bench", flag, ["--url", "http://127.0.0.1:1"])
    for flag in ("--duration", "--request-timeout", "--idle-timeout", "--probe-timeout", "--boot-timeout",
                 "--stall-after", "--rate", "--temperature")
] + [("demo", "--stall-after", []), ("stacks", "--every", ["--pid", "1"])]  # fmt: skip
ZERO_OK = {("run", "--grace"), ("cleanup", "--grace"), ("cleanup", "--gpu-wait"), ("bench", "--temperature")}


@pytest.mark.parametrize(("command", "flag", "rest"), DURATIONS, ids=[f"{c}{f}" for c, f, _ in DURATIONS])
def test_every_duration_refuses_nan_inf_negatives_and_words(tmp_path, command, flag, rest):
    values = ["nan", "-5", "abc", "inf"] + ([] if (command, flag) in ZERO_OK else ["0"])
    if flag == "--timeout":
        values.remove("inf")  # --timeout inf: no limit, as when it is left out
    for value in values:
        proc = hangwatch(command, f"{flag}={value}", *rest, cwd=tmp_path, timeout=30)
        _usage_error(proc, flag)


def test_timeout_inf_means_no_limit(tmp_path):
    proc = hangwatch(
        "run", "--quiet", "--no-doctor", "--run-dir", str(tmp_path / "run"), "--timeout", "inf", "--", "true",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "hangwatch verdict: EXITED" in proc.stdout


def test_argparse_errors_are_one_line_and_a_pointer(tmp_path):
    proc = hangwatch("stacks", "--pid", "1", "--samples", "abc", cwd=tmp_path)
    _usage_error(proc, "--samples", "hangwatch stacks --help")
