"""The slurm transport against stand-in ``squeue``, ``scontrol`` and ``srun`` on PATH
(tests/fakes/slurm_standin.py): the job's nodes, the exact srun argv, each failure as that node's
outcome. Here the "nodes" are this machine; tests/integration/test_nodes_slurm.py runs the steps
inside emulated nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hangwatch
from hangwatch.model.nodes import NodeOutcome
from hangwatch.nodes.gather import gather_slurm
from hangwatch.nodes.gather import slurm_nodes
from hangwatch.transports import slurm
from hangwatch.transports.runner import Exchange
from hangwatch.transports.runner import run_bounded
from hangwatch.transports.slurm import SlurmOptions
from slurm_standins import calls
from slurm_standins import install

REMOTE = (sys.executable, "-m", "hangwatch")
JOBS = {
    "4242": {"nodes": "hwn[1-2],gpu07"},
    "77": {"nodes": "hwn01"},
    # Its second node's task prints junk; its third prints nothing and exits 0.
    "88": {"nodes": "hwn[1-3]", "tasks": {"hwn2": {"print": "junk\n"}, "hwn3": {"print": ""}}},
}
# The "nodes" share this machine: one at a time, or each collector would see the other's command line.
ONE_AT_A_TIME = 1


@pytest.fixture
def standins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PYTHONPATH", str(Path(hangwatch.__file__).resolve().parents[1]))
    return install(tmp_path, monkeypatch, JOBS)


@pytest.fixture
def job() -> Iterator[str]:
    token = f"hw-slurm-job-{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", token], env={"RANK": "0"})
    try:
        yield token
    finally:
        proc.kill()
        proc.wait()


def test_the_jobs_nodes_come_from_squeue_expanded_by_scontrol(standins: Path) -> None:
    assert slurm_nodes(SlurmOptions("4242")) == ["hwn1", "hwn2", "gpu07"]
    assert calls(standins) == [
        ["squeue", "-j", "4242", "-h", "-o", "%N"],
        ["scontrol", "show", "hostnames", "hwn[1-2],gpu07"],
    ]


def test_without_scontrol_the_list_is_expanded_here_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path, monkeypatch, JOBS, tools=("squeue", "srun"))
    options = SlurmOptions("4242", scontrol=str(tmp_path / "no-scontrol"))
    assert slurm_nodes(options) == ["hwn1", "hwn2", "gpu07"]
    assert slurm_nodes(replace_job(options, "77")) == ["hwn01"]  # zero padding kept


def replace_job(options: SlurmOptions, job: str) -> SlurmOptions:
    return SlurmOptions(job, scontrol=options.scontrol)


def test_a_job_that_is_not_running_or_not_a_job_id_is_said(standins: Path) -> None:
    with pytest.raises(slurm.SlurmError, match="job 9999: the job is not running"):
        slurm_nodes(SlurmOptions("9999"))
    with pytest.raises(slurm.SlurmError, match="not a Slurm job id"):
        slurm_nodes(SlurmOptions("--all"))


def test_one_step_per_node_inside_the_allocation(standins: Path, job: str) -> None:
    options = SlurmOptions("4242", remote=REMOTE, concurrency=ONE_AT_A_TIME, fanout="per-node")
    results = gather_slurm(["hwn1", "hwn2"], ["--match", job, "--mode", "census", "--every", "0.1"], options)
    assert [r.outcome for r in results] == [NodeOutcome.OK, NodeOutcome.OK], [r.detail for r in results]
    assert all(r.bundle is not None and len(r.bundle.processes) == 1 for r in results)
    steps = [c for c in calls(standins) if c[0] == "srun"]
    assert steps[0] == [
        "srun", "--jobid", "4242", "--overlap", "-N1", "-n1", "-w", "hwn1", "--quiet",
        *REMOTE, "collect", "--match", job, "--mode", "census", "--every", "0.1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("node", "remote", "outcome", "said"),
    [
        ("node9", REMOTE, NodeOutcome.UNREACHABLE, "not part of the job's allocation"),
        ("hwn1", ("/opt/none/hangwatch",), NodeOutcome.NO_COLLECTOR, "execve(): /opt/none/hangwatch"),
    ],
)
def test_each_step_failure_is_that_nodes_outcome(
    standins: Path, node: str, remote: tuple[str, ...], outcome: NodeOutcome, said: str
) -> None:
    (result,) = gather_slurm(
        [node], ["--match", "x", "--mode", "census"], SlurmOptions("4242", remote=remote)
    )
    assert result.outcome is outcome and said in result.detail, result.detail


def test_a_step_that_cannot_overlap_waits_and_is_said_so(standins: Path) -> None:
    """Without --overlap a step waits for the CPUs the job's steps hold, and srun 22.05 says nothing at
    its default verbosity: the timeout says what that silence can mean."""
    options = SlurmOptions("4242", node_timeout_s=1.5)
    argv = [a for a in slurm.srun_argv("hwn1", ["--match", "x"], options) if a != "--overlap"]
    answer = slurm.answer_of("hwn1", run_bounded(argv, options.node_timeout_s), options)
    assert answer.outcome is NodeOutcome.TIMEOUT
    assert "srun said nothing" in answer.detail and "waiting for the job's resources" in answer.detail


def test_a_timeout_with_a_message_says_it() -> None:
    ex = Exchange(None, b"", "srun: Job 2 step creation temporarily disabled, retrying\n", 0.0, 1.0)
    answer = slurm.answer_of("hwn1", ex, SlurmOptions("2"))
    assert answer.outcome is NodeOutcome.TIMEOUT and "--overlap" in answer.detail


# What the real srun and squeue of Slurm 22.05.8 print (tests/integration/test_nodes_slurm_real.py
# runs them): stderr, exit status, and the outcome each must become.
REAL_SRUN = [
    ("srun: error: Unable to confirm allocation for job 999: Invalid job id specified\n", 1,
     NodeOutcome.UNREACHABLE, "the job is not running"),
    ("srun: error: Unable to create step for job 3: Requested node configuration is not available\n", 1,
     NodeOutcome.UNREACHABLE, "not part of the job's allocation"),
    ("srun: error: Slurm job 3 has expired\n", 1, NodeOutcome.UNREACHABLE, "the job is not running"),
    ("srun: error: Unable to create step for job 2: Job/step already completing or completed\n", 1,
     NodeOutcome.UNREACHABLE, "the job is not running"),
    ("srun: error: Unable to confirm allocation for job 4: Job is pending execution\n", 1,
     NodeOutcome.UNREACHABLE, "still pending"),
    ("srun: error: hwnode1: task 0: Exited with exit code 2\n"
     "slurmstepd-hwnode1: error: execve(): /nonexistent/hangwatch: No such file or directory\n", 2,
     NodeOutcome.NO_COLLECTOR, "execve(): /nonexistent/hangwatch"),
    ("srun: error: hwnode2: task 0: Exited with exit code 3\nerr\n", 3, NodeOutcome.REMOTE_ERROR,
     "exit status 3"),
]  # fmt: skip


def not_itself(token: str) -> str:
    """A --match for ``token`` that the collectors' own command lines (which carry it) do not match: in
    one step they all run at once on this machine."""
    return f"{token[:-1]}[{token[-1]}]"


def test_one_step_over_all_the_jobs_nodes_gives_each_its_bundle(standins: Path, job: str) -> None:
    options = SlurmOptions("4242", remote=REMOTE, fanout="step")
    args = ["--match", not_itself(job), "--mode", "census", "--every", "0.1"]
    results = gather_slurm(["hwn1", "hwn2", "gpu07"], args, options)
    assert [(r.host, r.outcome) for r in results] == [
        ("hwn1", NodeOutcome.OK), ("hwn2", NodeOutcome.OK), ("gpu07", NodeOutcome.OK),
    ], [r.detail for r in results]  # fmt: skip
    assert all(r.bundle is not None and len(r.bundle.processes) == 1 for r in results)
    # Each bundle is over 1,024 bytes: srun cut it into labelled pieces, put back together here.
    assert all(r.output_bytes > slurm.STEP_IO_CHUNK for r in results), [r.output_bytes for r in results]
    (step,) = [c for c in calls(standins) if c[0] == "srun"]
    assert step == [
        "srun", "--jobid", "4242", "--overlap", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
        "--nodelist=hwn1,hwn2,gpu07", "--label", "--quiet", "--kill-on-bad-exit=0", "--wait=0",
        *REMOTE, "collect", *args,
    ]  # fmt: skip


def test_in_one_step_a_nodes_junk_or_silence_is_that_nodes_alone(standins: Path, job: str) -> None:
    options = SlurmOptions("88", remote=REMOTE, fanout="step")
    ok, junk, silent = gather_slurm(
        ["hwn1", "hwn2", "hwn3"], ["--match", not_itself(job), "--mode", "census"], options
    )
    assert ok.outcome is NodeOutcome.OK and ok.bundle is not None, ok.detail
    assert junk.outcome is NodeOutcome.BAD_OUTPUT and "not a node bundle: not JSON" in junk.detail
    assert silent.outcome is NodeOutcome.BAD_OUTPUT, silent.detail
    assert "no output from its task (task 2 of the step)" in silent.detail, silent.detail


def test_in_one_step_each_tasks_failure_is_its_nodes_outcome() -> None:
    """What the real srun 22.05 printed for a step over three nodes (test_nodes_slurm_real.py): the
    slurmstepd lines are labelled, srun's own name the node and the task."""
    stderr = (
        "srun: error: hwnode2: task 1: Exited with exit code 2\n"
        "1: slurmstepd-hwnode2: error: execve(): /nonexistent/x: No such file or directory\n"
        "srun: error: hwnode3: task 2: Killed\n"
    )
    answers = slurm.step_answers(
        ["hwnode1", "hwnode2", "hwnode3"], b"0: {}\n", stderr, 137, SlurmOptions("2")
    )
    assert [a.outcome for a in answers] == [
        NodeOutcome.OK,
        NodeOutcome.NO_COLLECTOR,
        NodeOutcome.REMOTE_ERROR,
    ]
    assert "execve(): /nonexistent/x" in answers[1].detail and "Killed" in answers[2].detail


