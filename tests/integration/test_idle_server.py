"""An idle server with no readiness rule is ready, not stalled (issue 24, item 5), and a hung job that
listens on a port is still a stall: real servers on 127.0.0.1 (tests/programs/idle_server.py), a real
torchrun job hung in a gloo collective while its agent's store listens (tests/programs/torchrun_hang.py),
and a gloo job hung the same way under multiprocessing (tests/programs/gloo_missing_collective.py).

Nothing here sends traffic anywhere but loopback; every tree is stopped (descendants first) and checked
gone.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import side_by_side
from hwrun import PROGRAMS
from hwrun import Outcome
from hwrun import assert_all_gone
from hwrun import program
from hwrun import run_hangwatch
from proc_helpers import free_port
from proc_helpers import spawn
from proc_helpers import wait_for_file

pytestmark = pytest.mark.timeout(180)


def _idle_server(kind: str, folder: Path) -> tuple[int, Outcome]:
    port = free_port()
    return port, run_hangwatch(
        ["run", "--quiet", "--no-doctor", "--until-ready", "--stall-after", "10", "--",
         *program("idle_server", "--kind", kind, "--port", str(port))],
        folder,
        env=side_by_side.own_state(folder),
    )  # fmt: skip


@pytest.fixture(scope="module")
def idle_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[int, Outcome] | Exception]:
    """The idle servers side by side: each is watched until it is called ready, about 12 s, the same for
    every kind; idle, they load the machine no more together than alone."""
    kinds = side_by_side.selected(
        request, "test_an_idle_server_with_no_readiness_rule_is_ready_not_stalled", "kind"
    )
    return side_by_side.run_family(tmp_path_factory, kinds, _idle_server)


@pytest.mark.parametrize("kind", ["http", "asyncio", "accept", "workers"])
def test_an_idle_server_with_no_readiness_rule_is_ready_not_stalled(idle_servers, kind):
    port, out = side_by_side.outcome(idle_servers, kind)
    v = out.verdict
    assert (v["state"], v["cause"]) == ("ready", "idle"), v
    assert v["decided_by"][:2] == ["ready:idle-server", "stacks:idle-server"], v
    assert f"listens on port {port} and waits for input" in v["summary"], v["summary"]
    assert out.rc == 0
    assert_all_gone(out.report)


def test_attach_leaves_an_idle_server_running_and_calls_it_ready(hw, tmp_path):
    port = free_port()
    ready = tmp_path / "ready"
    argv = program("idle_server", "--kind", "http", "--port", str(port), "--ready-file", str(ready))
    with spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as server:
        wait_for_file(ready, 30, server)
        out = hw("attach", "--pid", str(server.pid), "--window", "20", "--stall-after", "8", "--quiet")
        assert server.poll() is None  # read-only, and no stall to report
        # Still serving, on loopback: the reading was right.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
            assert answer.status == 200
    v = out.verdict
    assert v["state"] == "ready" and out.rc == 0, v
    assert v["decided_by"] == ["ready:end-of-window"], v


@pytest.mark.torch
def test_a_torchrun_job_hung_in_a_collective_is_stalled_though_its_store_listens(hw, tmp_path):
    port = free_port()
    torchrun = Path(sys.executable).with_name("torchrun")
    out = hw(
        "run", "--quiet", "--no-doctor", "--stall-after", "20", "--",
        str(torchrun), "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(port), str(PROGRAMS / "torchrun_hang.py"), "--ready-dir", str(tmp_path),
    )  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("stalled", "collective-wait"), v
    assert "stacks:idle-server" not in v["decided_by"], v
    # The store's port was there to be taken for a server's, and was not.
    assert any(e.startswith("listening on") and str(port) in e for e in v["evidence"]), v["evidence"]
    assert "idle" not in v["summary"], v["summary"]
    assert_all_gone(out.report)


def _gloo_job(waiters: str, folder: Path) -> Outcome:
    return run_hangwatch(
        ["run", "--quiet", "--no-doctor", "--stall-after", "20", "--",
         *program("gloo_missing_collective", "--waiters-in", waiters, "--ready-file", str(folder / "r"))],
        folder,
        env=side_by_side.own_state(folder),
    )  # fmt: skip


@pytest.fixture(scope="module")
def gloo_jobs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Outcome | Exception]:
    """Both gloo jobs side by side: each waits out the same 20 s window, its ranks asleep in a wait."""
    pytest.importorskip(
        "torch.distributed", reason="the gloo programs need torch (pip install torch==2.13.0)"
    )
    waiters = side_by_side.selected(request, "test_a_gloo_job_hanging_is_stalled_not_idle", "waiters")
    return side_by_side.run_family(tmp_path_factory, waiters, _gloo_job)


@pytest.mark.torch
@pytest.mark.parametrize("waiters", ["all_reduce", "store"])
def test_a_gloo_job_hanging_is_stalled_not_idle(gloo_jobs, waiters):
    out = side_by_side.outcome(gloo_jobs, waiters)
    v = out.verdict
    assert v["state"] == "stalled" and v["cause"] in ("collective-wait", "rendezvous-wait"), v
    assert "stacks:idle-server" not in v["decided_by"] and "idle" not in v["summary"], v
    assert any(e.startswith("listening on") for e in v["evidence"]), v["evidence"]
    assert_all_gone(out.report)


@pytest.mark.torch
def test_a_torchrun_desync_is_said_by_the_flight_recorder_run_turned_on(hw, tmp_path):
    """run turns torch's Flight Recorder on for the tree (its variables, in the run folder); at the stall it
    reads the ranks' dumps: ranks 0-1 wait in the fourth all-reduce, rank 2 enqueued only three. Gloo has
    no dump pipe (NCCL's, validated on an H100: docs/gpu-validation.md), so the ranks dump their recorder
    themselves (--self-dump-after), the pickle torch writes for NCCL's pipe."""
    port = free_port()
    torchrun = Path(sys.executable).with_name("torchrun")
    out = hw(
        "run", "--quiet", "--no-doctor", "--stall-after", "12", "--",
        str(torchrun), "--nnodes", "1", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
        "--master-port", str(port), str(PROGRAMS / "torchrun_hang.py"), "--ready-dir", str(tmp_path),
        "--steps", "3", "--self-dump-after", "3",
    )  # fmt: skip
    v = out.verdict
    assert (v["state"], v["cause"]) == ("stalled", "collective-wait"), v
    said = "Flight Recorder, group 0: ranks 0-1 wait in seq 4 (gloo:all_reduce); rank 2 never reached it"
    assert said in v["summary"] and "stall:flight-recorder" in v["decided_by"], v
    fr = out.report["flight_recorder"]
    assert len(fr["dumps"]) == 3 and fr["triggered"] == 0, fr  # no pipe: gloo
    assert_all_gone(out.report)
