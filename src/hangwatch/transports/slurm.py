"""The Slurm boundary: the nodes of a running job, and ``hangwatch collect`` on each through ``srun``.

``srun --jobid J --overlap -N1 -n1 -w NODE hangwatch collect ...`` starts one more step inside the job's
own allocation: no ssh, no keys, the job owner's rights (munge does the authentication), and
``--overlap`` lets the step share the CPUs, memory and GPUs the job's steps hold (without it the step
waits for resources that never free: "step creation temporarily disabled"). Slurm >= 20.11.

Nodes come from ``squeue -j J -h -o %N`` (a host list such as ``gpu[01-04,09]``), expanded by
``scontrol show hostnames`` where it is installed (the caller falls back to the same range syntax of its
own, nodes/hosts.py). srun's exit statuses and messages never leave this module: each node ends as a
``NodeAnswer`` whose outcome says what happened (job not running, not the job's owner, node not in the
job, no collector on the node, timeout).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from hangwatch.model.nodes import NodeAnswer
from hangwatch.model.nodes import NodeOutcome
from hangwatch.transports.runner import ClientTransport
from hangwatch.transports.runner import Exchange
from hangwatch.transports.runner import Runner
from hangwatch.transports.runner import collect
from hangwatch.transports.runner import last_line
from hangwatch.transports.runner import run_bounded
from hangwatch.transports.stream import StreamSession

T = TypeVar("T")

# Slurm's own launch is a tree (TreeWidth 50); one srun per node from here is a flat fan-out like ssh's.
DEFAULT_CONCURRENCY = 32
MAX_OUTPUT_BYTES = 64_000_000
_JOB = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")  # 1234, an array task 1234_7, a het job component 1234+1

_PATTERNS: tuple[tuple[NodeOutcome, tuple[str, ...], str], ...] = (
    (
        NodeOutcome.AUTH,
        ("Access/permission denied", "Permission denied", "not the owner", "User not found"),
        "Slurm refused: only the job's owner (or an operator) can start a step in it",
    ),
    (
        NodeOutcome.UNREACHABLE,
        ("Job is pending execution",),
        "the job is still pending: it has no nodes yet",
    ),
    (
        NodeOutcome.UNREACHABLE,
        # 22.05: "Unable to confirm allocation for job 999: Invalid job id specified"; a job that ended
        # "Job/step already completing or completed", then "Slurm job 3 has expired" once it left the queue.
        (
            "Invalid job id",
            "Job has already finished",
            "already completed",
            "completing or completed",
            "has expired",
            "not running",
        ),
        "the job is not running",
    ),
    (
        NodeOutcome.UNREACHABLE,
        ("Requested node configuration is not available", "Invalid node name", "not in the allocation"),
        "the node is not part of the job's allocation",
    ),
    (
        NodeOutcome.UNREACHABLE,
        ("Unable to contact slurm controller", "Socket timed out", "Connection refused"),
        "the Slurm controller cannot be reached",
    ),
    (
        NodeOutcome.TIMEOUT,
        ("step creation temporarily disabled", "Job step creation temporarily disabled"),
        "the step could not start: the job's resources are busy (is --overlap supported: Slurm >= 20.11?)",
    ),
)


class SlurmError(Exception):
    """The job's nodes could not be found: said to the user, there is no node to ask."""


@dataclass(frozen=True)
class SlurmOptions:
    job: str
    srun: str = "srun"
    squeue: str = "squeue"
    scontrol: str = "scontrol"
    connect_timeout_s: float = 5.0  # what of the node timeout the step's launch may take
    node_timeout_s: float = 30.0
    concurrency: int = DEFAULT_CONCURRENCY
    remote: tuple[str, ...] = ("hangwatch",)


def check_job(job: str) -> str:
    if not _JOB.match(job):
        raise SlurmError(f"not a Slurm job id: {job!r} (e.g. 1234, or 1234_7 for an array task)")
    return job


def job_node_list(options: SlurmOptions, runner: Runner = run_bounded) -> str:
    """The job's nodes as Slurm writes them (``node[1-3],gpu07``); empty when it has none yet."""
    ex = runner([options.squeue, "-j", check_job(options.job), "-h", "-o", "%N"], options.node_timeout_s)
    said = last_line(ex.stderr)
    if ex.rc is None:
        raise SlurmError(f"squeue gave no answer within {options.node_timeout_s:g} s")
    if ex.rc == 127:
        raise SlurmError(f"squeue was not found ({said}): run on a Slurm login node, or give --squeue")
    if ex.rc != 0:
        for _outcome, needles, meaning in _PATTERNS:
            if any(n in ex.stderr for n in needles):
                raise SlurmError(f"job {options.job}: {meaning} ({said})")
        raise SlurmError(f"squeue -j {options.job} failed (exit status {ex.rc}): {said}")
    lines = [line.strip() for line in ex.stdout.decode("utf-8", "replace").splitlines() if line.strip()]
    # A pending job prints an empty line (22.05) or "(None)"; a job array prints one line per running task.
    nodes = ",".join(line for line in lines if not line.startswith("("))
    if not nodes:
        state = job_state(options, runner)
        if state in ("PENDING", "CONFIGURING", "REQUEUED", "SUSPENDED"):
            raise SlurmError(f"job {options.job} is {state}: it has no running nodes yet")
        raise SlurmError(f"job {options.job} is not in the queue (finished, or never started)")
    return nodes


