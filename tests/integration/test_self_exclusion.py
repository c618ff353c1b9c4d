"""A tree that contains hangwatch (pid 1, the shell that started it, a tmux server): hangwatch and its
helpers are never part of what it watches or dumps."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from hangwatch.collect.proctree import TreeSampler
from hangwatch.collect.proctree import own_processes
from hangwatch.collect.proctree import whole_machine_note
from hwrun import hangwatch_argv
from proc_helpers import spawn
from proc_helpers import wait_for_file
from proc_helpers import wait_until

pytestmark = pytest.mark.timeout(120)

# A root with two children: a plain sleeper, and a "supervisor" (standing for hangwatch) with a child
# of its own (standing for its py-spy dumper). The root writes the pids once all are up.
ROOT = """
import json, subprocess, sys, time
sleeper = subprocess.Popen(["sleep", "120"])
supervisor = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '120'])"])
time.sleep(0.5)
open(sys.argv[1], "w").write(json.dumps({"sleeper": sleeper.pid, "supervisor": supervisor.pid}))
time.sleep(120)
"""


def test_an_excluded_process_and_everything_below_it_are_not_members(tmp_path):
    ready = tmp_path / "pids.json"
    with spawn([sys.executable, "-c", ROOT, str(ready)]) as root:
        pids = json.loads(wait_for_file(ready, timeout=30, popen=root))
        supervisor = pids["supervisor"]
        sampler = TreeSampler(
            [root.pid], lambda *a: (None, None), watch_deaths=False, exclude=lambda: {supervisor}
        )
        try:
            wait_until(
                lambda: len(sampler.sample(time.monotonic()).processes) == 2, timeout=10, what="2 members"
            )
            members = {p.pid for p in sampler.sample(time.monotonic()).processes}
        finally:
            sampler.close()
    assert members == {root.pid, pids["sleeper"]}


def test_stacks_of_a_tree_that_contains_hangwatch_is_refused(tmp_path):
    """The shell case: a parent runs `hangwatch stacks --pid <itself>` and waits for it. Its tree holds
    nothing but the shell and hangwatch (left out): refused with exit 2, as cleanup refuses it (issue 24);
    the exclusion above still applies to --pid 1 --whole-machine."""
    report = tmp_path / "stacks.json"
    argv = hangwatch_argv("stacks", "--no-native", "--report-json", str(report), "--pid")
    parent = f"import os, subprocess, sys\nsys.exit(subprocess.call({argv!r} + [str(os.getpid())]))\n"
    proc = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ancestor of hangwatch" in proc.stderr and not report.exists()


def test_what_pid_1_means_is_said():
    assert "every process of this machine (or of this container" in (whole_machine_note(1) or "")
    assert whole_machine_note(1234) is None
    assert own_processes() == {__import__("os").getpid()}
