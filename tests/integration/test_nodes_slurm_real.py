"""``hangwatch stacks|attach --slurm-job`` against a real Slurm (Debian's slurm-wlm 22.05, munge) on three
emulated nodes: slurmctld on hwnode1, one slurmd per node (tests/slurm_cluster.py), the gloo job submitted
with ``sbatch`` and started on the nodes by ``srun`` (one task per node, each an agent starting that node's
ranks, as ``srun torchrun ...`` does), and hangwatch's own steps through the real ``srun --jobid J
--overlap``, ``squeue`` and ``scontrol``. test_nodes_slurm.py runs the same job through the stand-ins.

Skipped with the reason where Slurm's packages are not installed (``make slurm-deps`` installs them).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangwatch.model.nodes import NodeOutcome
from hangwatch.nodes.gather import gather_slurm
from hangwatch.transports.slurm import SlurmError
from hangwatch.transports.slurm import SlurmOptions
from hangwatch.transports.slurm import job_node_list
from hwrun import run_hangwatch
from nodes_emulation import PROGRAMS
from nodes_emulation import TORCH_START_S
from nodes_emulation import EmulatedNodes
from proc_helpers import wait_until
from slurm_cluster import SlurmCluster
from slurm_cluster import slurm_skip_reason

pytestmark = [pytest.mark.timeout(300), pytest.mark.torch, pytest.mark.nodes, pytest.mark.slurm]

# SLURM_NODEID -> that node's global ranks: two on hwnode1, one on each of the others (world 4).
LAYOUT = {0: "0,1", 1: "2", 2: "3"}


@pytest.fixture(scope="module")
def slurm(cluster: EmulatedNodes) -> Iterator[SlurmCluster]:
    reason = slurm_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    started = time.monotonic()
    real = SlurmCluster(cluster).start()
    real.timings["start_s"] = time.monotonic() - started
    print(f"slurm cluster up: {real.timings}")
    try:
        yield real
    finally:
        real.close()
    assert real.leftovers() == []


@pytest.fixture
def env(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """hangwatch's squeue/scontrol/srun find this cluster (and only through SLURM_CONF)."""
    for key, value in slurm.env.items():
        monkeypatch.setenv(key, value)
    return slurm


def gloo_job(slurm: SlurmCluster, name: str, port: int, **extra: str) -> tuple[str, Path]:
    """The gloo job of test_nodes_ssh.py as a batch job on hwnode[1-3]: one srun task per node; the job
    id and the directory its ranks announce themselves in."""
    ready = slurm.dir / f"ready-{name}"
    ready.mkdir()
    master = slurm.nodes.nodes[0].address
    args = [
        sys.executable, str(PROGRAMS / "gloo_node_job.py"), "--job", name, "--world-size", "4",
        "--master-addr", master, "--master-port", str(port), "--ready-dir", str(ready),
    ]  # fmt: skip
    for key, value in extra.items():
        args += [f"--{key}", value]
    cases = " ".join(f"{k}) r={v};;" for k, v in LAYOUT.items())
    task = f"case $SLURM_NODEID in {cases} esac; exec {shlex.join(args)} --ranks $r --node-rank $SLURM_NODEID"
    script = f"#!/bin/sh\nsrun sh -c {shlex.quote(task)}\n"
    names = ",".join(n.name for n in slurm.nodes.nodes)
    job = slurm.submit(
        script, "-N3", "--ntasks-per-node=1", "-w", names, GLOO_SOCKET_IFNAME="eth0", PYTHONUNBUFFERED="1"
    )
    return job, ready


def wait_ranks(ready: Path) -> None:
    for rank in range(4):
        target = ready / f"rank{rank}"
        wait_until(target.exists, TORCH_START_S, interval=0.2, what=f"rank {rank} ready")


