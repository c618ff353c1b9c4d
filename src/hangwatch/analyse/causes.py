"""Rules that name a cause from process states, exit statuses and log findings.

Each rule is a small named function over model objects. Stack-based rules plug in beside them.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace

from hangwatch.analyse.stackranks import ended_rank
from hangwatch.analyse.stackranks import names_a_rank
from hangwatch.engines import registry
from hangwatch.engines.profile import COMPILE_OFF
from hangwatch.engines.profile import COMPILE_ON
from hangwatch.engines.profile import CUDA_GRAPHS_OFF
from hangwatch.engines.profile import EAGER
from hangwatch.model.rulebook import NearMiss
from hangwatch.model.samples import STOPPED_STATES
from hangwatch.model.samples import ExitHow
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import ProcState
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import Confidence
from hangwatch.words import plural

SHORT_LIVED_S = 2.0  # helpers (`which`, `ldconfig -p`, compiler probes) exit non-zero harmlessly

# How to find the kernel a GPU spins in without a debugger; where cuda-gdb named it, the verdict says so
# instead (analyse/gpukernels.steps_with_kernels).
FIND_THE_KERNEL = "Re-run with `CUDA_LAUNCH_BLOCKING=1` to find the kernel; "


def _with(purpose: str) -> list[tuple[str, str]]:
    """(flag, engine) of every engine that names a flag for ``purpose`` (Profile.next_step_flags)."""
    return [(flag, engine.label) for engine, flag in registry.flags_for(purpose)]


def _graphs_off() -> str:
    """Each engine's narrowest switch that boots without CUDA graphs: graphs off, else eager mode."""
    narrow = _with(CUDA_GRAPHS_OFF)
    named = {engine for _, engine in narrow}
    flags = narrow + [(flag, engine) for flag, engine in _with(EAGER) if engine not in named]
    return " or ".join(f"`{flag}` ({engine})" for flag, engine in flags)


def _compile_off() -> str:
    """Each engine's way to boot without torch.compile: a flag to add, or its flag that turns it on."""
    add = [f"`{flag}` ({engine})" for flag, engine in _with(COMPILE_OFF)]
    drop = [f"drop `{flag}` ({engine})" for flag, engine in _with(COMPILE_ON)]
    return " or ".join(add + drop)


def _engine_steps() -> dict[Cause, tuple[str, ...]]:
    """The steps that name the engines' flags (engines/registry.py)."""
    return {
        Cause.CUDA_GRAPH_CAPTURE: (
            f"A rank hangs inside CUDA graph capture: confirm with {_graphs_off()}; if that boots, shrink "
            "the captured batch sizes (`--cuda-graph-max-bs`, `--max-seq-len-to-capture`) or disable custom "
            "all-reduce during capture.",
        ),
        Cause.COMPILE_STALL: (
            *_COMPILE_STALL,
            f"To confirm: {_compile_off()} and boot again.",
        ),
    }


_COMPILE_STALL = (
    "Compilation or a JIT build is stuck: give each process its own cache dir "
    "(`TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`, `FLASHINFER_WORKSPACE_BASE`), and check for a hung "
    "`ninja`/`nvcc` child. A file lock (`flock`) ends with its holder: find the holder (`lslocks`), "
    "not the file; only a marker file no process holds (torch extensions' `lock`) is to be removed.",
)


class _NextSteps(Mapping[Cause, tuple[str, ...]]):
    """A cause's usual next steps: the common ones, with the engines' flags composed in when read (the
    registry's engines at that moment)."""

    def __init__(self, common: dict[Cause, tuple[str, ...]]) -> None:
        self._common = common
        self._memo: tuple[tuple[object, ...], dict[Cause, tuple[str, ...]]] | None = None

    def _all(self) -> dict[Cause, tuple[str, ...]]:
        key = tuple(registry.ENGINES)
        if self._memo is None or self._memo[0] != key:
            engines = _engine_steps()
            self._memo = (key, {cause: engines.get(cause, steps) for cause, steps in self._common.items()})
        return self._memo[1]

    def __getitem__(self, cause: Cause) -> tuple[str, ...]:
        return self._all()[cause]

    def __iter__(self) -> Iterator[Cause]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


