"""How a member that ended is named (collect/proctree.py), on real processes: by what it was seen as, by
the title its zombie shows, or by what its log lines call it, even when those lines come with its end
(the analysis names those: analyse/logscan.named_exits)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import replace

from hangwatch import engines
from hangwatch.analyse.logscan import named_exits
from hangwatch.collect.proctree import TreeReading
from hangwatch.collect.proctree import TreeSampler
from hangwatch.model.samples import ExitHow
from hangwatch.supervise.launcher import Reaper
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
    vllm = engines.by_name("vllm")
    sampler = TreeSampler([parent.pid], vllm.role_of, watch_deaths=False)
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
        assert gone.untitled, gone  # only ever seen as its comm
        # The analysis reads the line that came with its death and names the exit by it.
        (named,) = named_exits(reading.exits, {child: "VLLM::Worker_TP1"}, vllm.role_of, {parent.pid})
        assert (named.name, named.role, named.rank) == ("VLLM::Worker_TP1", "Worker", "TP1"), named
        # A member that set a title of its own keeps it, whatever a line calls it.
        titled = replace(gone, name="VLLM::EngineCore", role="EngineCore", untitled=False)
        assert named_exits((titled,), {child: "VLLM::Worker_TP1"}, vllm.role_of, set()) == (titled,)
        # The tree's next samples name it by the title learnt (a member that ended is not handed on again).
        sampler.learn_titles([(child, "VLLM::Worker_TP1")])
        assert sampler.sample(2.0).exits == ()
    finally:
        sampler.close()
        kill_tree(parent)


def test_a_zombie_recorded_then_reaped_by_us_ends_once() -> None:
    """sglang-tp2-TP1-serving-sigkill-run (full matrix, 2026-12-04): TP1's zombie was recorded while its
    launcher held it; when the launcher was killed, TP1 was re-parented to us (the subreaper) and our
    waitpid recorded its end a second time: one SIGKILL read as a tear-down of two processes. Here the
    zombie is our own child, which our waitpid may reap only from the sample after its zombie was seen."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], start_new_session=True)
    armed = False
    reaper = Reaper()  # run's own waitpid, held back until the zombie has been seen

    def reap_ours(pids: Iterable[int]) -> dict[int, int]:
        return reaper(pids) if armed else {}

    sampler = TreeSampler([child.pid], engines.by_name("vllm").role_of, reap=reap_ours, watch_deaths=False)
    try:

        def its_zombie() -> TreeReading | None:
            reading = sampler.sample(0.0)
            return reading if reading.exits else None

        first = wait_until(its_zombie, 20, interval=0.1, what="the child's zombie seen")
        (ended,) = first.exits
        assert (ended.pid, ended.exit_code, ended.how) == (child.pid, 3, ExitHow.ZOMBIE_STAT), ended
        armed = True
        assert sampler.sample(1.0).exits == ()  # reaped now, recorded before
        assert reaper.status_of(child.pid) is not None, "our waitpid did not reap it"
    finally:
        sampler.close()
        kill_tree(child)