def test_a_real_slurm_job_is_collected_with_srun_overlap_on_each_of_its_nodes(
    env: SlurmCluster, tmp_path: Path
) -> None:
    job, ready = gloo_job(env, "slurmreal", 29541, culprit="3")
    try:
        wait_ranks(ready)
        time.sleep(1)  # each rank wrote its file just before its blocking call
        assert job_node_list(SlurmOptions(job)) == "hwnode[1-3]"
        out = run_hangwatch(
            ["stacks", "--slurm-job", job, "--match", "gloo_node_job.py --job slurmreal ",
             "--remote-hangwatch", str(env.nodes.hangwatch), "--no-native", "--samples", "2", "--every", "1"],
            tmp_path, timeout=120,
        )  # fmt: skip
        steps = env.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split()
    finally:
        env.cancel(job)
    report = out.report
    assert report is not None, out.stderr
    assert [(n["host"], n["outcome"]) for n in report["nodes"]] == [
        ("hwnode1", "ok"), ("hwnode2", "ok"), ("hwnode3", "ok"),
    ], out.stdout  # fmt: skip
    # srun's tasks are the agents (SLURM_PROCID 0-2) and the batch script's srun has SLURM_PROCID 0 too:
    # none of them is a rank; the workers' RANK are the job's four ranks, each once.
    ranks = report["ranks"]
    assert [(r["rank"], r["node"]) for r in ranks["found"]] == [
        (0, "hwnode1"), (1, "hwnode1"), (2, "hwnode2"), (3, "hwnode3"),
    ], out.stdout  # fmt: skip
    assert ranks["duplicated"] == [] and ranks["missing"] == []
    diagnosis = report["diagnosis"]
    assert diagnosis["cause"] == "collective-wait", (diagnosis, out.stdout)
    (culprit,) = diagnosis["culprits"]
    assert report["processes"][str(culprit)]["node"] == "hwnode3"
    assert "hwnode3:rank3 never entered it" in diagnosis["explanation"]
    # The job's own step and batch step only: hangwatch's steps ended with their collectors.
    assert sorted(steps) == [f"{job}.0", f"{job}.batch"], steps


def test_attach_across_a_real_slurm_job_names_the_rank_that_stopped(
    env: SlurmCluster, tmp_path: Path
) -> None:
    """The job loops for 12 s on every node, then rank 3 on hwnode3 leaves: one srun step per node."""
    job, ready = gloo_job(env, "slurmrealloop", 29542, culprit="3", **{"progress-for": "12"})
    try:
        wait_ranks(ready)
        out = run_hangwatch(
            ["attach", "--slurm-job", job, "--match", "gloo_node_job.py --job slurmrealloop ",
             "--remote-hangwatch", str(env.nodes.hangwatch), "--window", "120", "--stall-after", "10",
             "--interval", "1", "--quiet"],
            tmp_path, timeout=200,
        )  # fmt: skip
        steps = env.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split()
    finally:
        env.cancel(job)
    (tmp_path / "attach.out").write_text(out.stdout)
    report = out.report
    assert report is not None, out.stderr
    verdict = report["verdict"]
    assert verdict["state"] == "stalled" and verdict["cause"] == "collective-wait", (verdict, out.stdout)
    assert len(verdict["culprits"]) == 1, out.stdout
    assert report["processes"][str(verdict["culprits"][0])]["node"] == "hwnode3", out.stdout
    assert report["duration_s"] >= 10
    assert all(n["rounds_failed"] == 0 for n in report["nodes"]), report["nodes"]
    assert sorted(steps) == [f"{job}.0", f"{job}.batch"], steps


def test_one_real_step_over_the_jobs_nodes_keeps_each_nodes_outcome(env: SlurmCluster) -> None:
    """``srun --nodes=3 --label``: slurmd's launch tree starts the three collectors; hwnode2's prints junk,
    hwnode3's nothing and exits 3. Each is that node's outcome, hwnode1's bundle is its own."""
    names = [n.name for n in env.nodes.nodes]
    job = env.submit("#!/bin/sh\nexec sleep 600\n", "-N3", "-w", ",".join(names))
    try:
        env.wait_running(job)
        shim = 'case $SLURMD_NODENAME in hwnode2) echo junk;; hwnode3) exit 3;; esac; exec "$@"'
        remote = ("sh", "-c", shim, "sh", *str(env.nodes.hangwatch).split())
        args = ["--match", "no-such-process-here", "--mode", "census", "--every", "0.1"]
        started = time.monotonic()
        ok, junk, failed = gather_slurm(names, args, SlurmOptions(job, remote=remote, fanout="step"))
        took = time.monotonic() - started
        steps = env.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split()
    finally:
        env.cancel(job)
    assert ok.outcome is NodeOutcome.OK and ok.bundle is not None, ok.detail
    assert ok.host == ok.bundle.node.hostname == "hwnode1"
    assert junk.host == "hwnode2" and junk.outcome is NodeOutcome.BAD_OUTPUT, junk.detail
    assert "not a node bundle" in junk.detail, junk.detail
    assert failed.host == "hwnode3" and failed.outcome is NodeOutcome.REMOTE_ERROR, failed.detail
    assert "exit status 3" in failed.detail and "task 2" in failed.detail, failed.detail
    assert took < 20, took
    assert steps == [f"{job}.batch"], steps  # the step ended with its collectors


