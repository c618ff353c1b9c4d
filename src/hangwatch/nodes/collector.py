"""The per-node collector behind ``hangwatch collect``: one JSON bundle of this node's share of a server.

It runs on the node (through ssh, and later srun or kubectl exec), finds the server's processes there
(the trees of the ``--pid`` roots, or of the processes whose title or command line matches
``--match``: the caller says which, nothing is guessed), and samples them with the same collectors
the local commands use (``TreeSampler`` for /proc, ``StackDumper`` for py-spy), so the bundle holds the
samples the analysis consumes. Read-only like ``hangwatch stacks``: the only signal is the SIGCONT
that undoes a dump that left a process stopped.

Bounded: ``deadline_s`` caps the rounds taken (a round that would end past it is not started), and
``max_bytes`` caps the encoded bundle (log tails, then thread details, then later stack rounds are
dropped, each drop said in ``errors``). Everything that fails is a ``BundleError``, never an exception.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from hangwatch import __version__
from hangwatch import engines
from hangwatch.collect import procfs
from hangwatch.collect.http_probe import probe_once
from hangwatch.collect.logtail import FileLog
from hangwatch.collect.logtail import clean_text
from hangwatch.collect.nvml import GpuSource
from hangwatch.collect.proctree import TreeSampler
from hangwatch.collect.proctree import matching_roots
from hangwatch.collect.proctree import own_processes
from hangwatch.collect.stacks import StackDumper
from hangwatch.engines import registry
from hangwatch.engines.profile import Profile
from hangwatch.engines.profile import node_rank
from hangwatch.model.nodes import BUNDLE_SCHEMA
from hangwatch.model.nodes import BundleError
from hangwatch.model.nodes import ClockReading
from hangwatch.model.nodes import CollectMode
from hangwatch.model.nodes import LogTail
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.nodes import NodeIdentity
from hangwatch.model.nodes import NodeProbe
from hangwatch.model.nodes import NodeProcess
from hangwatch.model.nodes import ThreadState
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import ProcState
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import StackSample
from hangwatch.nodes import codec
from hangwatch.redact import redact_environ
from hangwatch.redact import redact_text
from hangwatch.words import plural

# Only these variables are read from a process's environment (it holds tokens): where ranks come from
# under torchrun (local_elastic_agent.py), Slurm (srun), Open MPI and LeaderWorkerSet (multinode.md 1.4-1.5).
ENV_KEYS = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "OMPI_COMM_WORLD_RANK",
        "CUDA_VISIBLE_DEVICES",
        "LWS_WORKER_INDEX",
        "LWS_GROUP_SIZE",
    }
)
# Which variable a generic rank came from, in the order engines/generic.py reads them.
_RANK_SOURCES = (
    ("RANK", "env:RANK"),
    ("SLURM_PROCID", "env:SLURM_PROCID"),
    ("OMPI_COMM_WORLD_RANK", "env:OMPI"),
)
MAX_PROCESSES = 1024  # a node of 8 GPUs has tens; more means the match was too broad
MAX_THREADS_PER_PROCESS = 64
LOG_TAIL_BYTES = 16_384
MAX_LOG_LINE = 1000
DEFAULT_MAX_BYTES = 8_000_000


@dataclass(frozen=True)
class CollectOptions:
    pids: tuple[int, ...] = ()
    match: str | None = None  # a regular expression searched in each process's title and command line
    mode: CollectMode = CollectMode.FULL
    samples: int = 2  # stack rounds in full mode
    every_s: float = 1.0  # between rounds; census: the window
    native: bool = True
    engine: str | None = None
    logs: tuple[Path, ...] = ()
    log_lines: int = 30
    deadline_s: float = 20.0
    max_bytes: int = DEFAULT_MAX_BYTES
    # Probe the engine's readiness URL on the node (its /health on loopback, from the command line), or
    # this URL; off: no request at all.
    probe: bool = True
    probe_url: str | None = None
    probe_timeout_s: float = 2.0


ThreadStates = dict[int, dict[int, tuple[ProcState, float]]]  # pid -> tid -> (state, CPU seconds)


@dataclass
class _Rounds:
    ticks: list[Tick]
    stacks: list[StackSample]
    threads_before: ThreadStates
    threads_after: ThreadStates


def collect(
    options: CollectOptions,
    *,
    root: Path = procfs.PROC,
    dumper: StackDumper | None = None,
    sleep: Callable[[float], None] = time.sleep,
    gpu: GpuSource | None = None,
    follow: LogFollow | None = None,
) -> NodeBundle:
    """``follow``: a stream's logs, read for what they said since the previous request."""
    wall, started = time.time(), time.monotonic()
    since_exec = own_age(root)
    errors: list[BundleError] = []
    identity = node_identity(root)
    roots, selector = select_roots(options, root, errors)
    processes: tuple[NodeProcess, ...] = ()
    logs: tuple[LogTail, ...] = ()
    followed: tuple[LogTail, ...] = ()
    probes: tuple[NodeProbe, ...] = ()
    taken = _Rounds([Tick(t=0.0, processes=())], [], {}, {})
    if roots:
        cmdline = procfs.read_cmdline(roots[0], root) or ("?",)
        profile = engines.by_name(options.engine) if options.engine else engines.detect(cmdline)
        sampler = TreeSampler(roots, profile.role_of, watch_deaths=False, exclude=own_processes, root=root)
        if options.mode is CollectMode.FULL and dumper is None:
            dumper = StackDumper(native=options.native, root=root, engine_caches=registry.cache_folders())
        if dumper is not None and dumper.unavailable is not None:
            errors.append(BundleError("stacks", dumper.unavailable))
            dumper = None
        try:
            taken = take_rounds(
                options, sampler, dumper, started=started, sleep=sleep, errors=errors, root=root
            )
        finally:
            sampler.close()
        processes = node_processes(taken.ticks, taken.threads_before, taken.threads_after, root)
        if options.mode is CollectMode.FULL:
            logs = log_tails(options, roots, root, errors)
        elif follow is not None:
            followed = follow.read(log_sources(options, roots, root), errors)
        if options.probe:
            probes = node_probes(options, profile, cmdline, round(time.monotonic() - started, 4))
    # One reading at the end of the window; NVML's failures are in the sample (``unavailable``, ``error``).
    gpu_sample = gpu.read() if gpu is not None else None
    ticks, stacks = taken.ticks, taken.stacks
    bundle = NodeBundle(
        schema=BUNDLE_SCHEMA,
        collector_version=__version__,
        mode=options.mode,
        selector=selector,
        node=identity,
        clock=ClockReading(wall_s=wall, monotonic_s=started, duration_s=0.0, since_exec_s=since_exec),
        processes=processes,
        ticks=tuple(ticks),
        stacks=tuple(stacks),
        logs=logs,
        errors=tuple(errors),
        gpu=gpu_sample,
        probes=probes,
        follow=followed,
    )
    bundle = within_size(bundle, options.max_bytes)
    return replace(bundle, clock=replace(bundle.clock, duration_s=round(time.monotonic() - started, 4)))


