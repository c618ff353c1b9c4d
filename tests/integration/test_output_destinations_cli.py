"""Where the real CLI writes, and what it refuses before anything starts (issue 24, items 1, 2, 12-14).

* ``--report-json -`` puts the report, and only the report, on stdout; the command's own words go to
  stderr; two outputs on ``-`` are refused;
* a report path that is a FIFO or a link to a descriptor is written into, and stays what it is;
* a run directory or a report folder that cannot take a file, or a probe URL that cannot be probed, is
  one line and exit 2, before the command is launched (a marker file says whether it ever ran).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proc_helpers import spawn

pytestmark = pytest.mark.timeout(180)


def hangwatch(*args: str, cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hangwatch", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def _one_line_usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hangwatch: error: "), proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def test_stacks_report_json_dash_is_the_report_alone_on_stdout(tmp_path):
    with spawn(["sleep", "60"]) as sleeper:
        proc = hangwatch("stacks", "--pid", str(sleeper.pid), "--report-json", "-", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # nothing but the report
    assert data["schema"] == "hangwatch.stacks/1" and data["pid"] == sleeper.pid
    assert f"hangwatch stacks of the tree of pid {sleeper.pid}" in proc.stderr  # the words, on stderr
    assert not (tmp_path / "-").exists()


def test_doctor_report_json_dash_is_the_report_alone_on_stdout(tmp_path):
    proc = hangwatch("doctor", "--fast", "--report-json", "-", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr  # this machine's own checks may warn
    assert json.loads(proc.stdout)["schema"] == "hangwatch.doctor/1"
    assert "hangwatch doctor (fast" in proc.stderr
    assert not (tmp_path / "-").exists()


def test_run_report_md_dash_keeps_the_servers_output_and_the_verdict_off_stdout(tmp_path):
    """The server's echoed output and the verdict (fd 1 of hangwatch and of what it starts) go to stderr."""
    proc = hangwatch(
        "run", "--no-doctor", "--run-dir", str(tmp_path / "run"), "--report-md", "-", "--",
        sys.executable, "-c", "print('hello from the server', flush=True)",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("### hangwatch: **EXITED**"), proc.stdout[:500]
    assert "hangwatch verdict: EXITED" not in proc.stdout and "hangwatch verdict: EXITED" in proc.stderr
    assert "hello from the server" in proc.stderr
    assert not (tmp_path / "-").exists()


def test_two_outputs_on_stdout_are_refused_before_launching(tmp_path):
    marker = tmp_path / "launched"
    proc = hangwatch(
        "run", "--no-doctor", "--run-dir", str(tmp_path / "run"), "--report-json", "-", "--report-html", "-",
        "--", "sh", "-c", f"touch {marker}",
        cwd=tmp_path,
    )  # fmt: skip
    _one_line_usage_error(proc, "--report-json and --report-html", "only one output can go to stdout")
    assert not marker.exists()


def test_a_fifo_report_path_is_written_into_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    with spawn(["cat", str(fifo)], stdout=subprocess.PIPE) as reader:
        proc = hangwatch("doctor", "--fast", "--report-json", str(fifo), cwd=tmp_path)
        assert proc.returncode in (0, 1), proc.stderr
        out, _ = reader.communicate(timeout=30)
    assert json.loads(out)["schema"] == "hangwatch.doctor/1"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert list(tmp_path.iterdir()) == [fifo]


def test_a_link_to_the_stdout_descriptor_is_written_through_and_stays_a_link(tmp_path):
    """As /dev/stdout is (never touched by a test): a link of our own to /proc/self/fd/1."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    proc = hangwatch("doctor", "--fast", "--report-json", str(link), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    assert '"schema": "hangwatch.doctor/1"' in proc.stdout
    assert link.is_symlink() and str(link.readlink()) == "/proc/self/fd/1"
    assert list(tmp_path.iterdir()) == [link]


def _sys_refuses_files() -> bool:
    return Path("/sys/kernel").is_dir()


# What `run` must refuse before launching, and a word of the one line that says why.
REFUSED = [
    (["--run-dir", "/proc/1"], "--run-dir /proc/1: cannot create files in"),
    (["--run-dir", "/etc/passwd"], "--run-dir /etc/passwd: is a file, not a folder"),
    (["--run-dir", "/etc/passwd/run"], "/etc/passwd is a file, not a folder"),
    (["--ready-url", "http://[::1"], "--ready-url http://[::1: not a valid URL"),
    (["--ready-url", "http://127.0.0.1:99999/health"], "Port out of range"),
    (["--report-json", "/sys/hangwatch-report.json"], "cannot create files in /sys"),
    (["--report-html", "/sys/hangwatch-report.html"], "cannot create files in /sys"),
    (["--report-md", "/sys/hangwatch-report.md"], "cannot create files in /sys"),
    (["--run-dir", "/sys/hangwatch-run/a"], "cannot create files in /sys"),
]


@pytest.mark.parametrize(("args", "words"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_run_refuses_what_cannot_work_before_launching(tmp_path, args, words):
    if "/sys/" in " ".join(args) and not _sys_refuses_files():
        pytest.skip("no sysfs on this machine")
    marker = tmp_path / "launched"
    started = time.monotonic()
    proc = hangwatch(
        "run", "--no-doctor", *args, "--", "sh", "-c", f"touch {marker}; exec sleep 30", cwd=tmp_path
    )
    _one_line_usage_error(proc, words)
    assert time.monotonic() - started < 20
    assert not marker.exists()
    assert not list(Path("/sys").glob(".hangwatch-probe-*"))


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root creates files in a folder of mode 0555 (see the /sys cases)"
)
def test_run_refuses_a_report_in_a_read_only_folder_before_launching(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    marker = tmp_path / "launched"
    try:
        proc = hangwatch(
            "run", "--no-doctor", "--run-dir", str(tmp_path / "run"), "--report-json", str(folder / "r.json"),
            "--", "sh", "-c", f"touch {marker}",
            cwd=tmp_path,
        )  # fmt: skip
    finally:
        folder.chmod(0o755)
    _one_line_usage_error(proc, f"cannot create files in {folder}")
    assert not marker.exists()


@pytest.mark.parametrize("command", ["isolate", "bench"])
def test_other_run_dirs_are_checked_before_launching(tmp_path, command):
    marker = tmp_path / "launched"
    launch = f"sh -c 'touch {marker}; exec sleep 30'"
    rest = (
        ["--no-doctor", "--", "sh", "-c", f"touch {marker}; exec sleep 30"]
        if command == "isolate"
        else ["--url", "http://127.0.0.1:1", "--launch-a", launch]
    )
    proc = hangwatch(command, "--run-dir", "/etc/passwd", *rest, cwd=tmp_path)
    _one_line_usage_error(proc, "--run-dir /etc/passwd: is a file, not a folder")
    assert not marker.exists()


def test_every_report_option_refuses_an_unwritable_folder_before_starting(tmp_path):
    """stacks, doctor, attach, bench, demo and isolate: the same check, made up front."""
    if not _sys_refuses_files():
        pytest.skip("no sysfs on this machine")
    cases = [
        ["stacks", "--pid", "1"],
        ["doctor", "--fast"],
        ["attach", "--pid", "1", "--window", "30"],
        ["bench", "--url", "http://127.0.0.1:1"],
        ["demo"],
        ["isolate", "--no-doctor", "--", "sleep", "30"],
    ]
    for args in cases:
        started = time.monotonic()
        proc = hangwatch(*args[:1], "--report-json", "/sys/hangwatch.json", *args[1:], cwd=tmp_path)
        _one_line_usage_error(proc, "--report-json /sys/hangwatch.json: cannot create files in /sys")
        assert time.monotonic() - started < 20, args


def test_doctor_with_a_python_that_does_not_exist_is_a_usage_error(tmp_path):
    proc = hangwatch("doctor", "--python", "/nonexistent/python", cwd=tmp_path)
    _one_line_usage_error(proc, "--python /nonexistent/python: no such file")


def test_an_unknown_option_before_the_command_is_named(tmp_path):
    proc = hangwatch("--bogus", cwd=tmp_path)
    _one_line_usage_error(proc, "--bogus", "options go after the command")
    assert "required: COMMAND" not in proc.stderr


def test_an_unknown_option_of_a_command_points_at_that_commands_help(tmp_path):
    proc = hangwatch("run", "--bogus", "--", "true", cwd=tmp_path)
    _one_line_usage_error(proc, "unrecognized arguments: --bogus", "`hangwatch run --help` lists its options")
