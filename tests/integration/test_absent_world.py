"""Where a wait ends outside the tree, named (issue 23): what never came, from the launcher's own words (a
torchrun job of two nodes started on one, its agent waiting in the rendezvous for node rank 1), and the
holder of a file lock a rank keeps trying (a process outside the tree, named by its command and left
alone). Real torchrun, real gloo, real flock, one machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hwrun import PROGRAMS
from hwrun import assert_all_gone
from hwrun import program
from proc_helpers import free_port
from proc_helpers import proc_state
from proc_helpers import spawn
from proc_helpers import wait_for_file

pytestmark = [pytest.mark.timeout(180), pytest.mark.torch]


def test_a_node_that_never_started_is_named_with_its_ranks_and_where_it_was_to_meet(hw):
    port = free_port()
    torchrun = Path(sys.executable).with_name("torchrun")
    out = hw(
        "run", "--quiet", "--no-doctor", "--stall-after", "12", "--",
        str(torchrun), "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "0",
        "--master-addr", "127.0.0.1", "--master-port", str(port), str(PROGRAMS / "torchrun_job.py"),
    )  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("stalled", "rendezvous-wait"), v
    assert "node rank 1 (ranks 2-3 of 4) never joined" in v["summary"], v["summary"]
    assert f"127.0.0.1:{port}" in v["summary"]
    # The store's port is the rendezvous waiting, not a healthy idle server.
    assert "idle server" not in v["summary"]
    assert v["decided_by"][:2] == ["stalled:window", "stacks:rendezvous-wait"]
    assert_all_gone(out.report)


def test_a_lock_held_outside_the_tree_is_named_with_its_holder_and_left_alone(hw, tmp_path):
    lock = tmp_path / "cache.lock"
    ready = tmp_path / "holding"
    holder_argv = program("lock_file_poll", "--hold", str(lock), "--ready-file", str(ready))
    with spawn(holder_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as holder:
        wait_for_file(ready, 30, holder)
        out = hw(
            "run", "--quiet", "--no-doctor", "--stall-after", "15", "--",
            *program("lock_file_poll", "--lock", str(lock)),
        )  # fmt: skip
        # Named, never touched: the holder outside the tree still runs, not stopped.
        assert holder.poll() is None
        assert proc_state(holder.pid) not in ("T", "t", "Z")
    v = out.verdict
    assert (v["state"], v["cause"]) == ("stalled", "collective-wait"), v
    poller = next(p["pid"] for p in out.report["processes"] if p["name"] == "gloo_rank1")
    assert v["culprits"] == [poller, holder.pid], v
    assert f"keeps trying the lock on {lock}, held by [{holder.pid}]" in v["summary"], v["summary"]
    assert "outside the tree" in v["summary"] and "--hold" in v["summary"]
    assert "stall:lock-held-elsewhere" in v["decided_by"]
    assert any("flock lock is the holder's" in s for s in v["next_steps"]), v["next_steps"]
    # A lock another build may let go any moment is no wait nothing can end: the whole window ran.
    assert out.report["duration_s"] >= 15
    assert_all_gone(out.report)