_COMMON_STEPS: dict[Cause, tuple[str, ...]] = {
    Cause.STOPPED: (
        "A stopped process (state T) stops its peers: resume it with `kill -CONT PID` if that was not "
        "intended, or check whether a debugger or job control stopped it.",
    ),
    Cause.IO_WAIT: (
        "Processes sit in uninterruptible I/O (state D): check the filesystem the weights or caches are on "
        "(`cat /proc/PID/wchan`, `dmesg`), and network mounts.",
    ),
    Cause.DEAD_PEER: (
        "A process of the tree died and its peers wait for it forever: read its last log lines; "
        "`dmesg -T | grep -i oom` if it was killed by SIGKILL.",
    ),
    Cause.OOM_KILLED: (
        "The kernel OOM killer ended a process: give the host more RAM, load fewer shards at once, "
        "or lower the engine's CPU memory (swap space, pinned memory, workers).",
    ),
    Cause.CUDA_OOM: (
        "The GPU ran out of memory: lower --gpu-memory-utilization / --mem-fraction-static, "
        "--max-model-len or the CUDA graph batch sizes, and check no stale process holds GPU memory.",
    ),
    Cause.PORT_IN_USE: (
        "The port is taken: find the owner with `ss -ltnp 'sport = :PORT'`; a previous server may still be "
        "running (hangwatch cleanup --port PORT stops that tree).",
    ),
    Cause.EXCEPTION: ("Read the traceback above; the first exception in the log is usually the root cause.",),
    Cause.COLLECTIVE_WAIT: (
        "Look at the odd ones out first: the ranks that are not in the collective are where the hang is; "
        "`hangwatch stacks --pid PID` shows them again.",
        "Re-run with `TORCH_DISTRIBUTED_DEBUG=DETAIL` to see the last collective each rank entered.",
        "With NCCL: `NCCL_DEBUG=INFO` prints its last operations; `TORCH_NCCL_TRACE_BUFFER_SIZE=2000` "
        "enables the Flight Recorder for the next hang.",
        "If every rank waits in the same collective: `NCCL_P2P_DISABLE=1` (and `NCCL_CUMEM_ENABLE=0`), "
        "`--disable-custom-all-reduce`, one change at a time; run a 2-rank all_reduce outside the engine.",
    ),
    Cause.RENDEZVOUS_WAIT: (
        "Some ranks never joined the group: check that every rank was started (all nodes, "
        "`--nnodes`/`--node-rank`), that MASTER_ADDR/MASTER_PORT (or the init method) are the same "
        "everywhere and reachable, and that no firewall blocks the port.",
        "`TORCH_DISTRIBUTED_DEBUG=DETAIL` on every rank prints which ranks checked in.",
        "With NCCL: `NCCL_DEBUG=INFO` on every rank prints its communicators' set-up.",
    ),
    Cause.LOCK_DEADLOCK: (
        "Threads or processes wait for locks each other holds: read the `with ...lock` lines in the "
        "stacks; take the locks in one global order, or use a timeout on acquire to break the cycle.",
        "`py-spy dump --pid PID --locals` shows which lock objects each thread holds.",
        "For file locks (`flock`, `fcntl`), `lslocks` shows who holds each.",
    ),
    Cause.WAIT_CYCLE: (
        "Each process named waits for a message or an exit that only another of them can give: read "
        "the stacks for the receive each one is in and the send that should have come first; send before "
        "you receive on one side, or give the receive a timeout, to break the cycle.",
        "`ls -l /proc/PID/fd` and `cat /proc/PID/task/*/syscall` show which pipe or socket each one reads.",
    ),
    Cause.CUDA_GRAPH_CAPTURE: (),  # the engines' flags: _engine_steps()
    Cause.COMPILE_STALL: (),
    Cause.GPU_SPIN: (
        "The host waits for the GPU and the GPU never finishes: a kernel spinning on a flag "
        "(100 % utilisation at low power, GPM pipes idle) or a stream waiting on an event that never fires. "
        f"{FIND_THE_KERNEL}try `--disable-custom-all-reduce` and "
        "`NCCL_P2P_DISABLE=1`; a GPU left at 100 % after the process died needs a reset.",
    ),
    Cause.IDLE: (
        "Nothing is stuck: the tree waits for work. Send it a request (`curl http://HOST:PORT/health`, a "
        "completion) and take the stacks again while it is in flight; a wedge shows then.",
    ),
    Cause.UNKNOWN: (
        "Take stacks of every rank (`hangwatch stacks --pid PID`, or `py-spy dump --pid PID` for each) "
        "to see "
        "where each process waits.",
    ),
}
NEXT_STEPS: Mapping[Cause, tuple[str, ...]] = _NextSteps(_COMMON_STEPS)


@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    culprits: tuple[int, ...]
    explanation: str
    confidence: Confidence | None = None  # stack rules say how sure they are
    # Nothing inside the tree can end this wait (ranks waiting on each other, a stopped or dead peer,
    # a lock cycle): the verdict need not wait out the whole stall window.
    closed: bool = False
    evidence: tuple[str, ...] = ()
    # Next steps that fit this case better than the cause's usual ones (a rejected command line).
    steps: tuple[str, ...] = ()
    # The rules that decided it, in order (ids of analyse/rulebook.py): the one that named it first.
    rules: tuple[str, ...] = ()
    # Where no rule named a cause: the rules that came closest, and what each lacked.
    near: tuple[NearMiss, ...] = ()


def is_significant_failure(exit_: ExitRecord, is_root: bool) -> bool:
    """A death that matters: the launched command, any death by signal, or a failed long-lived process."""
    if not exit_.failed:
        return False
    if is_root or exit_.signal is not None:
        return True
    return _mattered(exit_)


def _mattered(e: ExitRecord) -> bool:
    """A member its peers need: a role, a rank (its profile's or its title's: ``gloo_rank1``), or one
    that lived long enough not to be a helper."""
    return e.role is not None or names_a_rank(e.name, e.rank) or (e.lifetime_s or 0.0) >= SHORT_LIVED_S


def ended_unseen(e: ExitRecord) -> bool:
    """A member that mattered (a role, a rank, or long-lived) ended, and its parent reaped it before its
    status could be read: as good as dead to the peers that wait for it."""
    return e.how is ExitHow.VANISHED and _mattered(e)


def stopped_processes(tick: Tick) -> tuple[int, ...]:
    """Rule ``stopped``: processes in state T (job control) or t (stopped by a tracer)."""
    return tuple(p.pid for p in tick.processes if p.state in STOPPED_STATES)


def io_waiting_processes(window: Sequence[Tick], share: float = 0.8) -> tuple[int, ...]:
    """Rule ``io-wait``: processes in uninterruptible sleep (D) for most of the window."""
    if not window:
        return ()
    counts: dict[int, int] = {}
    for tick in window:
        for p in tick.processes:
            if p.state == ProcState.DISK_SLEEP:
                counts[p.pid] = counts.get(p.pid, 0) + 1
    return tuple(sorted(pid for pid, n in counts.items() if n >= share * len(window)))


@dataclass(frozen=True)
class StallFacts:
    """What the state-and-log rules of a stall read."""

    window: Sequence[Tick]
    findings: Sequence[LogFinding]


def _state_stopped(f: StallFacts) -> Diagnosis | None:
    last = f.window[-1]
    stopped = stopped_processes(last)
    if not stopped:
        return None
    text = f"{_names(last, stopped)} stopped (state T); the rest of the tree waits for it"
    return Diagnosis(Cause.STOPPED, stopped, text)