def job_state(options: SlurmOptions, runner: Runner = run_bounded) -> str:
    """``squeue -j J -h -o %T``: PENDING, RUNNING, ...; empty when the job is not in the queue (squeue
    lists only pending, running, suspended and completing jobs by default)."""
    ex = runner([options.squeue, "-j", check_job(options.job), "-h", "-o", "%T"], options.node_timeout_s)
    if ex.rc != 0:
        return ""
    states = ex.stdout.decode("utf-8", "replace").split()
    return states[0] if states else ""


def show_hostnames(node_list: str, options: SlurmOptions, runner: Runner = run_bounded) -> list[str] | None:
    """``scontrol show hostnames LIST``; None when scontrol is missing or fails (the caller expands it)."""
    if not node_list:
        return []
    ex = runner([options.scontrol, "show", "hostnames", node_list], options.node_timeout_s)
    if ex.rc != 0:
        return None
    return [line.strip() for line in ex.stdout.decode("utf-8", "replace").splitlines() if line.strip()]


def srun_argv(node: str, remote_args: Sequence[str], options: SlurmOptions) -> list[str]:
    """One step of one task on one node of the job, sharing the job's resources; an argv, no shell."""
    if node.startswith("-"):
        raise ValueError(f"not a node: {node!r}")
    argv = [options.srun, "--jobid", check_job(options.job), "--overlap", "-N1", "-n1", "-w", node]
    # --quiet: srun's own progress lines ("job step created") are not the collector's output.
    return [*argv, "--quiet", *options.remote, "collect", *remote_args]


@dataclass(frozen=True)
class SlurmTransport(ClientTransport[SlurmOptions, str]):
    """``srun --jobid J --overlap -N1 -n1 -w NODE hangwatch collect ...`` (runner.Transport)."""

    def argv(self, target: str, remote_args: Sequence[str]) -> list[str]:
        return srun_argv(target, remote_args, self.options)

    def answer_of(self, target: str, ex: Exchange) -> NodeAnswer:
        return answer_of(target, ex, self.options)


def collect_nodes(
    nodes: Sequence[str],
    remote_args: Sequence[str],
    options: SlurmOptions,
    finish: Callable[[NodeAnswer], T],
    runner: Runner = run_bounded,
) -> list[T]:
    """The collector on every node of the job, in parallel; one result per node, in node order."""
    return collect(SlurmTransport(options), nodes, remote_args, lambda _node, answer: finish(answer), runner)


def answer_of(node: str, ex: Exchange, options: SlurmOptions) -> NodeAnswer:
    def failed(outcome: NodeOutcome, detail: str) -> NodeAnswer:
        return NodeAnswer(node, outcome, detail, b"", ex.sent_wall_s, ex.received_wall_s)

    said = last_line(ex.stderr)
    if ex.rc is None:
        for outcome, needles, meaning in _PATTERNS:
            if outcome is NodeOutcome.TIMEOUT and any(n in ex.stderr for n in needles):
                return failed(outcome, f"{meaning}: {said}")
        if not said:
            # Slurm 22.05's srun waits silently for a step it cannot place (no "temporarily disabled"
            # line at the default verbosity): nothing said can be either that or a collector still busy.
            return failed(
                NodeOutcome.TIMEOUT,
                f"no answer within {options.node_timeout_s:g} s and srun said nothing (the step may be"
                " waiting for the job's resources, or the collector did not finish)",
            )
        return failed(
            NodeOutcome.TIMEOUT, f"no answer within {options.node_timeout_s:g} s (step and collect): {said}"
        )
    if ex.rc == 0:
        if len(ex.stdout) > MAX_OUTPUT_BYTES:
            over = f"{len(ex.stdout)} bytes, over the {MAX_OUTPUT_BYTES} limit"
            return failed(NodeOutcome.BAD_OUTPUT, over)
        return NodeAnswer(node, NodeOutcome.OK, "", ex.stdout, ex.sent_wall_s, ex.received_wall_s)
    # slurmstepd says it could not exec the collector ("execve(): hangwatch: No such file or directory").
    missing = next((line.strip() for line in ex.stderr.splitlines() if "execve()" in line), None)
    if missing is not None or ex.rc == 127:
        return failed(
            NodeOutcome.NO_COLLECTOR,
            f"hangwatch was not found on the node ({missing or said}); give its path with --remote-hangwatch",
        )
    for outcome, needles, meaning in _PATTERNS:
        if any(n in ex.stderr for n in needles):
            return failed(outcome, f"{meaning}: {said}")
    return failed(NodeOutcome.REMOTE_ERROR, f"srun failed (exit status {ex.rc}): {said}")


def srun_session(node: str, remote_args: Sequence[str], options: SlurmOptions) -> StreamSession:
    """``srun --jobid J --overlap -N1 -n1 -w NODE hangwatch collect --stream ...`` held open for a watch:
    one step for the whole watch (srun passes its stdin to the step's one task)."""
    return StreamSession(
        node,
        srun_argv(node, [*remote_args, "--stream"], options),
        lambda ex: answer_of(node, ex, options),
        open_timeout_s=options.connect_timeout_s,
    )
