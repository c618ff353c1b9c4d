"""What never came, named from the launcher's own words (issue 23): a torchrun job of two nodes started on
one, its agent waiting in the rendezvous for node rank 1. Real torchrun, real gloo, one machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hwrun import PROGRAMS
from hwrun import assert_all_gone
from proc_helpers import free_port

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