def _state_io_wait(f: StallFacts) -> Diagnosis | None:
    in_d = io_waiting_processes(f.window)
    if not in_d:
        return None
    return Diagnosis(Cause.IO_WAIT, in_d, f"{_names(f.window[-1], in_d)} in uninterruptible I/O (state D)")


def latest_finding(findings: Sequence[LogFinding], cause: Cause) -> LogFinding | None:
    """The last line the log reported of ``cause`` (the rules name the latest, as they always have)."""
    return next((f for f in reversed(findings) if f.cause is cause), None)


def _log_says(cause: Cause) -> Callable[[StallFacts], Diagnosis | None]:
    """The rule for one cause the log can name: its latest line, and nothing moved since."""

    def rule(f: StallFacts) -> Diagnosis | None:
        found = latest_finding(f.findings, cause)
        if found is None:
            return None
        text = f"the log reported it and nothing moved since: {found.line[:200]}"
        owner = port_held_by_tree(found.line, f.window) if cause is Cause.PORT_IN_USE else None
        return Diagnosis(cause, (), f"{text}; {owner}" if owner else text)

    return rule


def _log_none(f: StallFacts) -> Diagnosis:
    return Diagnosis(Cause.UNKNOWN, (), "no process state or log line names a cause")


# The cause of a stall from process states and the log (the stacks refine ``unknown``), in the order
# tried: a state is certain and current, a log line may be old; of the log's causes the most specific
# first. The book's "state" section lists them in this order.
STALL_RULES: tuple[tuple[str, Callable[[StallFacts], Diagnosis | None]], ...] = (
    ("state:stopped", _state_stopped),
    ("state:io-wait", _state_io_wait),
    ("log:cuda-oom", _log_says(Cause.CUDA_OOM)),
    ("log:port-in-use", _log_says(Cause.PORT_IN_USE)),
    ("log:exception", _log_says(Cause.EXCEPTION)),
    ("log:none", _log_none),
)


def diagnose_stall(window: Sequence[Tick], findings: Sequence[LogFinding]) -> Diagnosis:
    """Name the cause of a stall from states and log text alone: the first rule of ``STALL_RULES``."""
    facts = StallFacts(window, findings)
    for rule_id, rule in STALL_RULES:
        found = rule(facts)
        if found is not None:
            return replace(found, rules=(rule_id,))
    raise AssertionError("log:none always holds")


# A port in a bind error: "('127.0.0.1', 33105)", "0.0.0.0:8000", "[::]:8000", "port 8000". Not any
# number after a colon: the line's own timestamp (14:48:54) has those.
_PORT_IN_LINE = re.compile(
    r"""['"],\s*(\d{1,5})\)"""
    r"|(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-fA-F:.]*\]|localhost|[\w-]+(?:\.[\w-]+)+):(\d{1,5})\b"
    r"|\bport[\s=:]+(\d{1,5})\b",
    re.IGNORECASE,
)


def ports_in_line(line: str) -> tuple[int, ...]:
    """The ports a bind error names, in the order written (``_PORT_IN_LINE``'s shapes only)."""
    found = (int(n) for groups in _PORT_IN_LINE.findall(line) for n in groups if n)
    return tuple(dict.fromkeys(n for n in found if 0 < n < 65536))


def port_held_by_tree(line: str, window: Sequence[Tick]) -> str | None:
    """Who holds the port a bind was refused on, when a member of the tree itself listens on it.

    An engine picks its internal ports (ZeroMQ, gloo, its store) at random, and one of them can take the
    port its HTTP server is told to bind: SGLang's scheduler held the launcher's --port in a fault-matrix
    run (2026-12-04), and the launcher then waited forever in its shutdown. "A previous server may still
    run" is then the wrong lead: the owner is inside the tree, and a new start picks other ports."""
    wanted = set(ports_in_line(line))
    if not wanted:
        return None
    for tick in reversed(window):
        for p in tick.processes:
            held = wanted.intersection(p.listening_ports)
            if held:
                port = min(held)
                return (
                    f"port {port} is held by {p.name}[{p.pid}] of this very tree, not by another server: "
                    "the tree took its own port (an engine picks its internal ports at random), so start it "
                    "again or give the server another port"
                )
    return None


# Two events closer than this are not ordered: a line's arrival and a death are stamped by two threads.
SIMULTANEOUS_S = 0.02
# Deaths by a signal this close together are one tear-down, not one fault and its consequences.
TEAR_DOWN_S = 1.0
# An exception logged this close after the first kill of a tear-down was its reason: the line and the
# deaths are stamped by two threads (a followed log file is read when inotify says it was written).
# No wider: SGLang's TP0 raised 57 ms after TP1 was SIGKILLed (its barrier failed), and that exception
# is the kill's consequence; vLLM's "Engine core initialization failed" after a lone kill comes later.
AROUND_S = 0.045
# A rank that died this long before every other rank was killed on its own, not by a tear-down.
LONE_RANK_S = 0.1
# A killed process's sockets close before its exit is noticed: a peer's exception this long before a
# rank's death notice can be the peer noticing it (78 ms in vllm-tp2-TP0-serving-sigkill-run).
NOTICE_LAG_S = 0.3
# Deaths this close together were one act (one process killing its children in a loop: 12 ms for two).
TOGETHER_S = 0.05
# A member that ended with its status unread this long before the first failure may be where it began.
UNSEEN_BEFORE_S = 5.0
# A rank's peers take longer to give up on it: vLLM's engine core waits 5 s for a dead worker to exit,
# SIGTERMs the others, waits 4 s more, SIGKILLs them and only then raises (its first traceback 10 s
# after the worker's death in vllm-tp2-TP1-compile-sigkill-run).
UNSEEN_RANK_BEFORE_S = 15.0