@pytest.mark.parametrize(("stderr", "rc", "outcome", "said"), REAL_SRUN[:5])
def test_a_step_that_fails_as_a_whole_is_every_nodes_outcome(
    stderr: str, rc: int, outcome: NodeOutcome, said: str
) -> None:
    answers = slurm.step_answers(["hwnode1", "hwnode2"], b"", stderr, rc, SlurmOptions("2"))
    assert all(a.outcome is outcome and said in a.detail for a in answers), answers


def test_the_fanout_is_one_step_from_two_nodes_unless_asked() -> None:
    assert not slurm.one_step(SlurmOptions("2"), 1) and slurm.one_step(SlurmOptions("2"), 2)
    assert not slurm.one_step(SlurmOptions("2", fanout="per-node"), 500)
    assert slurm.one_step(SlurmOptions("2", fanout="step"), 1)


@pytest.mark.parametrize(("stderr", "rc", "outcome", "said"), REAL_SRUN)
def test_real_srun_messages_become_outcomes(stderr: str, rc: int, outcome: NodeOutcome, said: str) -> None:
    answer = slurm.answer_of("hwnode1", Exchange(rc, b"", stderr, 0.0, 0.1), SlurmOptions("2"))
    assert answer.outcome is outcome and said in answer.detail, answer.detail