# What a streaming controller may ask for, one word a line: the mode of the next bundle.
STREAM_REQUESTS = ("census", "full", "full-native")


def serve_requests(
    options: CollectOptions, requests: TextIO, out: TextIO, gpu: GpuSource | None = None
) -> int:
    """``collect --stream``: one bundle per request line until the input closes.

    One interpreter for a whole watch instead of one per round: the remote interpreter's start and
    imports (0.25 s of CPU on the node, 0.2-0.7 s of wall time here) and the ssh handshake are paid once,
    and a census round costs its window plus milliseconds. Each bundle is a fresh collection, exactly
    what the one-shot command prints; an unknown request is answered with a bundle of one error, so the
    controller's read never waits on a line that will not come.
    """
    follow = LogFollow()
    # One dumper for the session: our unwinder's libraries read once for every round, and its count of
    # its own stops (what a wait's wakeups are judged net of) carried from round to round.
    dumper: StackDumper | None = None
    for line in requests:
        word = line.strip()
        if not word:
            continue
        if word not in STREAM_REQUESTS:
            bundle = collect(replace(options, pids=(), match=None, mode=CollectMode.CENSUS, probe=False))
            bundle = replace(bundle, errors=(BundleError("select", f"unknown request {word[:40]!r}"),))
        elif word == "census":
            bundle = collect(replace(options, mode=CollectMode.CENSUS), gpu=gpu, follow=follow)
        else:
            dumper = dumper or StackDumper(native=options.native, engine_caches=registry.cache_folders())
            bundle = collect(
                replace(options, mode=CollectMode.FULL, samples=1, native=word == "full-native", log_lines=0),
                gpu=gpu,
                dumper=dumper,
            )
        # The process was running before the request was sent: its age says nothing of when it read.
        bundle = replace(bundle, clock=replace(bundle.clock, since_exec_s=0.0))
        out.write(codec.encode(bundle) + "\n")
        out.flush()
    return 0


