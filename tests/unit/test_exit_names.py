"""How a member that ended is named (collect/proctree.py), on real processes: by what it was seen as, by
the title its zombie shows, or by what its log lines call it, even when those lines come with its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from hangwatch import engines
from hangwatch.collect.proctree import TreeReading
from hangwatch.collect.proctree import TreeSampler
from proc_helpers import kill_tree
from proc_helpers import wait_until


def test_a_member_reaped_at_once_is_named_by_the_log_line_read_with_its_death() -> None:
    """CI, vllm-tp2-TP1-weights-sigkill-attach: a worker SIGKILLed right after setting its title, reaped at
    once by its parent, was only ever seen as ``python``; its ``(Worker_TP1 pid=N)`` line was read in the
    tick that found it gone, after the tree had recorded its exit."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
         "'import time; time.sleep(60)']); import time; time.sleep(60)"],
        start_new_session=True,
    )  # fmt: skip
    sampler = TreeSampler([parent.pid], engines.by_name("vllm").role_of, watch_deaths=False)
    try:

        def the_child() -> int | None:
            kids = [p.pid for p in sampler.sample(0.0).processes if p.pid != parent.pid]
            return kids[0] if kids else None

        child = wait_until(the_child, 20, interval=0.1, what="the child started")
        os.kill(child, signal.SIGKILL)  # its parent reaps it at once: gone from /proc, status unknown

        def its_end() -> TreeReading | None:
            reading = sampler.sample(1.0)
            return reading if reading.exits else None

        reading = wait_until(its_end, 20, interval=0.1, what="its end seen")
        (gone,) = reading.exits
        assert (gone.pid, gone.rank) == (child, None), gone
        sampler.learn_titles([(child, "VLLM::Worker_TP1")])
        (named,) = sampler.retitle(reading.exits)
        assert (named.name, named.role, named.rank) == ("VLLM::Worker_TP1", "Worker", "TP1"), named
        # A member that ended in an earlier sample is not named again: its exit was handed on already.
        assert sampler.retitle(sampler.sample(2.0).exits) == ()
    finally:
        sampler.close()
        kill_tree(parent)