def diagnose_crash(
    failures: Sequence[ExitRecord],
    findings: Sequence[LogFinding],
    root_pids: set[int],
    exits: Sequence[ExitRecord] = (),
    last_lines: Sequence[str] = (),
    *,
    survivors: int = 0,
    window: Sequence[Tick] = (),
) -> Diagnosis:
    """Name the cause of a crash: the first fault in time, with what came after it as consequences.

    ``survivors``: processes of the tree still running at the verdict (a launcher killed leaves its
    engine's processes behind it: they lost the one they served). ``window``: the latest ticks, whose
    byte counts say who wrote an exception no line names.

    Deaths (stamped the moment a pidfd says a process ended) and log findings (stamped when the line
    arrived) of the whole tree are ordered in time. The first failure decides:

    - a process that died by a signal (SIGKILL from the OOM killer or an operator, a crash) before
      any exception was logged: the exceptions other processes raise after it ("Engine core
      initialization failed", a peer's "Connection closed by peer") are its consequences;
    - a process that exited with an error status, or an exception logged before the first death by
      a signal: the exception is the fault, and the deaths that follow (a launcher tearing its tree
      down with SIGKILL) are what was done about it. Its writer, where the line names it (vLLM's
      ``(EngineCore pid=N)``, SGLang's ``TP1``), is the culprit.
    """
    facts = _crash_facts(
        failures, findings, root_pids, exits, last_lines, survivors=survivors, window=tuple(window)
    )
    for rule_id, rule in CRASH_RULES:
        found = rule(facts)
        if found is not None:
            return replace(found, rules=(rule_id,))
    raise AssertionError("crash:no-traceback always holds")


@dataclass(frozen=True)
class CrashFacts:
    """What the crash rules read: the failures ordered in time, the first of them, and whether an exception
    was raised before it (the one judgement most rules turn on, made once)."""

    findings: Sequence[LogFinding]
    root_pids: set[int]
    exits: Sequence[ExitRecord]
    last_lines: Sequence[str]
    survivors: int
    window: Sequence[Tick]
    ordered: tuple[ExitRecord, ...]  # failures, deaths unseen and ranks that left early, in time
    exceptions: tuple[LogFinding, ...]  # in time
    raised_first: bool

    @property
    def first(self) -> ExitRecord:
        return self.ordered[0]

    @property
    def culprits(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(f.pid for f in self.ordered))

    def latest(self, cause: Cause) -> LogFinding | None:
        return latest_finding(self.findings, cause)


def _crash_facts(
    failures: Sequence[ExitRecord],
    findings: Sequence[LogFinding],
    root_pids: set[int],
    exits: Sequence[ExitRecord],
    last_lines: Sequence[str],
    *,
    survivors: int,
    window: Sequence[Tick],
) -> CrashFacts:
    first_exception_t = min((f.t for f in findings if f.cause is Cause.EXCEPTION), default=None)
    unseen = _unseen_deaths(failures, exits, root_pids, first_exception_t)
    left = _left_early(
        failures, exits, root_pids, first_exception_t=first_exception_t, findings=findings, window=window
    )
    ordered = sorted([*failures, *unseen, *left], key=lambda f: (f.t, f.signal is None))
    first = ordered[0]
    exceptions = sorted((f for f in findings if f.cause is Cause.EXCEPTION), key=lambda f: f.t)
    raised_first = (
        bool(exceptions)
        and exceptions[0].t < first.t - SIMULTANEOUS_S
        and not _noticed_before_its_end(first, ordered, exceptions)
        and not (_silent(first, exceptions, window) and _noticed(first, ordered, exceptions))
        and not _echo_of_its_exit(first, exceptions, exits, window)
    )
    if (
        not raised_first
        and exceptions
        and _torn_down(ordered)
        and exceptions[0].t <= first.t + AROUND_S
        and not _rank_died_alone(first, ordered, exceptions, window)
        and not _left_of_its_own(first, exceptions, window)
    ):
        # Several processes killed at once, an exception logged around the first kill: a launcher tearing
        # its tree down because of it (SGLang's, on a scheduler's SIGQUIT). Two threads stamp the line
        # and the deaths; the tear-down says which came first.
        raised_first = True
    if not raised_first and exceptions and _killed_by_writer(first, ordered, exceptions, window):
        raised_first = True
    return CrashFacts(
        findings,
        root_pids,
        exits,
        last_lines,
        survivors,
        window,
        tuple(ordered),
        tuple(exceptions),
        raised_first,
    )


def _crash_cuda_oom(f: CrashFacts) -> Diagnosis | None:
    oom = f.latest(Cause.CUDA_OOM)
    if oom is None:
        return None
    return Diagnosis(Cause.CUDA_OOM, f.culprits, f"{_death(f.first)} after: {oom.line[:200]}")


def _crash_oom_killed(f: CrashFacts) -> Diagnosis | None:
    k = next((e for e in f.ordered if e.signal == signal.SIGKILL and e.oom_evidence), None)
    if k is None:
        return None
    return Diagnosis(Cause.OOM_KILLED, (k.pid,), f"{_death(k)} was OOM-killed: {k.oom_evidence}")


def _crash_port_in_use(f: CrashFacts) -> Diagnosis | None:
    taken = f.latest(Cause.PORT_IN_USE)
    if taken is None:
        return None
    owner = port_held_by_tree(taken.line, f.window)
    text = f"{_death(f.first)}: {taken.line[:200]}"
    return Diagnosis(Cause.PORT_IN_USE, f.culprits, f"{text}; {owner}" if owner else text)


def _crash_death_first(f: CrashFacts) -> Diagnosis | None:
    if f.raised_first or not (f.first.signal is not None or f.first.how is ExitHow.VANISHED):
        return None
    return _death_first(f.first, f.ordered, f.exceptions, f.first.pid in f.root_pids, survivors=f.survivors)


def _crash_left_silently(f: CrashFacts) -> Diagnosis | None:
    # It exited of its own (os._exit, a clean exit of one rank) and wrote none of the traceback: the
    # exception is a peer noticing it gone (gloo's "Connection closed by peer" 1 ms after the exit).
    if (
        not f.exceptions
        or f.raised_first
        or f.first.pid in f.root_pids
        or not _silent(f.first, f.exceptions, f.window)
    ):
        return None
    return _death_first(f.first, f.ordered, f.exceptions, False, survivors=f.survivors)


