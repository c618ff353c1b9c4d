"""``hangwatch stacks --slurm-job`` on three emulated nodes: the Slurm stand-ins (tests/fakes/slurm_standin.py)
resolve the job's nodes and start each step inside its node's namespaces, as slurmd would; the job is
the gloo job of test_nodes_ssh.py (rank 3 on hwnode3 skips the all_reduce).

squeue, scontrol and srun are stand-ins here, with the real 22.05 tools' argument and message shapes:
these tests need no Slurm packages. test_nodes_slurm_real.py runs the same job through a real Slurm
cluster on the emulated nodes (docs/multinode.md 6a). What this shows is that the slurm transport's argv,
node list and answers carry the same merged diagnosis as ssh's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hwrun import run_hangwatch
from nodes_emulation import EmulatedNodes
from nodes_emulation import Job
from slurm_standins import calls
from slurm_standins import install

pytestmark = [pytest.mark.timeout(300), pytest.mark.torch, pytest.mark.nodes]


def test_a_slurm_job_is_collected_with_one_srun_overlap_step_over_its_nodes(
    cluster: EmulatedNodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = Job(cluster, "slurm", {1: [0, 1], 2: [2], 3: [3]}, world=4, port=29531, culprit="3")
    try:
        job.wait_blocked()
        log = install(
            tmp_path,
            monkeypatch,
            {"4242": {"nodes": "hwnode[1-3]"}},
            nodes={n.name: n.init_pid for n in cluster.nodes},
        )
        out = run_hangwatch(
            ["stacks", "--slurm-job", "4242", "--match", job.match(), "--remote-hangwatch", str(cluster.hangwatch),
             "--no-native", "--samples", "2", "--every", "1"],
            tmp_path, timeout=120,
        )  # fmt: skip
    finally:
        job.stop()
    report = out.report
    assert report is not None, out.stderr
    assert [(n["host"], n["outcome"]) for n in report["nodes"]] == [
        ("hwnode1", "ok"), ("hwnode2", "ok"), ("hwnode3", "ok"),
    ]  # fmt: skip
    diagnosis = report["diagnosis"]
    assert diagnosis["cause"] == "collective-wait", diagnosis
    (culprit,) = diagnosis["culprits"]
    assert report["processes"][str(culprit)]["node"] == "hwnode3"
    assert "hwnode3:rank3 never entered it" in diagnosis["explanation"]
    # One step over the job's three nodes (--slurm-fanout auto), each task's bundle told apart by --label.
    (step,) = [c for c in calls(log) if c[0] == "srun"]
    assert "--nodelist=hwnode1,hwnode2,hwnode3" in step and "--label" in step, step
    assert "--overlap" in step and step[step.index("--jobid") + 1] == "4242"


def test_attach_across_a_slurm_job_names_the_rank_that_stopped(
    cluster: EmulatedNodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job loops for 12 s on every node, then rank 3 on hwnode3 leaves: one srun step per node."""
    job = Job(
        cluster, "slurmloop", {1: [0, 1], 2: [2], 3: [3]}, world=4, port=29532, culprit="3",
        **{"progress-for": "12"},
    )  # fmt: skip
    try:
        job.wait_ready()
        log = install(
            tmp_path,
            monkeypatch,
            {"4243": {"nodes": "hwnode[1-3]"}},
            nodes={n.name: n.init_pid for n in cluster.nodes},
        )
        out = run_hangwatch(
            ["attach", "--slurm-job", "4243", "--match", job.match(), "--remote-hangwatch", str(cluster.hangwatch),
             "--window", "120", "--stall-after", "20", "--interval", "1", "--quiet"],
            tmp_path, timeout=200,
        )  # fmt: skip
    finally:
        job.stop()
    report = out.report
    assert report is not None, out.stderr
    verdict = report["verdict"]
    assert verdict["state"] == "stalled" and verdict["cause"] == "collective-wait", (verdict, out.stdout)
    assert report["processes"][str(verdict["culprits"][0])]["node"] == "hwnode3"
    assert report["duration_s"] >= 10
    steps = [c for c in calls(log) if c[0] == "srun"]
    assert len(steps) == 3 and all(s[-1] == "--stream" for s in steps), steps
