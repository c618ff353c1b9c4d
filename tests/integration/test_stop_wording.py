"""What a stopped run says: which signal stopped it; a server stopped while serving healthily was ready
(exit 0); attach's limit is named as the one reached; attach leaves hangwatch itself out of the tree."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from hwrun import hangwatch_argv
from hwrun import program
from proc_helpers import free_port
from proc_helpers import spawn
from proc_helpers import wait_until

pytestmark = [
    pytest.mark.timeout(120),
]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _run(tmp_path, *args: str) -> subprocess.Popen[str]:
    argv = hangwatch_argv("run", "--quiet", "--no-doctor", "--run-dir", str(tmp_path / "run"),
                          "--report-json", str(tmp_path / "r.json"), *args)  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigterm_is_named_not_called_the_user(tmp_path):
    proc = _run(tmp_path, "--stall-after", "60", "--", sys.executable, "-c", "import time; time.sleep(60)")
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped by SIGTERM" in out and "by the user" not in out


def test_ctrl_c_while_serving_healthily_is_ready_and_exit_0(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    server = program("healthy_server", "--port", str(port), "--load-seconds", "1", "--health-after", "1")
    proc = _run(tmp_path, "--ready-url", url, "--stall-after", "30", "--", *server)
    wait_until(lambda: _healthy(url), timeout=30, what="server healthy")
    time.sleep(3)  # a probe or two after ready
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    verdict = json.loads((tmp_path / "r.json").read_text())["verdict"]
    assert verdict["state"] == "ready" and "then serving until interrupted" in verdict["summary"], verdict
    assert "before a verdict" not in out


def test_attach_names_the_limit_it_reached(hw):
    with spawn(program("silent_compile", "--seconds", "60")) as server:
        time.sleep(0.5)
        window = hw("attach", "--pid", str(server.pid), "--window", "4")  # not quiet: the live event too
        timeout = hw("attach", "--pid", str(server.pid), "--window", "30", "--timeout", "3", "--quiet")
    assert window.rc == 5 and "at the end of the 4 s --window" in window.verdict["summary"]
    assert "--timeout" not in window.stdout  # the live view's verdict event says the same
    assert timeout.rc == 5 and "after --timeout 3 s" in timeout.verdict["summary"]


def test_attach_to_a_tree_that_contains_hangwatch_leaves_it_out(tmp_path):
    report = tmp_path / "a.json"
    argv = hangwatch_argv("attach", "--quiet", "--window", "4", "--report-json", str(report), "--pid")
    # A batch script's shape: a server started in the background, then hangwatch attached to the script.
    parent = (
        "import os, subprocess, sys\n"
        "server = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"code = subprocess.call({argv!r} + [str(os.getpid())])\n"
        "server.kill(); server.wait(); sys.exit(code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=90)
    data = json.loads(report.read_text())
    pids = {p["pid"] for p in data["processes"]}
    assert len(pids) == 2, (proc.stdout, data["processes"])  # the parent and its server, not hangwatch
