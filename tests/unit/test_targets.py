"""Issue 24 items 7 and 14: the pid targets no command may take, and what ``stacks`` says after itself."""

from __future__ import annotations

import os

import pytest

from builders import process_sample
from hangwatch.analyse import causes
from hangwatch.analyse import stackwatch
from hangwatch.cli import stacks as stacks_cli
from hangwatch.collect import procfs
from hangwatch.collect.proctree import check_target
from hangwatch.collect.proctree import is_kernel_thread
from hangwatch.errors import UsageError
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import Cause
from hangwatch.stacks import culprit_labels
from hangwatch.stacks import snapshot_steps

# /proc/PID/stat of a kernel thread (a kworker): flags (field 9) 0x04208060 hold PF_KTHREAD.
KWORKER = "57 (kworker/0:1-events) I 2 0 0 0 -1 69238880 0 0 0 0 0 3 0 0 20 0 1 0 12 0 0 " + " ".join(
    ["0"] * 30
)
PYTHON = "812 (python) S 700 812 812 0 -1 4194560 10 0 0 0 5 1 0 0 20 0 3 0 500 1000 40 " + " ".join(
    ["0"] * 30
)


def test_a_kernel_thread_is_known_by_its_flags() -> None:
    kworker, python = procfs.parse_stat(57, KWORKER), procfs.parse_stat(812, PYTHON)
    assert kworker.kernel_thread and not python.kernel_thread
    assert is_kernel_thread(57, kworker) and not is_kernel_thread(812, python)
    assert is_kernel_thread(2)  # kthreadd itself, whatever /proc shows of it here


def test_kernel_threads_are_refused_as_targets() -> None:
    with pytest.raises(UsageError, match="kthreadd, the parent of every kernel thread"):
        check_target("--pid 2", [2])
    with pytest.raises(UsageError, match="pid 57 is a kernel thread"):
        # 99999999: above any pid_max, never a live process (a low pid may be a kernel thread here).
        check_target("pid 99999999", [99_999_999, 57], stats={57: procfs.parse_stat(57, KWORKER)})


def test_hangwatch_and_its_ancestors_are_refused() -> None:
    with pytest.raises(UsageError, match="it is hangwatch itself"):
        check_target(f"--pid {os.getpid()}", [os.getpid()])
    with pytest.raises(UsageError, match="an ancestor of hangwatch"):
        check_target(f"--pid {os.getppid()}", [os.getppid()])
    # attach and stacks only read: an ancestor whose tree holds hangwatch alone is refused, one that
    # also started something else (a batch script's server in the background) is watched without us.
    with pytest.raises(UsageError, match="it is hangwatch itself"):
        check_target(f"--pid {os.getpid()}", [os.getpid()], others_ok=True)


def test_the_whole_machine_only_by_name() -> None:
    with pytest.raises(UsageError) as e:
        check_target("--pid 1", [1], whole_machine_flag="--whole-machine")
    assert "every process of the machine" in str(e.value) and "--whole-machine" in e.value.help_text
    check_target("--pid 1", [1], whole_machine_flag="--whole-machine", whole_machine=True)
    with pytest.raises(UsageError):  # cleanup has no such flag: never
        check_target("pid 1", [1], whole_machine=True)


def test_stacks_takes_what_the_rules_need_by_default() -> None:
    """One capture names no wait (StackContext.over_time): the default is the watch's burst."""
    assert stacks_cli.SAMPLES == stackwatch.SAMPLES >= 2
    assert stacks_cli.SAMPLES * stacks_cli.EVERY_S <= 5  # a snapshot, not a watch


@pytest.mark.parametrize("cause", list(Cause))
def test_stacks_never_advises_taking_the_stacks(cause: Cause) -> None:
    steps = snapshot_steps(causes.Diagnosis(cause, (), "x"), 4242)
    assert not any("hangwatch stacks" in s for s in steps), steps
    assert all(s.strip() and "  " not in s for s in steps), steps
    if cause is Cause.UNKNOWN:
        assert any("hangwatch attach --pid 4242" in s for s in steps)
    if cause is Cause.COLLECTIVE_WAIT:
        assert steps[0].startswith("Look at the odd ones out first") and steps[0].endswith("hang is.")


def test_culprits_are_named_never_a_bare_pid() -> None:
    tick = Tick(t=1.0, processes=(process_sample(31, "gloo_rank1", role="worker", rank="1"),))
    assert culprit_labels((31,), [tick], ()) == ("gloo_rank1 [31] worker/1",)
    assert culprit_labels((31,), [Tick(t=0.0, processes=())], ()) == ("[31]",)


def test_an_ancestor_that_started_something_else_is_a_target_for_reading() -> None:
    import subprocess
    import sys

    # A parent (an ancestor of the checking code, as a user's batch script is of hangwatch) that also
    # started a sleeper: readable; the same parent without its sleeper: nothing but us in its tree.
    code = (
        "import os, subprocess, sys\n"
        "from hangwatch.collect.proctree import check_target\n"
        "from hangwatch.errors import UsageError\n"
        "def verdict():\n"
        "    try:\n"
        "        check_target('--pid %d' % os.getppid(), [os.getppid()], others_ok=True)\n"
        "        return 'ok'\n"
        "    except UsageError as e:\n"
        "        return str(e)\n"
        "print(verdict())\n"
    )
    alone = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "ancestor of hangwatch" in alone.stdout, alone
    wrapper = (
        "import subprocess, sys\n"
        "sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"out = subprocess.run([sys.executable, '-c', {code!r}], capture_output=True, text=True)\n"
        "sleeper.kill(); sleeper.wait()\n"
        "print(out.stdout.strip())\n"
    )
    both = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=60)
    assert both.stdout.strip() == "ok", both