def test_a_pending_job_is_said_to_be_pending_not_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """squeue 22.05 prints an empty line for a pending job's %N: its state says why there are no nodes."""
    log = install(
        tmp_path, monkeypatch, {"4": {"nodes": "", "state": "PENDING"}, "5": {"nodes": "", "state": ""}}
    )
    with pytest.raises(slurm.SlurmError, match="job 4 is PENDING: it has no running nodes yet"):
        slurm_nodes(SlurmOptions("4"))
    assert calls(log)[-1] == ["squeue", "-j", "4", "-h", "-o", "%T"]
    with pytest.raises(slurm.SlurmError, match="job 5 is not in the queue"):
        slurm_nodes(SlurmOptions("5"))
    (answer,) = gather_slurm(["hwn1"], ["--mode", "census"], SlurmOptions("4"))
    assert answer.outcome is NodeOutcome.UNREACHABLE and "still pending" in answer.detail


def test_stacks_cli_across_a_slurm_job(standins: Path, job: str, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "hangwatch", "stacks", "--slurm-job", "77", "--match", job,
         "--remote-hangwatch", " ".join(REMOTE), "--no-native", "--report-json", str(report)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    assert [(n["host"], n["outcome"]) for n in data["nodes"]] == [("hwn01", "ok")]
    missing = subprocess.run(
        [sys.executable, "-m", "hangwatch", "stacks", "--slurm-job", "31337", "--match", job],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 1 and "job 31337: the job is not running" in missing.stderr
