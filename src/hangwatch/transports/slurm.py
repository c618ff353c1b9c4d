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

import contextlib
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field
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
    # A one-shot collection (stacks): "step", one srun over all the nodes; "per-node", one srun each
    # (``concurrency`` at once); "auto", the step from STEP_MIN_NODES nodes. attach's sessions are per node.
    fanout: str = "auto"


FANOUTS = ("auto", "step", "per-node")
STEP_MIN_NODES = 2


def one_step(options: SlurmOptions, nodes: int) -> bool:
    """Whether a one-shot collection over ``nodes`` nodes goes through one step over them all."""
    if options.fanout not in FANOUTS:
        raise ValueError(f"not a fan-out: {options.fanout!r} (one of {', '.join(FANOUTS)})")
    return options.fanout == "step" or (options.fanout == "auto" and nodes >= STEP_MIN_NODES)


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
            # line at the default verbosity), and for a task a hung slurmd never launches: nothing said
            # can be either, or a collector still busy (tests/integration/test_nodes_slurm_real.py).
            return failed(
                NodeOutcome.TIMEOUT,
                f"no answer within {options.node_timeout_s:g} s and srun said nothing (the node's slurmd"
                " may not have started the collector, the step may be waiting for the job's resources, or"
                " the collector did not finish)",
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


# -- one step over all the job's nodes -------------------------------------------------------------------
# srun's step I/O carries a task's output in messages of at most this many bytes (slurmstepd buffers a
# line up to it): with --label a longer line comes back as several labelled lines, each of exactly this
# many bytes but the last, which is shorter (an empty one when the line filled its last message). So a
# labelled line shorter than this ends a line of the task's own output; one of this length continues it.
STEP_IO_CHUNK = 1024
# "  3: ..." on stdout and stderr: srun --label pads the task id to the width of the largest.
_LABEL = re.compile(rb"^ *(\d+): ")
# srun's own word on one task: "srun: error: hwnode2: task 1: Exited with exit code 3" (or "Killed").
_TASK_SAID = re.compile(r"^srun: error: (\S+): tasks? (\d+)(?:-(\d+))?: (.*)$")
_EXIT_CODE = re.compile(r"Exited with exit code (\d+)")
# Asked to end, srun cancels the step on every node; then it is given this long before SIGKILL.
STEP_TERM_GRACE_S = 2.0


def step_argv(nodes: Sequence[str], remote_args: Sequence[str], options: SlurmOptions) -> list[str]:
    """One step of one task on each of ``nodes`` (the job's), sharing the job's resources: slurmd's own
    launch tree starts the collectors, and their bundles come back on srun's stdout, each line labelled
    with its task id (task K runs on the K-th node in Slurm's order, squeue's and scontrol's)."""
    if any(node.startswith("-") or "," in node for node in nodes):
        raise ValueError(f"not a node list: {list(nodes)!r}")
    n = len(nodes)
    argv = [options.srun, "--jobid", check_job(options.job), "--overlap", f"--nodes={n}", f"--ntasks={n}"]
    argv += ["--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--label", "--quiet"]
    # A node whose collector fails must not end the others' (a cluster may set KillOnBadExit=1), nor the
    # first to finish end the rest (WaitTime): each collector has its own deadline.
    argv += ["--kill-on-bad-exit=0", "--wait=0"]
    return [*argv, *options.remote, "collect", *remote_args]


@dataclass
class _Task:
    """What one task of the step said: its output rebuilt from srun's labelled lines, and its stderr."""

    out: bytearray = field(default_factory=bytearray)
    err: list[str] = field(default_factory=list)
    lines: int = 0  # lines of its output complete so far
    over: bool = False  # more output than MAX_OUTPUT_BYTES (the rest is dropped)
    received_wall_s: float = 0.0
    said: str = ""  # srun's line on this task ("srun: error: NODE: task K: Exited with exit code 3")
    rc: int = 0
    node: str = ""  # the node srun named for it, if it named one


class StepOutput:
    """srun --label's output of a step over ``nodes`` (task K on the K-th), line by line as it comes."""

    def __init__(self, nodes: Sequence[str], sent_wall_s: float) -> None:
        self.nodes = list(nodes)
        self.sent_wall_s = sent_wall_s
        self.tasks = [_Task() for _ in nodes]
        self.unlabelled: list[str] = []  # srun's own lines that name no task

    def out_line(self, line: bytes) -> int | None:
        """One line of srun's stdout; the task whose first line of output it completed, if any."""
        m = _LABEL.match(line)
        if m is None or int(m.group(1)) >= len(self.tasks):
            return None  # not a task's line: srun writes its own to stderr
        k, body = int(m.group(1)), line[m.end() :]
        task = self.tasks[k]
        task.over = task.over or len(task.out) + len(body) >= MAX_OUTPUT_BYTES
        if not task.over:
            task.out += body
        if len(body) >= STEP_IO_CHUNK:
            return None  # the line goes on in the task's next message
        task.out += b"" if task.over else b"\n"
        task.lines += 1
        task.received_wall_s = time.time()
        return k if task.lines == 1 and not task.over else None

    def err_line(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace")
        m = _LABEL.match(line)
        if m is not None and int(m.group(1)) < len(self.tasks):
            self.tasks[int(m.group(1))].err.append(text[m.end() :])
            return
        said = _TASK_SAID.match(text)
        if said is None:
            self.unlabelled.append(text)
            return
        first = int(said.group(2))
        for k in range(first, min(int(said.group(3) or first), len(self.tasks) - 1) + 1):
            task = self.tasks[k]
            task.said, task.node = text, said.group(1)
            code = _EXIT_CODE.search(said.group(4))
            # "Killed" (by a signal, or the node's OOM killer): 137, as a shell says a SIGKILL.
            task.rc = int(code.group(1)) if code else 137 if "Killed" in said.group(4) else 1

    def answer(self, k: int, rc: int | None, options: SlurmOptions) -> NodeAnswer:
        """Task ``k``'s answer, once srun ended (``rc`` None: stopped at the deadline), in the words
        ``answer_of`` gives one node's own srun."""
        task, sent = self.tasks[k], self.sent_wall_s
        received = task.received_wall_s or time.time()
        # Where srun named the task's node, its word wins over the task order (Slurm's node order, which
        # squeue's list follows: the two agree unless Slurm changes how it lays tasks out).
        node = task.node or self.nodes[k]
        if rc is None and task.lines == 0:
            # srun was stopped at the deadline before this node's line was complete.
            said = "\n".join([*task.err, *self.unlabelled])
            return answer_of(node, Exchange(None, b"", said, sent, received), options)
        if task.said:
            said = "\n".join([task.said, *task.err])
            return answer_of(node, Exchange(task.rc, bytes(task.out), said, sent, received), options)
        if task.over:
            over = f"over {MAX_OUTPUT_BYTES} bytes of output, the limit"
            return NodeAnswer(node, NodeOutcome.BAD_OUTPUT, over, b"", sent, received)
        if task.lines:
            return NodeAnswer(node, NodeOutcome.OK, "", bytes(task.out), sent, received)
        if rc not in (0, None):
            # Nothing from this task and no word on it: the step failed as a whole (not running, pending,
            # refused), said the way one srun for this node would have said it.
            said = "\n".join([*task.err, *self.unlabelled])
            return answer_of(node, Exchange(rc, b"", said, sent, received), options)
        said = last_line("\n".join(task.err))
        detail = f"no output from its task (task {k} of the step), though srun ended with exit status 0"
        detail = f"{detail}: {said}" if said else detail
        return NodeAnswer(node, NodeOutcome.BAD_OUTPUT, detail, b"", sent, received)


def step_answers(
    nodes: Sequence[str], stdout: bytes, stderr: str, rc: int | None, options: SlurmOptions
) -> list[NodeAnswer]:
    """Every node's answer from a finished step's whole output (what ``collect_step`` makes of it line by
    line as it streams)."""
    parsed = StepOutput(nodes, time.time())
    for line in stdout.split(b"\n")[: -1 if stdout.endswith(b"\n") else None]:
        parsed.out_line(line)
    for text in stderr.splitlines():
        parsed.err_line(text.encode())
    return [parsed.answer(k, rc, options) for k in range(len(nodes))]


def collect_step(
    nodes: Sequence[str],
    remote_args: Sequence[str],
    options: SlurmOptions,
    finish: Callable[[NodeAnswer], T],
) -> list[T]:
    """The collector on every node of the job through one ``srun`` step; one result per node, in order.

    srun's stdout is read as it streams: a node's bundle is finished (``finish``, the decoding) in a
    worker thread as soon as its line is complete, overlapping the nodes still running. A node that
    fails, prints junk or nothing, is that node's outcome; the step failing as a whole (the job not
    running, Slurm unreachable) is every node's, as one srun per node would have said it."""
    if not nodes:
        return []
    argv = step_argv(nodes, remote_args, options)
    parsed = StepOutput(nodes, time.time())
    # ``finish`` of a task's first complete line, as it arrives; the final answer reuses it when nothing
    # changed since (the usual case: one line, the bundle, exit status 0).
    early: dict[int, tuple[int, Future[T]]] = {}
    with ThreadPoolExecutor(max_workers=1) as decoder:

        def on_out(line: bytes) -> None:
            k = parsed.out_line(line)
            if k is not None:
                task = parsed.tasks[k]
                answer = NodeAnswer(
                    nodes[k], NodeOutcome.OK, "", bytes(task.out), parsed.sent_wall_s, task.received_wall_s
                )
                early[k] = (len(task.out), decoder.submit(finish, answer))

        rc = _stream(argv, options.node_timeout_s, on_out, parsed.err_line)
        results: list[T] = []
        for k in range(len(nodes)):
            answer, got = parsed.answer(k, rc, options), early.get(k)
            same = answer.outcome is NodeOutcome.OK and answer.host == nodes[k]
            if got is not None and same and got[0] == len(answer.stdout):
                results.append(got[1].result())
            else:
                results.append(finish(answer))
    return results


def _stream(
    argv: list[str], deadline_s: float, on_out: Callable[[bytes], None], on_err: Callable[[bytes], None]
) -> int | None:
    """Run ``argv`` in a session of its own, handing each line of its stdout and stderr over as it comes;
    its exit status, or None when it was stopped at the deadline (SIGTERM: srun cancels the step on every
    node, then SIGKILL to the whole group)."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:  # srun itself is missing: exit status 127, as a shell would say
        on_err(f"{argv[0]}: {exc.strerror}".encode())  # said as srun's own line: every node's
        return 127
    assert proc.stdout is not None and proc.stderr is not None
    end = time.monotonic() + deadline_s
    pending = {proc.stdout.fileno(): (b"", on_out), proc.stderr.fileno(): (b"", on_err)}
    timed_out = False
    with selectors.DefaultSelector() as sel:
        for fd in pending:
            sel.register(fd, selectors.EVENT_READ)
        while pending:
            left = end - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                fd = key.fd
                assert isinstance(fd, int)
                chunk = os.read(fd, 1 << 16)
                rest, handle = pending[fd]
                if not chunk:
                    if rest:
                        handle(rest)
                    sel.unregister(fd)
                    del pending[fd]
                    continue
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    handle(line)
                pending[fd] = (rest, handle)
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STEP_TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    else:
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    return None if timed_out else proc.returncode