def test_a_node_whose_slurmd_hangs_costs_that_node_only(env: SlurmCluster) -> None:
    """hwnode2's slurmd stopped (SIGSTOP: a daemon wedged in a system call looks the same to srun) while
    one step spans the job's three nodes: slurmd's launch tree still starts the other two collectors,
    their bundles are theirs, and hwnode2 is a timeout at the node deadline that says why it may be."""
    names = [n.name for n in env.nodes.nodes]
    job = env.submit("#!/bin/sh\nexec sleep 600\n", "-N3", "-w", ",".join(names))
    hung = [
        int(p)
        for p in env.run(
            ["pgrep", "-x", "-f", f"/usr/sbin/slurmd -D -N hwnode2 -f {env.conf}"]
        ).stdout.split()
    ]
    assert hung, "hwnode2's slurmd"
    try:
        env.wait_running(job)
        for pid in hung:
            os.kill(pid, signal.SIGSTOP)
        args = ["--match", "no-such-process-here", "--mode", "census", "--every", "0.1"]
        remote = tuple(str(env.nodes.hangwatch).split())
        started = time.monotonic()
        one, two, three = gather_slurm(
            names, args, SlurmOptions(job, remote=remote, fanout="step", node_timeout_s=8)
        )
        took = time.monotonic() - started
    finally:
        for pid in hung:
            os.kill(pid, signal.SIGCONT)
        env.cancel(job)
    assert one.outcome is NodeOutcome.OK and one.bundle is not None and one.host == "hwnode1", one.detail
    assert three.outcome is NodeOutcome.OK and three.bundle is not None and three.host == "hwnode3", (
        three.detail
    )
    assert two.host == "hwnode2" and two.outcome is NodeOutcome.TIMEOUT, two.detail
    assert "no answer within 8 s" in two.detail and "slurmd" in two.detail, two.detail
    assert took < 20, took


def test_real_sruns_failures_are_each_nodes_outcome(env: SlurmCluster) -> None:
    """The messages and exit statuses of the real srun and squeue 22.05, not the stand-ins'."""
    job = env.submit("#!/bin/sh\nexec sleep 600\n", "-N1", "-w", "hwnode1")
    try:
        env.wait_running(job)
        args = ["--match", "no-such-process-here", "--mode", "census", "--every", "0.1"]
        remote = tuple(str(env.nodes.hangwatch).split())
        one = SlurmOptions(job, remote=remote, fanout="per-node")
        ok, outside = gather_slurm(["hwnode1", "hwnode2"], args, one)
        assert ok.outcome is NodeOutcome.OK, ok.detail
        assert outside.outcome is NodeOutcome.UNREACHABLE, outside.detail
        assert "not part of the job's allocation" in outside.detail, outside.detail
        (missing,) = gather_slurm(["hwnode1"], args, SlurmOptions(job, remote=("/nonexistent/hangwatch",)))
        assert missing.outcome is NodeOutcome.NO_COLLECTOR, missing.detail
        assert "execve(): /nonexistent/hangwatch" in missing.detail, missing.detail
    finally:
        env.cancel(job)
    (gone,) = gather_slurm(["hwnode1"], ["--mode", "census"], SlurmOptions(job, node_timeout_s=20))
    assert gone.outcome is NodeOutcome.UNREACHABLE and "not running" in gone.detail, gone.detail
    with pytest.raises(SlurmError, match="not in the queue"):
        job_node_list(SlurmOptions(job))
    with pytest.raises(SlurmError, match="job 999999: the job is not running"):
        job_node_list(SlurmOptions("999999"))
