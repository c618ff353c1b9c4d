"""Slow but moving programs under ``hangwatch run``: never called stalled, and never killed for it.

Written before the rules they test (issue 23), on shapes no rule was written for: silent CPU work whose
loops the stacks catch in a few lines (``work_loops.py``: a loop of helpers, a sort inside C, a pure
Python arithmetic loop, hashing, JSON, threads, spawn children), and a rank polling for a file lock that
a live process outside the tree holds (``lock_file_poll.py``). Each runs past the stall window; each
must end with the program's own end (``work done``: ready; the lock job: exited 0).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import side_by_side
from hwrun import Outcome
from hwrun import assert_all_gone
from hwrun import program
from hwrun import run_hangwatch
from proc_helpers import spawn
from proc_helpers import wait_for_file

pytestmark = pytest.mark.timeout(180)

WINDOW = "8"  # the work lasts 22 s: almost three windows of silence but for CPU


def _run_shape(shape: str, folder: Path) -> Outcome:
    return run_hangwatch(
        [
            "run", "--until-ready", "--quiet", "--no-doctor", "--stall-after", WINDOW,
            "--ready-pattern", "^work done$",
            "--", *program("work_loops", "--shape", shape, "--seconds", "22"),
        ],
        folder,
        env=side_by_side.own_state(folder),
    )  # fmt: skip


@pytest.fixture(scope="module")
def shape_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Outcome | Exception]:
    """Every selected shape's run, all at once: one after another they cost 7 x 24 s. Side by side on the
    2-core machine each shape's work gets a fraction of a core and its watcher ticks later, which only makes
    "never stalled" harder to earn, not easier; each shape is still its own run and test."""
    shapes = side_by_side.selected(request, "test_silent_cpu_work_of_any_shape_is_never_stalled", "shape")
    return side_by_side.run_family(tmp_path_factory, shapes, _run_shape)


@pytest.mark.parametrize("shape", ["cycle", "sort", "arith", "hash", "json", "threads", "children"])
def test_silent_cpu_work_of_any_shape_is_never_stalled(shape_runs, shape):
    out = side_by_side.outcome(shape_runs, shape)
    v = out.verdict
    # Ready at its "work done" line, or the exit right after it read in the same tick: never stalled.
    assert v["state"] in ("ready", "exited"), v
    assert out.rc == 0
    assert out.report["duration_s"] >= 21
    assert_all_gone(out.report)


@pytest.mark.torch
def test_a_rank_polling_for_a_lock_a_live_process_outside_holds_is_not_stalled(hw, tmp_path):
    lock = tmp_path / "build.lock"
    ready = tmp_path / "holding"
    holder_argv = program(
        "lock_file_poll", "--hold", str(lock), "--seconds", "35", "--ready-file", str(ready)
    )
    with spawn(holder_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as holder:
        wait_for_file(ready, 30, holder)
        out = hw(
            "run", "--quiet", "--no-doctor", "--stall-after", "120", "--",
            *program("lock_file_poll", "--lock", str(lock)),
            timeout=150,
        )  # fmt: skip
        # The holder, outside the tree, ended by itself when its time was up: never signalled.
        assert holder.wait(timeout=30) == 0
    v = out.verdict
    # The job went on once the lock came free (35 s): the poll was never "a wait nothing can end".
    assert v["state"] == "exited", v
    assert out.rc == 0
    assert out.report["duration_s"] >= 30