def _crash_exception_first(f: CrashFacts) -> Diagnosis | None:
    if not f.exceptions:
        return None
    raiser = _raiser(f.exceptions, f.ordered, f.exits, f.window)
    # Nobody is named when nothing says who wrote it: every process that died is not the writer.
    pids = (raiser,) if raiser is not None else ()
    who = _describe_pid(raiser, f.ordered, f.exits) if raiser is not None else "a process of the tree"
    text = f"{who} raised an exception first: {_exception_summary(f.findings)}"
    signalled = [e for e in f.ordered if e.signal is not None]
    if signalled:
        text += f"; then {plural(len(signalled), 'process')} killed by a signal (the tree torn down)"
    return Diagnosis(Cause.EXCEPTION, pids, text)


def _crash_dead_peer(f: CrashFacts) -> Diagnosis | None:
    if f.first.pid in f.root_pids or f.first.signal in _NATIVE_CRASHES:
        return None
    return Diagnosis(Cause.DEAD_PEER, (f.first.pid,), f"{_death(f.first)}; the rest of the tree waits for it")


def _crash_vanished(f: CrashFacts) -> Diagnosis | None:
    return Diagnosis(Cause.UNKNOWN, f.culprits, _death(f.first)) if f.first.how is ExitHow.VANISHED else None


def _crash_no_traceback(f: CrashFacts) -> Diagnosis:
    return _without_traceback(f.first, f.culprits, f.last_lines)


# The first fault of a crash, in the order tried: a message that names the fault outright (memory, a
# port) first; then who came first in time, a death or an exception; then what is left. The book's
# "crash" section lists them in this order.
CRASH_RULES: tuple[tuple[str, Callable[[CrashFacts], Diagnosis | None]], ...] = (
    ("crash:cuda-oom", _crash_cuda_oom),
    ("crash:oom-killed", _crash_oom_killed),
    ("crash:port-in-use", _crash_port_in_use),
    ("crash:death-first", _crash_death_first),
    ("crash:left-silently", _crash_left_silently),
    ("crash:exception-first", _crash_exception_first),
    ("crash:dead-peer", _crash_dead_peer),
    ("crash:vanished", _crash_vanished),
    ("crash:no-traceback", _crash_no_traceback),
)


_NATIVE_CRASHES = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
_USAGE = re.compile(
    r"\berror: (?:unrecognized arguments|argument |the following arguments are required)|^usage: "
)

NATIVE_CRASH_STEPS = (
    "A native crash (no Python traceback): re-run with `PYTHONFAULTHANDLER=1` to get the Python stack "
    "at the crash, allow a core dump (`ulimit -c unlimited`, then `gdb python core`), and read "
    "`dmesg -T | tail` for the faulting library.",
)


def _without_traceback(first: ExitRecord, culprits: tuple[int, ...], last_lines: Sequence[str]) -> Diagnosis:
    """No traceback and no known message: what the process said last, and next steps that fit it."""
    said = next((line for line in reversed(last_lines) if _USAGE.search(line)), None)
    if first.exit_code == 2 and said is not None:
        text = f"{_death(first)}: the command line was rejected: {said.strip()[:200]}"
        steps = (
            "The program rejected its command line (exit 2, a usage error): fix the flag it names "
            "(`--help` lists them), then run again.",
        )
        return Diagnosis(Cause.UNKNOWN, culprits, text, steps=steps)
    if first.signal in _NATIVE_CRASHES:
        return Diagnosis(
            Cause.UNKNOWN,
            culprits,
            f"{_death(first)}: a native crash, no Python traceback",
            steps=NATIVE_CRASH_STEPS,
        )
    text = f"{_death(first)} without a traceback or known message in the log"
    if last_lines:
        text += f"; its last words: {last_lines[-1].strip()[:200]}"
    steps = (
        "Read the last lines of its output (in the evidence, and the run's log): what it said before it "
        "ended.",
    )
    return Diagnosis(Cause.UNKNOWN, culprits, text, steps=steps)


def _rank_died_alone(
    first: ExitRecord,
    ordered: Sequence[ExitRecord],
    exceptions: Sequence[LogFinding],
    window: Sequence[Tick] = (),
) -> bool:
    """The first death is a rank's (or an engine process's), the other ranks died ``LONE_RANK_S`` or more
    after it, or a much lighter member after it, and the exception is not its own: it was killed on its
    own, before any tear-down.

    Why the order of deaths says more than the exception's stamp: a process killed with a large memory
    map takes tens to hundreds of milliseconds to exit, and its sockets close only near the end, so
    its peers' exceptions ("Rank 1 failed to pass monitoredBarrier") come within milliseconds of its
    death notice, either side (8 ms before it in sglang-tp2-TP1-weights-sigkill-attach). A launcher's
    tear-down kills everything at once: its first death is a small helper (multiprocessing's resource
    tracker, 15-20 ms after the exception), the ranks 200-400 ms later.
    """
    # A member of the engine (a rank, or a role such as SGLang's TP=1 scheduler), not a helper: a
    # tear-down's first death is a small helper, which must not pass for a process killed on its own.
    if (first.rank is None and first.role is None) or first.signal is None:
        return False
    if any(
        (first.rank is not None and f.rank == first.rank) or (f.pid is not None and f.pid == first.pid)
        for f in exceptions[:1]
    ):
        return False
    others = [e.t for e in ordered if e.rank is not None and e.rank != first.rank and e.pid != first.pid]
    if others and min(others) - first.t >= LONE_RANK_S:
        return True
    return _died_before_a_lighter_one(first, ordered, window)


# A member with this share of the first death's memory, or less, ends first when both are killed at once.
LIGHTER = 0.25