def node_probes(
    options: CollectOptions, profile: Profile, cmdline: tuple[str, ...], t: float
) -> tuple[NodeProbe, ...]:
    """The readiness URL on the node, and whether its answer means anything (``Profile.dummy_health``)."""
    url = options.probe_url or profile.health_url(cmdline)
    if url is None:
        return ()
    result = probe_once(url, options.probe_timeout_s, t)
    dummy = None
    real_path, meaning = profile.dummy_probe_path, profile.dummy_health
    if real_path and meaning and result.outcome is ProbeOutcome.HTTP and result.status == 200:
        # The dummy app has no other route: ask the one the real server always serves.
        base = url.rsplit("/", 1)[0] if url.count("/") > 2 else url
        answer = probe_once(base + real_path, options.probe_timeout_s, t)
        status = answer.status if answer.outcome is ProbeOutcome.HTTP else None
        dummy = meaning(cmdline, result.status, status)
    return (NodeProbe(result, node_rank(cmdline), dummy),)


def take_rounds(
    options: CollectOptions,
    sampler: TreeSampler,
    dumper: StackDumper | None,
    *,
    started: float,
    sleep: Callable[[float], None],
    errors: list[BundleError],
    root: Path,
) -> _Rounds:
    """Census: two ticks ``every_s`` apart; full: ``samples`` rounds of a tick and a stack capture."""
    taken = _Rounds([], [], {}, {})
    rounds = 2 if options.mode is CollectMode.CENSUS else max(1, options.samples)
    for i in range(rounds):
        if i:
            # A round costs the pause plus a capture like the last one (later rounds are Python-only,
            # cheaper than a native first): do not start one the deadline would cut off.
            last = taken.stacks[-1].elapsed_s if taken.stacks else 0.1
            cost = options.every_s + max(0.2, 2 * last)
            if time.monotonic() - started + cost > options.deadline_s:
                note = f"stopped after {i} of {plural(rounds, 'round')} (deadline {options.deadline_s:g} s)"
                errors.append(BundleError("limits", note))
                break
            sleep(options.every_s)
        t = round(time.monotonic() - started, 4)
        reading = sampler.sample(t)
        members = reading.processes[:MAX_PROCESSES]
        if len(reading.processes) > MAX_PROCESSES and i == 0:
            note = f"{len(reading.processes)} processes matched; kept {MAX_PROCESSES}"
            errors.append(BundleError("limits", note))
        # Per-process read failures travel in the samples (ProcessSample.io_error), not beside them.
        taken.ticks.append(Tick(t=t, processes=members, exits=reading.exits))
        states = {p.pid: thread_states(p.pid, root) for p in members}
        if i == 0:
            taken.threads_before = states
        taken.threads_after = states
        if options.mode is CollectMode.FULL and dumper is not None:
            # Native frames in the first round only, as `hangwatch stacks` does: they cost the most.
            taken.stacks.append(dumper.capture(members, t, native=options.native and i == 0))
    return taken


