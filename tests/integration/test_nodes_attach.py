"""``hangwatch attach --hosts`` over real ssh to three emulated nodes running one gloo job that progresses,
then hangs: every rank loops over an all_reduce for a while, then rank 3 on hwnode3 stops joining it.

Through the real CLI, the real ssh client and the collector on each node: the watch must not call the
job stalled while it progresses on the nodes (progress on any node is progress of the job), and once
it hangs must give one verdict for the job: stalled, the cause from the stacks taken across nodes, the
culprit mapped to hwnode3 and its own pid there. A node whose sshd dies mid-watch is evidence in the
verdict, and the verdict is still given.

Skipped, with the reason, without root, network namespaces, sshd or torch (the cluster fixture in
conftest.py). Each job's processes are stopped by the test that started them.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hwrun import Outcome
from hwrun import run_hangwatch
from nodes_emulation import EmulatedNodes
from nodes_emulation import Job

pytestmark = [pytest.mark.timeout(300), pytest.mark.torch, pytest.mark.nodes]

PROGRESS_FOR_S = 12.0
STALL_AFTER_S = 20.0


def attach(cluster: EmulatedNodes, tmp_path: Path, match: str, *extra: str) -> Outcome:
    return run_hangwatch(
        [
            "attach",
            "--hosts",
            "hwnode[1-3]",
            "--match",
            match,
            "--ssh-config",
            str(cluster.ssh_config),
            "--remote-hangwatch",
            str(cluster.hangwatch),
            "--window",
            "120",
            "--stall-after",
            f"{STALL_AFTER_S:g}",
            "--interval",
            "1",
            "--quiet",
            *extra,
        ],
        tmp_path,
        timeout=200,
    )


def progressing_job(cluster: EmulatedNodes, name: str, port: int) -> Job:
    job = Job(
        cluster,
        name,
        {1: [0, 1], 2: [2], 3: [3]},
        world=4,
        port=port,
        culprit="3",
        **{"progress-for": f"{PROGRESS_FOR_S:g}"},
    )
    job.wait_ready()
    return job


def test_a_job_that_progresses_then_loses_a_rank_is_stalled_naming_that_rank_and_node(
    cluster: EmulatedNodes, tmp_path: Path
) -> None:
    job = progressing_job(cluster, "loop", 29521)
    started = time.monotonic()
    try:
        out = attach(cluster, tmp_path, job.match())
    finally:
        job.stop()
    report = out.report
    assert report is not None, out.stderr
    assert report["schema"] == "hangwatch.attach-nodes/1"
    verdict = report["verdict"]
    assert verdict["state"] == "stalled", (verdict, out.stdout)
    assert out.rc != 0
    # It progressed for PROGRESS_FOR_S on every node: no stall was called before that, plus the window.
    assert time.monotonic() - started >= PROGRESS_FOR_S
    assert report["duration_s"] >= PROGRESS_FOR_S - 2
    assert verdict["cause"] == "collective-wait", (verdict, out.stdout)
    (culprit,) = verdict["culprits"]
    where = report["processes"][str(culprit)]
    assert where["node"] == "hwnode3", where
    assert "hwnode3:rank3" in verdict["summary"]
    assert f"culprits: pid {where['pid']} on hwnode3" in out.stdout
    assert all(n["rounds_failed"] == 0 for n in report["nodes"]), report["nodes"]
    assert report["cost"]["rounds"] >= 5 and report["cost"]["stack_rounds"] >= 1
    # Each node's log (the agents' stdout, a file) is followed: the culprit's last words, with its node.
    assert any(line.startswith("hwnode3: [rank 3] leaves the loop after") for line in report["log_tail"]), (
        report["log_tail"]
    )
    assert "last lines of the nodes' logs:" in out.stdout


def test_a_node_whose_sshd_dies_mid_watch_is_evidence_and_the_verdict_is_still_given(
    cluster: EmulatedNodes, tmp_path: Path
) -> None:
    job = progressing_job(cluster, "loss", 29522)
    node2 = cluster.nodes[1]
    # hwnode2's sshd dies while the job still progresses; its rank keeps running, unseen.
    timer = threading.Timer(PROGRESS_FOR_S / 2, cluster.stop_sshd, args=(node2,))
    timer.start()
    try:
        out = attach(cluster, tmp_path, job.match())
    finally:
        timer.cancel()
        timer.join()
        job.stop()
        if node2.sshd is None:
            cluster.start_sshd(node2)
    report = out.report
    assert report is not None, out.stderr
    verdict = report["verdict"]
    assert verdict["state"] == "stalled", (verdict, out.stdout)
    nodes = {n["label"]: n for n in report["nodes"]}
    assert nodes["hwnode2"]["last_outcome"] == "refused", nodes["hwnode2"]
    assert nodes["hwnode2"]["silent_since_s"] is not None and nodes["hwnode2"]["rounds_answered"] >= 1
    assert nodes["hwnode1"]["rounds_failed"] == 0 and nodes["hwnode3"]["rounds_failed"] == 0
    assert verdict["evidence"][0].startswith("hwnode2 stopped answering at "), verdict["evidence"]
    assert "hwnode2 stopped answering" in out.stdout and "silent since" in out.stdout
    # The culprit is still found across the two nodes that answer.
    assert verdict["cause"] == "collective-wait", (verdict, out.stdout)
    assert report["processes"][str(verdict["culprits"][0])]["node"] == "hwnode3"