def _died_before_a_lighter_one(
    first: ExitRecord, ordered: Sequence[ExitRecord], window: Sequence[Tick]
) -> bool:
    """A member with a fraction of ``first``'s memory was killed after it: killed at once, the lighter
    one would have ended first (a killed process ends once its memory is unmapped: the resource tracker
    15-20 ms after the signal, the ranks 200-400 ms), so ``first`` was killed before the others were.

    sglang-tp2-TP1-weights-sigkill-attach (2026-12-04): TP1 (623 MB) ended 4 ms before TP0's exception
    was stamped, the resource tracker (15 MB) 10 ms after it, TP0 87 ms after TP1, less than
    ``LONE_RANK_S``: the launcher's tear-down was taken for the reason of TP1's death."""
    rss = {p.pid: p.rss_bytes for tick in window for p in tick.processes}
    mine = rss.get(first.pid, 0)
    return mine > 0 and any(
        e.pid != first.pid
        and e.signal is not None
        and 0.0 < e.t - first.t <= TEAR_DOWN_S
        and 0 < rss.get(e.pid, 0) <= LIGHTER * mine
        for e in ordered
    )


def _left_of_its_own(first: ExitRecord, exceptions: Sequence[LogFinding], window: Sequence[Tick]) -> bool:
    """``first`` ended with a status of its own (no signal: a tear-down kills) and wrote none of the first
    traceback: it is no kill of a tear-down, and an exception stamped just after it is a peer's echo.

    sglang-tp2-TP1-weights-exit0-run (full matrix, 2026-12-04): TP1 ``sys.exit(0)`` while loading; TP0's
    post-load barrier raised "other ranks that didn't finish loading" 19 ms after TP1's end, the launcher
    SIGKILLed the tree 4 ms after that, and the tear-down rule took TP0's exception for its reason."""
    return first.signal is None and first.exit_code is not None and _silent(first, exceptions, window)


def _noticed_before_its_end(
    first: ExitRecord, ordered: Sequence[ExitRecord], exceptions: Sequence[LogFinding]
) -> bool:
    """A rank ended alone without a word, and the exception just before its death notice is a peer's
    that lives on: the peer saw its sockets close, which happens before a killed process's exit ends.

    vllm-tp2-TP0-serving-sigkill-run (2026-12-02): TP1 logged "Connection reset by peer" 78 ms before
    TP0's end was noticed; TP1 lived 5 s more. A raiser's tear-down kills the raiser with the rest, or
    the raiser is the one that ends."""
    if first.rank is None or not (first.signal is not None or first.how is ExitHow.VANISHED):
        return False
    return _noticed(first, ordered, exceptions)


def _echo_of_its_exit(
    first: ExitRecord, exceptions: Sequence[LogFinding], exits: Sequence[ExitRecord], window: Sequence[Tick]
) -> bool:
    """``first`` ended of its own (an exit status, no signal), wrote none of the first traceback, and every
    exception before its death notice came at most ``NOTICE_LAG_S`` before it, with no other member ending
    in between: the traceback is a peer's echo of its going, not what made it go.

    Its sockets close before its parent can be told it ended, and the peer in a collective with it raises
    at once; the notice then waits for our watcher thread, which a loaded machine delays past the
    traceback (CI, 2026-12-04: gloo's "Connection closed by peer" stamped before ``os._exit(3)``'s notice,
    taken for the cause). A process that exits quietly because of a peer's error mostly learns of it when
    the peer ends (its socket closes, its parent dies), and that end then comes first; one told to quit by
    a message while the raiser lives on would be misread (the engines tear down with signals instead)."""
    if not exceptions or not _left_of_its_own(first, exceptions, window):
        return False
    echo = exceptions[0]  # the earliest: every one before the notice is within the lag once it is
    if not first.t - NOTICE_LAG_S <= echo.t < first.t:
        return False
    return not any(e.pid != first.pid and echo.t <= e.t <= first.t for e in exits)


def _noticed(first: ExitRecord, ordered: Sequence[ExitRecord], exceptions: Sequence[LogFinding]) -> bool:
    lead = [f for f in exceptions if first.t - NOTICE_LAG_S <= f.t < first.t]
    if not lead or len(lead) != len([f for f in exceptions if f.t < first.t]):
        return False  # an exception long before the death: it came first
    writers = {f.rank or (str(f.pid) if f.pid is not None else None) for f in lead}
    if None in writers or first.rank in writers or str(first.pid) in writers:
        return False
    others = [e.t for e in ordered if e.pid != first.pid]
    return all(t - first.t >= LONE_RANK_S for t in others)


def _killed_by_writer(
    first: ExitRecord, ordered: Sequence[ExitRecord], exceptions: Sequence[LogFinding], window: Sequence[Tick]
) -> bool:
    """The first deaths are two or more children of one process, killed together, and that process then
    logs the exception: it caught its own error and killed its children before logging it.

    vLLM's engine core raising in ``wait_for_ready`` (vllm-tp2-core-weights-raise-run, 2026-12-02)
    SIGTERMed both workers within 12 ms and logged its traceback 67 ms after the first, later than any
    stamp can be trusted to order. Timing cannot tell it from a lone kill and its echo (a peer's
    exception 57 ms after a rank's SIGKILL); the structure does: a kill from outside takes one process,
    and the peer that notices is not the parent of what died."""
    writer = next((f.pid for f in exceptions if f.pid is not None and f.t <= exceptions[0].t + 1.0), None)
    if writer is None or exceptions[0].t - first.t > TEAR_DOWN_S:
        return False
    parents = {p.pid: p.ppid for tick in window for p in tick.processes}
    burst = [e for e in ordered if e.signal is not None and e.t - first.t <= TOGETHER_S]
    # One hand kills with one signal: a first death by another signal than the rest was not the writer's
    # doing (torch.multiprocessing.spawn: rank 1 SIGKILLed from outside, its parent then SIGTERMs rank 0
    # within milliseconds and raises "process 1 terminated with signal SIGKILL": the launcher was
    # blamed, 2026-12-04, issue 23).
    one_signal = len({e.signal for e in burst}) == 1
    return len(burst) >= 2 and one_signal and all(parents.get(e.pid) == writer for e in burst)