def own_age(root: Path = procfs.PROC) -> float:
    """Seconds since this process started (/proc/self/stat starttime against /proc/uptime; 10 ms ticks)."""
    stat = procfs.read_stat(os.getpid(), root)
    try:
        uptime = float((root / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    if stat is None:
        return 0.0
    return round(max(0.0, uptime - stat.starttime_ticks / procfs.CLOCK_TICKS), 3)


def node_identity(root: Path = procfs.PROC) -> NodeIdentity:
    def read(path: str) -> str:
        try:
            return (root / path).read_text().strip()
        except OSError:
            return ""

    try:
        pid_ns = (root / "self" / "ns" / "pid").stat().st_ino
    except OSError:
        pid_ns = 0
    return NodeIdentity(
        hostname=socket.gethostname(),
        boot_id=read("sys/kernel/random/boot_id"),
        pid_ns=pid_ns,
        kernel=os.uname().release,
        sys_ptrace=has_sys_ptrace(read("self/status")),
    )


CAP_SYS_PTRACE = 19  # linux/capability.h


def has_sys_ptrace(status: str) -> bool | None:
    """CAP_SYS_PTRACE in the effective set, from /proc/self/status's ``CapEff`` (None when unreadable)."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
            except (IndexError, ValueError):
                return None
    return None


def select_roots(options: CollectOptions, root: Path, errors: list[BundleError]) -> tuple[list[int], str]:
    """The roots of the server's trees on this node: the topmost matching processes, never ourselves."""
    if options.pids:
        selector = "pid " + ",".join(str(p) for p in options.pids)
        found = [p for p in options.pids if procfs.read_stat(p, root) is not None]
        for p in sorted(set(options.pids) - set(found)):
            errors.append(BundleError("select", f"no process with PID {p} on this node", p))
        return found, selector
    if not options.match:
        errors.append(BundleError("select", "nothing to select: give --pid or --match"))
        return [], "nothing"
    selector = f"match {options.match!r}"
    try:
        pattern = re.compile(options.match)
    except re.error as exc:
        errors.append(BundleError("select", f"--match is not a regular expression: {exc}"))
        return [], selector
    roots = matching_roots(pattern, root)
    if not roots:
        errors.append(BundleError("select", f"no process matches {options.match!r} on this node"))
    return roots, selector


def thread_states(pid: int, root: Path) -> dict[int, tuple[ProcState, float]]:
    """tid -> (state, CPU seconds) for each thread; the names are read once, at the end."""
    task = root / str(pid) / "task"
    try:
        tids = sorted(int(t) for t in os.listdir(task) if t.isdigit())
    except OSError:
        return {}
    out: dict[int, tuple[ProcState, float]] = {}
    for tid in tids[: MAX_THREADS_PER_PROCESS * 4]:
        stat = procfs.read_stat(tid, task)
        if stat is not None:
            out[tid] = (stat.state, stat.cpu_s)
    return out


def node_processes(
    ticks: list[Tick], before: ThreadStates, after: ThreadStates, root: Path
) -> tuple[NodeProcess, ...]:
    if not ticks:
        return ()
    first = {p.pid: p for p in ticks[0].processes}
    span = max(ticks[-1].t - ticks[0].t, 1e-3)
    out = []
    for p in ticks[-1].processes:
        env = procfs.read_environ(p.pid, ENV_KEYS, root)
        start = first.get(p.pid)
        cores = (p.cpu_s - start.cpu_s) / span if start is not None and len(ticks) > 1 else 0.0
        threads = _threads(p, before.get(p.pid, {}), after.get(p.pid, {}), root)
        world = env.get("WORLD_SIZE", "")
        out.append(
            NodeProcess(
                pid=p.pid,
                ppid=p.ppid,
                name=p.name,
                role=p.role,
                rank=p.rank,
                rank_source=rank_source(p, env),
                world_size=int(world) if world.isdigit() else None,
                env=redact_environ(env),
                cpu_cores=round(max(0.0, cores), 4),
                threads=threads[:MAX_THREADS_PER_PROCESS],
                threads_omitted=max(0, len(threads) - MAX_THREADS_PER_PROCESS),
            )
        )
    return tuple(out)


def rank_source(p: ProcessSample, env: dict[str, str]) -> str | None:
    """Where the profile found the rank: an environment variable holding it, else the process title."""
    if p.rank is None:
        return None
    for key, source in _RANK_SOURCES:
        if env.get(key) == p.rank:
            return source
    return "title"


def _threads(
    p: ProcessSample,
    before: dict[int, tuple[ProcState, float]],
    after: dict[int, tuple[ProcState, float]],
    root: Path,
) -> tuple[ThreadState, ...]:
    out = []
    # The busiest first: when the cap cuts, it cuts idle helper threads.
    for tid, (state, cpu) in sorted(
        after.items(), key=lambda kv: -(kv[1][1] - before.get(kv[0], ("", kv[1][1]))[1])
    ):
        name = procfs.read_comm(tid, root / str(p.pid) / "task") or ""
        delta = cpu - before[tid][1] if tid in before else 0.0
        out.append(ThreadState(tid=tid, name=name, state=state, cpu_delta_s=round(max(0.0, delta), 4)))
    return tuple(out)


def log_sources(options: CollectOptions, roots: list[int], root: Path) -> list[tuple[str, Path]]:
    """The logs given, and the roots' stdout/stderr where those are files: (label, path)."""
    sources: list[tuple[str, Path]] = [(str(path), path) for path in options.logs]
    for pid in roots:
        for fd in (1, 2):
            target = procfs.fd_target(pid, fd, root)
            known = any(str(s[1]) == target for s in sources)
            if target and target.startswith("/") and not known and Path(target).is_file():
                sources.append((f"/proc/{pid}/fd/{fd} -> {target}", Path(target)))
    return sources


# Lines one log may send in one census round; the rest are counted (a log that floods is progress
# whatever it says, and a bundle a second must stay small).
FOLLOW_MAX_LINES = 200


class LogFollow:
    """The logs of a stream's watch, each followed from where it stood at the first request.

    One per ``collect --stream`` session: each census answers with the lines every log gained since the
    previous one, so the controller reads the node's log as the one-node watch reads its own (phases,
    exceptions, lines as progress) without a transfer of its whole tail each round.
    """

    def __init__(self) -> None:
        self._logs: dict[Path, FileLog] = {}

    def read(self, sources: list[tuple[str, Path]], errors: list[BundleError]) -> tuple[LogTail, ...]:
        out = []
        for label, path in sources:
            log = self._logs.get(path)
            if log is None:
                try:
                    self._logs[path] = FileLog(path)  # from its end: what it says from now on
                except OSError as exc:
                    errors.append(BundleError("log", f"{label}: {exc.strerror}"))
                continue
            try:
                chunk = log.drain()
            except OSError as exc:  # unreadable since (permissions changed, a directory now)
                errors.append(BundleError("log", f"{label}: {exc.strerror}"))
                continue
            lines = chunk.lines[:FOLLOW_MAX_LINES]
            out.append(
                LogTail(
                    label,
                    tuple(redact_text(line[:MAX_LOG_LINE]) for line in lines),
                    chunk.new_bytes,
                    len(chunk.lines) - len(lines),
                )
            )
        return tuple(out)


def log_tails(
    options: CollectOptions, roots: list[int], root: Path, errors: list[BundleError]
) -> tuple[LogTail, ...]:
    """The last lines of the logs given, and of the roots' stdout/stderr where those are files."""
    sources = log_sources(options, roots, root)
    out = []
    for label, path in sources:
        try:
            with path.open("rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - LOG_TAIL_BYTES))
                text = fh.read().decode("utf-8", "replace")
        except OSError as exc:
            errors.append(BundleError("log", f"{label}: {exc.strerror}"))
            continue
        lines = text.splitlines()[-options.log_lines :] if options.log_lines > 0 else []
        # Cleaned as every log line is (clean_text: whole escape sequences, control characters).
        out.append(LogTail(label, tuple(redact_text(clean_text(line)[:MAX_LOG_LINE]) for line in lines)))
    return tuple(out)


def within_size(bundle: NodeBundle, max_bytes: int) -> NodeBundle:
    """Drop the least useful parts until the encoded bundle fits, saying what was dropped."""

    def size(b: NodeBundle) -> int:
        return len(codec.encode(b).encode())

    if size(bundle) <= max_bytes:
        return bundle
    cuts: list[tuple[str, Callable[[NodeBundle], NodeBundle]]] = [
        ("log tails", lambda b: replace(b, logs=())),
        (
            "followed log lines (counted)",
            lambda b: replace(
                b,
                follow=tuple(
                    replace(f, lines=(), lines_omitted=f.lines_omitted + len(f.lines)) for f in b.follow
                ),
            ),
        ),
        (
            "thread details",
            lambda b: replace(b, processes=tuple(replace(p, threads=()) for p in b.processes)),
        ),
        ("stack rounds after the first", lambda b: replace(b, stacks=b.stacks[:1])),
        ("every stack", lambda b: replace(b, stacks=())),
    ]
    dropped = []
    for what, cut in cuts:
        bundle = cut(bundle)
        dropped.append(what)
        if size(bundle) <= max_bytes:
            break
    note = BundleError("limits", f"over {max_bytes} bytes: dropped {', '.join(dropped)}")
    return replace(bundle, truncated=True, errors=(*bundle.errors, note))
