"""Lifecycle and bad input: clean exit, timeout, usage errors, Ctrl-C, SIGKILL of hangwatch, junk logs, attach."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from hwrun import assert_all_gone
from hwrun import program
from proc_helpers import proc_state
from proc_helpers import spawn
from proc_helpers import wait_for_file
from proc_helpers import wait_until

pytestmark = pytest.mark.timeout(120)


def test_clean_exit(hw):
    out = hw("run", "--quiet", "--", sys.executable, "-c", "print('done')")
    assert out.rc == 0
    assert out.verdict["state"] == "exited"


def test_timeout_while_still_progressing(hw):
    out = hw(
        "run",
        "--quiet",
        "--stall-after",
        "10",
        "--timeout",
        "4",
        "--",
        *program("silent_compile", "--seconds", "60"),
    )
    assert out.rc == 5
    assert out.verdict["state"] == "timeout"
    assert_all_gone(out.report)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--", "/no/such/command-xyz"], "command not found"),
        (["run", "--ready-url", "ftp://127.0.0.1/x", "--", "true"], "not an HTTP URL"),
        (["run", "--ready-pattern", "([", "--", "true"], "not a valid regular expression"),
        (["run", "--stall-after", "0", "--", "true"], "--stall-after"),
        (["run"], "no command"),
        (["attach", "--pid", "999999999"], "no process with PID 999999999"),
    ],
)
def test_bad_input_is_a_usage_error(args, message, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "hangwatch", *args], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def _hangwatch_popen(tmp_path, *cmd: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hangwatch",
            "run",
            "--quiet",
            "--run-dir",
            str(tmp_path / "run"),
            "--stall-after",
            "60",
            "--",
            *cmd,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _tree_pids(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_cleans_up_the_tree(tmp_path, sig):
    ready = tmp_path / "ready"
    proc = _hangwatch_popen(tmp_path, *program("self_stop", "--ranks", "2", "--ready-file", str(ready)))
    try:
        wait_for_file(ready, timeout=30)
        tree = [p for p in _tree_pids(proc.pid) if "guardian" not in " ".join(psutil.Process(p).cmdline())]
        assert len(tree) >= 3
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "INTERRUPTED" in out
    for pid in tree:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_sigkill_of_hangwatch_takes_the_tree_with_it(tmp_path):
    ready = tmp_path / "ready"
    proc = _hangwatch_popen(tmp_path, *program("lock_deadlock", "--ready-file", str(ready)))
    try:
        wait_for_file(ready, timeout=30)
        tree = [p for p in _tree_pids(proc.pid) if "guardian" not in " ".join(psutil.Process(p).cmdline())]
        assert tree
        proc.kill()  # no chance to clean up: the guardian must
        proc.communicate(timeout=10)
        wait_until(
            lambda: not any(psutil.pid_exists(p) for p in tree),
            timeout=15,
            what="tree killed by the guardian",
        )
    finally:
        for pid in tree:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_log_with_binary_junk_huge_line_and_no_final_newline(hw):
    script = (
        "import sys, time\n"
        "out = sys.stdout.buffer\n"
        "out.write(b'\\x00\\xff\\xfe junk \\x1b[31m red\\n')\n"
        "out.write(b'x' * (10 * 1024 * 1024) + b'\\n')\n"
        "out.write(b'READY without newline')\n"
        "out.flush()\n"
        "time.sleep(60)\n"
    )
    out = hw(
        "run",
        "--quiet",
        "--until-ready",
        "--ready-pattern",
        "READY without newline",
        "--",
        sys.executable,
        "-c",
        script,
    )
    assert out.rc == 0, out.stderr
    assert out.verdict["state"] == "ready"
    log_size = os.path.getsize(out.report["log_path"])
    assert log_size > 10 * 1024 * 1024  # every byte kept in the log file


def test_attach_names_the_stopped_rank_and_leaves_it_stopped(hw, tmp_path):
    ready = tmp_path / "ready"
    log = tmp_path / "server.log"
    with (
        log.open("w") as f,
        spawn(
            program("self_stop", "--ranks", "2", "--delay", "0.5", "--ready-file", str(ready)),
            stdout=f,
            stderr=f,
        ) as server,
    ):
        wait_for_file(ready, timeout=30)
        victim = wait_until(
            lambda: next((p for p in _tree_pids(server.pid) if proc_state(p) == "T"), None),
            timeout=10,
            what="victim stopped",
        )
        out = hw("attach", "--pid", str(server.pid), "--window", "30", "--stall-after", "6", "--quiet")
        assert out.rc == 3, out.stdout
        assert out.verdict["cause"] == "stopped"
        assert out.verdict["culprits"] == [victim]
        assert out.report["log_path"] == str(log)
        # Read-only: the stopped rank is still stopped, every process is still there.
        assert proc_state(victim) == "T"
        assert server.poll() is None


def test_attach_to_a_progressing_tree_reports_timeout_at_window_end(hw):
    with spawn(program("silent_compile", "--seconds", "60")) as server:
        time.sleep(0.5)
        out = hw("attach", "--pid", str(server.pid), "--window", "5", "--quiet")
        assert out.rc == 5
        assert out.verdict["state"] == "timeout"
        assert "window" in out.verdict["summary"]
        assert server.poll() is None