def _torn_down(ordered: Sequence[ExitRecord]) -> bool:
    """Two or more processes killed by a signal within ``TEAR_DOWN_S`` of the first death."""
    signalled = [f for f in ordered if f.signal is not None]
    return len({f.pid for f in signalled if f.t - ordered[0].t <= TEAR_DOWN_S}) >= 2


def _unseen_deaths(
    failures: Sequence[ExitRecord],
    exits: Sequence[ExitRecord],
    root_pids: set[int],
    first_exception_t: float | None = None,
) -> list[ExitRecord]:
    """Members that ended before the first failure, shortly before the first sign of trouble (a
    failure or an exception), their status unknown (their parent reaped them before it could be
    read): a rank SIGKILLed and reaped at once is one of these, and the engine core that logs its
    death, then kills the other ranks seconds later, is its consequence."""
    if not failures:
        return []
    first_failure = min(f.t for f in failures)
    start = min(first_failure, first_exception_t if first_exception_t is not None else first_failure)

    def window(e: ExitRecord) -> float:
        return UNSEEN_RANK_BEFORE_S if e.rank is not None or e.role is not None else UNSEEN_BEFORE_S

    return [
        e
        for e in exits
        if ended_unseen(e) and e.pid not in root_pids and start - window(e) <= e.t <= first_failure
    ]


def _left_early(
    failures: Sequence[ExitRecord],
    exits: Sequence[ExitRecord],
    root_pids: set[int],
    *,
    first_exception_t: float | None,
    findings: Sequence[LogFinding],
    window: Sequence[Tick],
) -> list[ExitRecord]:
    """A rank that ended cleanly (exit 0) while its peers ran on, before the first sign of trouble, and
    wrote none of the first traceback: its peers' failures are what its leaving did to them.

    A rank that leaves its group early (``sys.exit(0)`` on a code path it should not take) closes its
    sockets, and a peer in a collective with it raises within milliseconds ("Connection closed by peer").
    Only a rank (named by its profile or title) counts, and only when another rank fails after it: a
    helper pool finishing its work, or every rank ending at the end of a job, is no fault."""
    starts = [f.t for f in failures]
    if first_exception_t is not None:
        starts.append(first_exception_t)
    if not starts:
        return []
    start = min(starts)
    raised = sorted((f for f in findings if f.cause is Cause.EXCEPTION), key=lambda f: f.t)
    ranked = {p.name for tick in window for p in tick.processes if names_a_rank(p.name, p.rank)}
    ranked |= {e.name for e in exits if names_a_rank(e.name, e.rank)}
    candidates = [
        e
        for e in exits
        if e.exit_code == 0
        and e.pid not in root_pids
        and ended_rank(e.name, e.rank, ranked)
        and start - UNSEEN_RANK_BEFORE_S <= e.t <= start + NOTICE_LAG_S
        and (not raised or _silent(e, raised, window))
    ]
    failed_ranks = [
        f for f in (*failures, *exits) if (f.failed or ended_unseen(f)) and names_a_rank(f.name, f.rank)
    ]
    return [e for e in candidates if any(f.pid != e.pid and f.t >= e.t for f in failed_ranks)][:1]


def _silent(e: ExitRecord, exceptions: Sequence[LogFinding], window: Sequence[Tick]) -> bool:
    """``e`` provably wrote less than the first traceback (``exceptions`` in time order) from the last
    tick before it to its end: not its writer. Unknown bytes prove nothing."""
    line = exceptions[0]
    if line.pid is not None:
        return line.pid != e.pid
    if line.rank and e.rank:
        return line.rank != e.rank
    before = _wchar_before(line.t, window)
    if e.wchar_at_end is None or e.pid not in before:
        return False
    return e.wchar_at_end - before[e.pid] < _first_traceback_bytes(exceptions)


def _first_traceback_bytes(exceptions: Sequence[LogFinding]) -> int:
    """What the writer of the first traceback wrote at least: its first line, and where that is Python's
    header, the line that ends it (the next finding stamped with it that is not a header).

    The header alone is 35 bytes, less than a rank's own "entering ..." line written just before it
    left: gloo_missing_collective's rank 1 wrote 122 bytes after the last tick and was taken for the
    writer of its peer's "Connection closed by peer" traceback (2026-12-04, one run in five)."""
    first = exceptions[0]
    n = len(first.line.encode())
    if first.opens_traceback:
        end = next((f for f in exceptions[1:] if f.t - first.t <= LINE_LAG_S and not f.opens_traceback), None)
        n += len(end.line.encode()) if end is not None else 0
    return n


def _death_first(
    death: ExitRecord,
    ordered: Sequence[ExitRecord],
    exceptions: Sequence[LogFinding],
    is_root: bool,
    *,
    survivors: int = 0,
) -> Diagnosis:
    later = [f for f in ordered if f.pid != death.pid]
    what = _death(death)
    if death.how is ExitHow.VANISHED and death.signal is None:
        what = f"{death.name} [{death.pid}] ended (its parent reaped it before its exit status could be read)"
    native = death.signal in _NATIVE_CRASHES
    if death.exit_code == 0:
        what += " (left while its peers ran on)"
    if native:
        what += ": a native crash, no Python traceback"
    elif death.signal == signal.SIGKILL:
        what += " (SIGKILL: the OOM killer or a kill; no kernel or cgroup record names the OOM killer)"
    steps = NATIVE_CRASH_STEPS if native else ()
    parts = []
    if exceptions:
        summary = _exception_summary(exceptions)
        parts.append(f"the exceptions logged after it are its consequences ({summary})")
    if later:
        names = ", ".join(f"{f.name} [{f.pid}] ({f.status_text})" for f in later[:3])
        parts.append(f"then {names} ended")
    if parts:
        text = f"{what} first; " + "; ".join(parts)
    elif is_root and survivors:
        # The command itself killed (vLLM's API server, SGLang's launcher): what it started runs on
        # without the one it served and waits for it, as peers wait for a dead rank.
        text = f"{what}; {plural(survivors, 'process')} of its tree left running without it"
    elif is_root:
        return Diagnosis(Cause.UNKNOWN, (death.pid,), what, steps=steps)
    else:
        text = f"{what}; the rest of the tree waits for it"
    return Diagnosis(Cause.DEAD_PEER, (death.pid,), text, steps=steps)


