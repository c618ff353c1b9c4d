"""Issue 24 items 7 and 14 through the CLI: targets refused with exit 2 before anything is read or
signalled (hangwatch itself and its parent chain, the whole machine, kernel threads), and `stacks`
with its defaults naming the cause and the culprit a single capture could not.

Only processes this test starts are dumped; the refusals touch nothing (they exit before any dump,
watch or signal), so naming pid 1, pid 2 and our own pid is safe on a shared machine.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from hwrun import hangwatch_argv
from hwrun import program
from proc_helpers import spawn
from proc_helpers import wait_for_file

pytestmark = pytest.mark.timeout(180)


def hangwatch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # This test process is the parent of the hangwatch it runs: an ancestor, as a user's shell is.
    return subprocess.run(hangwatch_argv(*args), capture_output=True, text=True, timeout=timeout)


def _refused(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def test_attach_and_stacks_of_hangwatch_s_own_parent_are_refused() -> None:
    """attach watched 0 processes to a TIMEOUT, stacks exited 0: now both refuse, as cleanup does, a
    tree that holds nothing but hangwatch (this test's process has no other child while they run)."""
    started = time.monotonic()
    _refused(hangwatch("attach", "--pid", str(os.getpid()), "--window", "30"), "ancestor of hangwatch")
    assert time.monotonic() - started < 20  # refused at once, not after the window
    _refused(hangwatch("stacks", "--pid", str(os.getpid())), "ancestor of hangwatch")
    _refused(hangwatch("cleanup", "--pid", str(os.getpid()), "--dry-run"), "hangwatch itself")


def test_the_whole_machine_needs_its_flag() -> None:
    _refused(hangwatch("stacks", "--pid", "1"), "every process of the machine", "--whole-machine")
    _refused(hangwatch("attach", "--pid", "1", "--window", "1"), "--whole-machine")


def test_kernel_threads_are_never_listed_or_signalled() -> None:
    proc = hangwatch("cleanup", "--pid", "2", "--dry-run")
    _refused(proc, "kernel thread")
    assert "kworker" not in proc.stdout + proc.stderr
    _refused(hangwatch("stacks", "--pid", "2"), "kernel thread")


def test_stacks_by_default_finds_the_collective_wait_and_names_the_culprit(tmp_path) -> None:
    """With one capture by default it said `unknown`, "no rule matched", and advised running itself."""
    pytest.importorskip(
        "torch.distributed", reason="the gloo programs need torch (pip install torch==2.13.0)"
    )
    ready = tmp_path / "ready"
    argv = program(
        "gloo_missing_collective", "--world-size", "3", "--culprit", "1", "--ready-file", str(ready)
    )
    with spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as popen:
        wait_for_file(ready, 90, popen)
        out = subprocess.run(
            hangwatch_argv("stacks", "--pid", str(popen.pid), "--no-native"),
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "cause: collective-wait" in out.stdout, out.stdout
    culprits = next(line for line in out.stdout.splitlines() if line.strip().startswith("culprits:"))
    assert "gloo_rank1 [" in culprits, culprits  # name [pid] rank, not a bare pid
    assert "hangwatch stacks" not in out.stdout.split("\nnext:", 1)[-1]
