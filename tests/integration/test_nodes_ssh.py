"""``hangwatch stacks --hosts`` over real ssh to three emulated nodes running one torchrun-style gloo job.

The nodes are network + PID + UTS namespaces on a bridge, each with its own sshd and hostname
(tests/nodes_emulation.py); the job is tests/programs/gloo_node_job.py, one agent per node starting
that node's ranks with torchrun's environment, the TCPStore on hwnode1. Through the real CLI, the real
ssh client (BatchMode, a test key in a temp dir, an ssh_config with aliases) and the collector on each
node, these check the merged outcome: the cause, the culprit rank and its node, who is missing from
the rendezvous, and that a node that fails (sshd down, sshd stopped, a wrong key) is reported as
that node's evidence while the other nodes are still merged.

Skipped, with the reason, without root, network namespaces, sshd or torch. Every namespace, sshd and
process started here is removed afterwards (descendants first), and checked to be gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from hwrun import Outcome
from hwrun import run_hangwatch
from nodes_emulation import EmulatedNodes
from nodes_emulation import Job
from nodes_emulation import Node
from nodes_emulation import descendants

pytestmark = [pytest.mark.timeout(300), pytest.mark.torch, pytest.mark.nodes]

COLLECTIVE_PORT = 29517
RENDEZVOUS_PORT = 29518


@pytest.fixture(scope="module")
def collective_job(cluster: EmulatedNodes) -> Job:
    """World 4: ranks 0-1 on hwnode1 (with the store), 2 on hwnode2, 3 on hwnode3; rank 3 skips the all_reduce."""
    job = Job(cluster, "coll", {1: [0, 1], 2: [2], 3: [3]}, world=4, port=COLLECTIVE_PORT, culprit="3")
    job.wait_blocked()
    return job


def stacks(cluster: EmulatedNodes, tmp_path: Path, hosts: str, match: str, *extra: str) -> Outcome:
    return run_hangwatch(
        [
            "stacks",
            "--hosts",
            hosts,
            "--match",
            match,
            "--ssh-config",
            str(cluster.ssh_config),
            "--remote-hangwatch",
            str(cluster.hangwatch),
            "--samples",
            "2",
            "--every",
            "1",
            "--no-native",
            *extra,
        ],
        tmp_path,
        timeout=120,
    )


def node_of(report: dict, name: str) -> dict:
    return next(n for n in report["nodes"] if n["label"] == name or n["host"] == name)


def test_rank_that_skips_the_collective_is_named_with_its_node(
    cluster: EmulatedNodes, collective_job: Job, tmp_path: Path
) -> None:
    out = stacks(cluster, tmp_path, "hwnode[1-3]", collective_job.match())
    assert out.rc == 0, out.stderr
    report = out.report
    assert report is not None, out.stderr
    assert [n["outcome"] for n in report["nodes"]] == ["ok", "ok", "ok"], report["nodes"]
    diagnosis = report["diagnosis"]
    assert diagnosis["cause"] == "collective-wait", diagnosis
    # The one culprit is rank 3, and the merge knows it runs on hwnode3 (its pid there, its pid namespace).
    (culprit,) = diagnosis["culprits"]
    where = report["processes"][str(culprit)]
    assert where["node"] == "hwnode3"
    assert where["pid_ns"] == node_of(report, "hwnode3")["pid_ns"] != node_of(report, "hwnode1")["pid_ns"]
    assert "hwnode3:rank3 never entered it" in diagnosis["explanation"]
    assert "rank_busy_elsewhere" in diagnosis["explanation"]
    # The waiting ranks run on across their nodes' host list (the census says which rank is where).
    assert diagnosis["explanation"].startswith("hwnode[1-2]:rank0-2 waiting in all_reduce"), diagnosis
    # Every rank of the world checked in, each on the node that runs it; the text says the same.
    ranks = report["ranks"]
    assert ranks["world_size"] == 4 and ranks["missing"] == []
    assert {(r["rank"], r["node"]) for r in ranks["found"]} == {
        (0, "hwnode1"),
        (1, "hwnode1"),
        (2, "hwnode2"),
        (3, "hwnode3"),
    }
    assert f"culprits: pid {where['pid']} on hwnode3" in out.stdout
    # Clocks: one machine, so the skew is about 0, and bounded by the exchange.
    for node in report["nodes"]:
        assert abs(node["skew"]["offset_s"]) <= node["skew"]["bound_s"] + 0.05, node


def test_rank_that_never_joins_the_rendezvous_is_missing(cluster: EmulatedNodes, tmp_path: Path) -> None:
    """World 4, but hwnode3 starts only rank 2 of its ranks 2-3: the others block in the rendezvous."""
    job = Job(cluster, "rdzv", {1: [0], 2: [1], 3: [2]}, world=4, port=RENDEZVOUS_PORT)
    try:
        job.wait_blocked()
        out = stacks(cluster, tmp_path, "hwnode1,hwnode2,hwnode3", job.match())
    finally:
        for agent in job.agents:
            _stop(cluster, agent)
    report = out.report
    assert report is not None, out.stderr
    assert report["diagnosis"]["cause"] == "rendezvous-wait", report["diagnosis"]
    assert report["ranks"]["world_size"] == 4
    assert report["ranks"]["missing"] == [3]
    assert "world size 4; 3 checked in: rank0 on hwnode1; rank1 on hwnode2; rank2 on hwnode3" in out.stdout
    assert "missing: rank3 (not found on any node)" in out.stdout


def test_failing_nodes_are_evidence_and_the_rest_is_merged(
    cluster: EmulatedNodes, collective_job: Job, tmp_path: Path
) -> None:
    """hwnode2's sshd is stopped (SIGSTOP: it accepts, never answers), hwnode3's is down, hwnode1 answers."""
    node2, node3 = cluster.nodes[1], cluster.nodes[2]
    assert node2.sshd is not None
    sshd2 = _sshd_pid(node2)
    os.kill(sshd2, signal.SIGSTOP)
    cluster.stop_sshd(node3)
    try:
        out = stacks(cluster, tmp_path, "hwnode[1-3]", collective_job.match(), "--node-timeout", "6")
    finally:
        os.kill(sshd2, signal.SIGCONT)
        cluster.start_sshd(node3)
    report = out.report
    assert report is not None, out.stderr
    assert out.rc == 0
    outcomes = {n["label"]: n["outcome"] for n in report["nodes"]}
    assert outcomes == {"hwnode1": "ok", "hwnode2": "timeout", "hwnode3": "refused"}, report["nodes"]
    assert "hwnode3: no bundle (refused) after" in out.stdout
    assert "nothing listens for ssh there" in out.stdout
    assert "hwnode2: no bundle (timeout) after" in out.stdout
    # hwnode1's two ranks are still analysed, and the ranks on the silent nodes are said to be maybe there.
    assert {(r["rank"], r["node"]) for r in report["ranks"]["found"]} == {(0, "hwnode1"), (1, "hwnode1")}
    assert report["ranks"]["missing"] == [2, 3]
    assert "hwnode2, hwnode3 did not answer and may hold them" in out.stdout
    assert report["diagnosis"]["cause"] == "collective-wait"
    assert "WORLD_SIZE=4 but 2 ranks here" in report["diagnosis"]["explanation"]


def test_a_wrong_key_fails_that_node_only(
    cluster: EmulatedNodes, collective_job: Job, tmp_path: Path
) -> None:
    out = stacks(cluster, tmp_path, "hwnode1,hwnode2-wrongkey,hwnode3", collective_job.match())
    report = out.report
    assert report is not None, out.stderr
    outcomes = [(n["host"], n["outcome"]) for n in report["nodes"]]
    assert outcomes == [("hwnode1", "ok"), ("hwnode2-wrongkey", "auth"), ("hwnode3", "ok")]
    assert "Permission denied (publickey)" in node_of(report, "hwnode2-wrongkey")["detail"]
    # The culprit on hwnode3 is still found across the two nodes that answered.
    assert report["diagnosis"]["cause"] == "collective-wait"
    assert "hwnode3:rank3 never entered it" in report["diagnosis"]["explanation"]
    assert report["ranks"]["missing"] == [2]


def _sshd_pid(node: Node) -> int:
    """The listening sshd (nsenter's child), as this machine sees it."""
    assert node.sshd is not None
    (pid,) = [p for p in descendants(node.sshd.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "sshd"][
        :1
    ]
    return pid


def _stop(cluster: EmulatedNodes, proc: subprocess.Popen) -> None:
    from proc_helpers import kill_tree

    kill_tree(proc)
    cluster.started.remove(proc)


@pytest.mark.parametrize(
    ("remote", "outcome", "said"),
    [
        ("/nonexistent/bin/hangwatch", "no-collector", "hangwatch was not found on the node"),
        ("echo", "bad-output", "not a node bundle: not JSON"),  # prints its arguments: not a bundle
    ],
)
def test_a_node_without_a_working_collector_is_evidence(
    cluster: EmulatedNodes, tmp_path: Path, remote: str, outcome: str, said: str
) -> None:
    out = run_hangwatch(
        [
            "stacks",
            "--hosts",
            "hwnode1",
            "--match",
            "any",
            "--ssh-config",
            str(cluster.ssh_config),
            "--remote-hangwatch",
            remote,
        ],
        tmp_path,
        timeout=60,
    )
    assert out.rc == 1, out.stderr  # no node answered with a bundle
    assert out.report is not None
    (node,) = out.report["nodes"]
    assert node["outcome"] == outcome and said in node["detail"], node
    assert f"hwnode1: no bundle ({outcome})" in out.stdout