def _raiser(
    exceptions: Sequence[LogFinding],
    ordered: Sequence[ExitRecord],
    exits: Sequence[ExitRecord],
    window: Sequence[Tick] = (),
) -> int | None:
    """The process that logged the first exception: where its line says who it is, else the member
    whose own written bytes show it wrote the traceback, else the member that ended of its own first."""
    first = min(exceptions, key=lambda f: f.t)
    # The lines of the first traceback (a second apart at most) name who wrote it.
    named = [f for f in exceptions if f.t <= first.t + 1.0 and (f.pid is not None or f.rank)]
    for f in named:
        if f.pid is not None:
            return f.pid
        for e in (*ordered, *exits):
            if f.rank and e.rank == f.rank:
                return e.pid
    # No line names it (SGLang's TP=1 scheduler logs an untagged "Scheduler hit an exception"). Its
    # launcher may then kill the whole tree at once, the writer among the last (a helper first), so
    # the order of deaths in that burst says nothing of who wrote it; the bytes each wrote do.
    until = min((e.t for e in ordered), default=first.t)
    burst = [e for e in exits if first.t - SIMULTANEOUS_S <= e.t <= until + TEAR_DOWN_S]
    writer = _writer(first, burst, window)
    if writer is not None:
        return writer
    # Bytes unknown: a member that ended of its own accord after the exception and before the first
    # failure is the one its exception ended (that scheduler exits 0 and its launcher SIGKILLs the rest
    # 5 s later). One killed in a tear-down is not: the launcher picks its victims' order.
    ended = sorted(
        (e for e in burst if e.signal is None and e.t <= until and _mattered(e)),
        key=lambda e: e.t,
    )
    if ended:
        return ended[0].pid
    failed_first = [e for e in ordered if e.signal is None]
    return failed_first[0].pid if failed_first else None


# A line is stamped this long after it was written at most (a followed file is read when inotify says
# so, a pipe at once): a tick older than the stamp by this much saw its writer before it wrote.
LINE_LAG_S = 0.1


def _writer(first: LogFinding, ended: Sequence[ExitRecord], window: Sequence[Tick]) -> int | None:
    """The ended member that wrote the most bytes from the last tick before ``first`` was stamped to
    its end (its zombie's wchar), if that is at least the line itself: who wrote the traceback.

    The others of a tree killed after an exception write little or nothing in that second (a helper
    nothing, a launcher one line); the raiser wrote its whole traceback. A member whose bytes are
    unknown (its zombie reaped before we read it, /proc/PID/io denied) could be the writer: then no one
    is named."""
    before = _wchar_before(first.t, window)
    wrote: dict[int, int] = {}
    for e in ended:
        if e.wchar_at_end is None or e.pid not in before:
            return None
        wrote[e.pid] = e.wchar_at_end - before[e.pid]
    if not wrote:
        return None
    top = max(wrote, key=lambda pid: wrote[pid])
    rest = sorted(wrote.values())[-2] if len(wrote) > 1 else 0
    return top if wrote[top] >= len(first.line.encode()) and wrote[top] > rest else None


def _wchar_before(t: float, window: Sequence[Tick]) -> dict[int, int]:
    """Each member's wchar at the last tick that surely came before a line stamped at ``t``."""
    before: dict[int, int] = {}
    for tick in window:
        if tick.t >= t - LINE_LAG_S:
            break
        for p in tick.processes:
            if p.wchar is not None:
                before[p.pid] = p.wchar
    return before


def _describe_pid(pid: int, ordered: Sequence[ExitRecord], exits: Sequence[ExitRecord]) -> str:
    for e in (*ordered, *exits):
        if e.pid == pid:
            return _death(e)
    return f"[{pid}]"


def _death(e: ExitRecord) -> str:
    who = e.name
    if e.rank and e.rank not in who:
        who += f" ({e.role or 'rank'} {e.rank})"
    return f"{who} [{e.pid}] {e.status_text}"


def _exception_summary(findings: Sequence[LogFinding]) -> str:
    """The line naming the exception (``ValueError: ...``), not the ``Traceback`` header."""
    exceptions = [f.line for f in findings if f.cause is Cause.EXCEPTION]
    # The first traceback's own words ("ValueError: weight shape mismatch"), not the last process's
    # report of it ("Engine core initialization failed"): the first fault is the cause.
    named = [line for line in exceptions if _NAMED_EXCEPTION.search(line)]
    lines = named or [line for line in exceptions if not line.lstrip().startswith("Traceback")] or exceptions
    return lines[0][:300] if lines else "see the log"


_NAMED_EXCEPTION = re.compile(r"(?:^|[\s\]])(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Fault)\b: ")


def _names(tick: Tick, pids: tuple[int, ...]) -> str:
    parts = []
    for pid in pids:
        p = tick.process(pid)
        parts.append(f"{p.name} [{pid}]" if p else f"[{pid}]")
    return ", ".join(parts)


_CLAUSES = re.compile(r"(?<=[.;])\s+")


def steps_after_stacks(steps: Sequence[str]) -> tuple[str, ...]:
    """``steps`` as next steps of ``hangwatch stacks``: without the advice to take the stacks, which is
    the command just run (each clause that gives it dropped, and a step left empty with it)."""
    out = []
    for step in steps:
        kept = [c for c in _CLAUSES.split(step) if "hangwatch stacks" not in c]
        if not kept:
            continue
        text = " ".join(kept)
        out.append(text[:-1] + "." if text.endswith(";") else text)
    return tuple(out)
