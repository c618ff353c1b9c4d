"""One emulated node under two names, beside two other nodes of the same kernel, over real ssh.

``--hosts hwnode1,ADDRESS_OF_HWNODE1,hwnode2,hwnode3``: the alias and the address reach the same sshd,
so both collectors answer with the same boot id, pid namespace and selection, and must be read once
(the first name kept, the other said in a note). hwnode2 and hwnode3 run on the same kernel (the same
boot id, as containers of one host do) but each in a pid namespace of its own: they stay nodes of
their own. The job's cause and culprit must be the job's, not two captures' pauses of one rank seen as
a ``stopped`` process, and no rank may be found twice.

Skipped, with the reason, without root, network namespaces, sshd or torch (the cluster fixture in
conftest.py). Each job's processes are stopped by the test that started them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hwrun import Outcome
from hwrun import run_hangwatch
from nodes_emulation import EmulatedNodes
from nodes_emulation import Job

pytestmark = [pytest.mark.timeout(300), pytest.mark.torch, pytest.mark.nodes]

STACKS_PORT = 29561
ATTACH_PORT = 29562


def _hosts(cluster: EmulatedNodes) -> str:
    return f"hwnode1,{cluster.nodes[0].address},hwnode2,hwnode3"


def _note(cluster: EmulatedNodes) -> str:
    return f"{cluster.nodes[0].address} is the same machine as hwnode1 (same boot id and pid namespace)"


def _hangwatch(cluster: EmulatedNodes, tmp_path: Path, *args: str) -> Outcome:
    common = ["--ssh-config", str(cluster.ssh_config), "--remote-hangwatch", str(cluster.hangwatch)]
    return run_hangwatch([*args, *common], tmp_path, timeout=200)


def test_stacks_read_a_node_named_twice_once_and_the_other_nodes_of_the_kernel_each(
    cluster: EmulatedNodes, tmp_path: Path
) -> None:
    job = Job(cluster, "twice", {1: [0, 1], 2: [2], 3: [3]}, world=4, port=STACKS_PORT, culprit="3")
    try:
        job.wait_blocked()
        out = _hangwatch(
            cluster, tmp_path, "stacks", "--hosts", _hosts(cluster), "--match", job.match(),
            "--samples", "2", "--every", "1", "--no-native",
        )  # fmt: skip
    finally:
        job.stop()
    report = out.report
    assert report is not None, out.stderr
    assert [n["host"] for n in report["nodes"]] == ["hwnode1", "hwnode2", "hwnode3"], report["nodes"]
    assert len({n["pid_ns"] for n in report["nodes"]}) == 3  # one kernel, three pid namespaces
    (note,) = report["notes"]
    assert note.startswith(_note(cluster)) and "collected once" in note, note
    assert f"  note: {note}" in out.stdout and "hangwatch stacks across 3 nodes (" in out.stdout
    ranks = report["ranks"]
    assert ranks["duplicated"] == [] and sorted(r["rank"] for r in ranks["found"]) == [0, 1, 2, 3], ranks
    diagnosis = report["diagnosis"]
    assert diagnosis["cause"] == "collective-wait", (diagnosis, out.stdout)
    (culprit,) = diagnosis["culprits"]
    assert report["processes"][str(culprit)]["node"] == "hwnode3"


def test_attach_watches_a_node_named_twice_once_and_says_the_cause(
    cluster: EmulatedNodes, tmp_path: Path
) -> None:
    """Every rank loops over an all_reduce for 12 s, then rank 3 on hwnode3 leaves the loop."""
    job = Job(
        cluster, "twiceloop", {1: [0, 1], 2: [2], 3: [3]}, world=4, port=ATTACH_PORT, culprit="3",
        **{"progress-for": "12"},
    )  # fmt: skip
    try:
        job.wait_ready()
        out = _hangwatch(
            cluster, tmp_path, "attach", "--hosts", _hosts(cluster), "--match", job.match(),
            "--window", "120", "--stall-after", "20", "--interval", "1", "--quiet",
        )  # fmt: skip
    finally:
        job.stop()
    report = out.report
    assert report is not None, out.stderr
    verdict = report["verdict"]
    assert verdict["state"] == "stalled" and verdict["cause"] == "collective-wait", (verdict, out.stdout)
    (culprit,) = verdict["culprits"]
    assert report["processes"][str(culprit)]["node"] == "hwnode3"
    assert {k["node"] for k in report["processes"].values()} == {"hwnode1", "hwnode2", "hwnode3"}
    assert [n["label"] for n in report["nodes"]] == ["hwnode1", "hwnode2", "hwnode3"], report["nodes"]
    assert all(n["rounds_failed"] == 0 for n in report["nodes"]), report["nodes"]
    assert report["notes"] == [f"{_note(cluster)}: watched once"]
    address = cluster.nodes[0].address
    assert not [e for e in verdict["evidence"] if address in e], verdict["evidence"]
    assert "hangwatch attach across 3 nodes (" in out.stdout
    assert "\nhangwatch verdict: STALLED (cause: collective-wait, high confidence)\n" in out.stdout
