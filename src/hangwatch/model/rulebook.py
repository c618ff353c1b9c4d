"""The rulebook: every rule that can decide a verdict, its cause or its culprit, by id, with what it requires.

A vocabulary, like the causes: the analysis names the rules it applied, the renderers say what each requires.

A verdict records the rules that decided it, in order (``Verdict.decided_by``): first the *decision*
(why the state: the stall window ran out, a wait nothing can end, a death, readiness), then the rules that
named the cause and the culprit (a stack rule, the process states and log, the order of deaths), then
the rules that refined it (the culprit's own exception). The ids are stable words a user can look up in
``docs/verdicts.md`` ("The rulebook"), which a test checks against this table; each statement is what the
rule requires, in one line, so that a reader of the rule alone can agree or disagree with the verdict.

The book is in sections, one per ordered table of the analysis, and each section's order *is* the order
in which its table tries its rules: the first that holds decides, and a test checks every table against
its section (``tests/unit/test_rulebook.py``). The tables: ``assess.DECISIONS`` (the state, at each tick),
``stackrules.RULES`` (the cause and culprit from the stacks), ``causes.STALL_RULES`` (from process states
and the log, where the stacks name nothing), ``causes.CRASH_RULES`` (the first fault of a crash) and the
refinements applied after a cause, in their order. Two sections decide outside a tick: a stop
(``Assessor.interrupted``) and the multi-node watch's two ends.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuleEntry:
    id: str
    statement: str  # what it requires, in one line
    table: str = ""  # the section (the ordered table that tries it): a key of TABLES


# The sections, in the book's order: key -> where that table lives and how its order is used.
TABLES: tuple[tuple[str, str], ...] = (
    ("tick", "the state at each tick (assess.DECISIONS): tried in this order, the first that holds decides"),
    ("stop", "the state when hangwatch is stopped (Assessor.interrupted)"),
    ("nodes", "the multi-node watch's ends where no node gives a tick (nodes/watch.py)"),
    ("stacks", "the cause and culprit from the stacks (stackrules.RULES): the first that holds names them"),
    ("state", "the cause from process states and the log where the stacks name none (causes.STALL_RULES)"),
    ("refine", "refinements of a stall's cause, each applied when it holds, in this order"),
    ("crash", "the first fault of a crash (causes.CRASH_RULES): the first that holds names it"),
)


@dataclass(frozen=True)
class NearMiss:
    """A rule whose shape was there but that did not decide: how many of its requirements held, and the
    first that did not. An ``unknown`` verdict lists the closest ones, so that a reader sees which rule
    almost named the cause and what it lacked (one more capture, a process that moved, a third stuck
    process) instead of only "no rule matched"."""

    rule: str
    met: int  # requirements that held, in the rule's own order: the higher, the closer
    lacked: str  # the first requirement that did not hold, in words

    def describe(self) -> str:
        return f"{self.rule}: {self.lacked}"


# How many near misses a verdict names: the closest few are a lead, a dozen would be noise.
NEAR_MISSES_SHOWN = 3


def closest(misses: tuple[NearMiss, ...] | list[NearMiss]) -> tuple[NearMiss, ...]:
    """The misses that met the most of their rule's requirements, in the book's order among equals."""
    ranked = sorted(enumerate(misses), key=lambda item: (-item[1].met, item[0]))
    return tuple(m for _, m in ranked[:NEAR_MISSES_SHOWN])


def _in(table: str, *entries: RuleEntry) -> tuple[RuleEntry, ...]:
    return tuple(RuleEntry(e.id, e.statement, table) for e in entries)


_TICK = _in(
    "tick",
    RuleEntry("crashed:command-ended", "the launched command ended after a member of the tree had failed"),
    RuleEntry("exited:command", "the launched command ended (status 0, or unknown) and no member had failed"),
    RuleEntry(
        "crashed:failure-then-quiet",
        "a member failed (an error status, a signal, a rank gone) and nothing progressed for 5 s after",
    ),
    RuleEntry(
        "crashed:decisive-death",
        "a rank or a process killed by a signal died 5 s ago and no process of its rank replaced it",
    ),
    RuleEntry(
        "crashed:carried-on",
        "(decides nothing) a failure the tree progressed past by 5 s is forgotten, unless it was a rank that "
        "nothing replaced",
    ),
    RuleEntry("ready:probe", "the readiness probe answered with a ready status (SGLang/vLLM: /health 200)"),
    RuleEntry("ready:log-line", "a log line matched the engine's ready line or --ready-pattern"),
    RuleEntry(
        "ready:idle-server",
        "no readiness rule given, and when the stall window ran out the stacks showed every process waiting "
        "for work (idle) while the tree listens on a TCP port",
    ),
    RuleEntry(
        "stalled:window",
        "nothing progressed for --stall-after s: no log line, I/O, GPU work or memory, port, probe change, "
        "new process, or CPU that was not a spin",
    ),
    RuleEntry("stalled:stopped-member", "a member is stopped (state T) and nothing progressed for 10 s"),
    RuleEntry("stalled:stopped-cpu-only", "a member is stopped and only CPU moved for --stall-after s"),
    RuleEntry(
        "stalled:closed-wait",
        "three or more stack captures over 3.5 s or more show a wait nothing inside the tree can end "
        "(every process still: blocked, stopped or dead; no poll, no culprit burning outside a wait)",
    ),
    RuleEntry(
        "serving:closed-wait", "requests wait for an answer and the stacks show a wait nothing inside can end"
    ),
    RuleEntry(
        "serving:gauges-frozen",
        "the engine's gauges show requests running or waiting, its token counter frozen for --stall-after s",
    ),
    RuleEntry(
        "serving:requests-unanswered",
        "requests wait for an answer (client connections, hangwatch's own request, a probe gone red) and "
        "nothing moved for --stall-after s",
    ),
    RuleEntry("serving:stopped-member", "requests wait, a member is stopped, nothing solid moved for 10 s"),
    RuleEntry("ready:end-of-window", "attach's --window ended while the server served with nothing wedged"),
    RuleEntry("timeout:window", "attach's window ended while the tree still progressed, not ready"),
    RuleEntry("timeout:limit", "the time limit given ran out while the tree still progressed, not ready"),
)

_STOP = _in(
    "stop",
    RuleEntry("ready:stopped-while-serving", "hangwatch was stopped while the server served with no stall"),
    RuleEntry("interrupted", "hangwatch was stopped (Ctrl-C, SIGTERM) before a verdict"),
)

_NODES = _in(
    "nodes",
    RuleEntry("nodes:none-answered", "no node answered with a process of the selector within --window"),
    RuleEntry(
        "nodes:none-readable", "no node of the Ray cluster could be read, for a reason waiting does not cure"
    ),
)

_STACKS = _in(
    "stacks",
    RuleEntry(
        "stacks:stopped", "a member is stopped (state T, or a dump found it so): the others wait for it"
    ),
    RuleEntry("stacks:dead-peer", "a member of the group died and the survivors stay in place waiting"),
    RuleEntry("stacks:lock-deadlock", "threads stay in place in lock acquires that wait on each other"),
    RuleEntry(
        "stacks:wait-cycle",
        "the kernel shows every member blocked untimed, unchanged, each waiting only on stuck members "
        "(lock-deadlock when each waits for a file lock another holds)",
    ),
    RuleEntry("stacks:io-wait", "a member sits in uninterruptible I/O (state D) most of the window"),
    RuleEntry(
        "stacks:stale-lock-file",
        "a member polls in place while a lock file in the build caches, older than the tree, is locked by "
        "no process (a marker a killed build left)",
    ),
    RuleEntry("stacks:cuda-graph-capture", "ranks stay in place inside a CUDA graph capture"),
    RuleEntry(
        "stacks:requests-unread",
        "bytes sit unread 3 s or more on a port a member listens on, and that member stays outside its "
        "event loop's wait",
    ),
    RuleEntry(
        "stacks:waiting-for-work",
        "ranks wait in a collective for the rank that feeds them, which waits for input from outside, as "
        "does every other process (idle, unless requests wait or the server was never ready)",
    ),
    RuleEntry(
        "stacks:collective-wait",
        "ranks stay blocked in a collective; the culprits are the ranks elsewhere (or in another one)",
    ),
    RuleEntry("stacks:rendezvous-wait", "ranks stay in a rendezvous or store wait for ranks that never came"),
    RuleEntry(
        "stacks:compile-stall", "threads inside a compile or a file-lock wait stay in place using no CPU"
    ),
    RuleEntry(
        "stacks:gpu-spin",
        "a host thread stays in place waiting for a GPU that spins (busy, every pipe idle) or idles",
    ),
    RuleEntry(
        "stacks:idle-server",
        "a member listening on a TCP port waits for input the outside can send, every other member for input "
        "or its children; none in a collective or rendezvous, no request waiting or unread (idle)",
    ),
    RuleEntry(
        "stacks:odd-one-out",
        "every rank stays in place, most in one place: the others (or the ranks left behind by the log) "
        "are the culprits",
    ),
    RuleEntry(
        "stacks:stuck-worker",
        "all processes but one or two wait for messages; those few wait on something of their own",
    ),
    RuleEntry(
        "stacks:stuck-handler",
        "requests wait and a thread stays in place in an untimed wait only its own process can end (a "
        "private futex, a read of a pipe only it writes), or spinning, while the others wait for messages",
    ),
    RuleEntry("stacks:no-rule-matched", "no stack rule matched: where every process is, for a person"),
)

_STATE = _in(
    "state",
    RuleEntry("state:stopped", "a member is stopped (state T) at the stall"),
    RuleEntry("state:io-wait", "a member sits in uninterruptible I/O (state D) most of the window"),
    RuleEntry("log:cuda-oom", "the log reported CUDA out of memory and nothing moved since"),
    RuleEntry("log:port-in-use", "the log reported an address already in use and nothing moved since"),
    RuleEntry("log:exception", "the log reported an exception and nothing moved since"),
    RuleEntry("log:none", "no process state or log line names a cause"),
)

# Applied after the cause is named, in this order: the first two by the stack rules' classifier, the next
# two by the assessor's stall, two to a gpu-spin verdict once cuda-gdb has read the kernels, and last what
# the collectives' own records say (torch's Flight Recorder, NCCL's RAS), read from the ranks at the stall.
_REFINE = _in(
    "refine",
    RuleEntry(
        "stall:open-while-it-moves",
        "a wait the stack rule closed ends at a process that polls or burns CPU outside a wait: the window "
        "applies",
    ),
    RuleEntry(
        "stall:lock-held-elsewhere",
        "the process the wait ends at keeps trying a file lock another process holds (/proc/locks): "
        "that holder is named",
    ),
    RuleEntry(
        "stall:log-cause-with-stack-culprit",
        "the log names what went wrong (a bind refused, memory exhausted) and the stacks who is stuck by it",
    ),
    RuleEntry(
        "stall:culprit-raised",
        "the process the others wait for logged an exception near the quiet spell's start and lived on",
    ),
    RuleEntry(
        "kernels:named",
        "at a gpu-spin verdict, cuda-gdb listed the kernels running on a GPU process's device (name, grid, "
        "block, SMs) and detached, the process left running",
    ),
    RuleEntry(
        "kernels:odd-one-out",
        "the stacks named every rank of a GPU wait alike; of three or more read, all but one run the same "
        "kernels: that one (another kernel, or none) is the culprit",
    ),
    RuleEntry(
        "stall:flight-recorder",
        "at a stall, the ranks' Flight Recorder dumps show some ranks inside a collective (by sequence "
        "number) and others that never enqueued it: those are named where no rule named a culprit",
    ),
    RuleEntry(
        "stall:nccl-ras",
        "at a stall, NCCL's RAS service, read twice 3 s apart, shows ranks unreachable, in error, or every "
        "rank's collective count frozen (equal: all stuck in one; spread: the ranks behind)",
    ),
)

_CRASH = _in(
    "crash",
    RuleEntry("crash:cuda-oom", "the log reported CUDA out of memory before the deaths"),
    RuleEntry("crash:oom-killed", "a member was SIGKILLed and the kernel log or cgroup names the OOM killer"),
    RuleEntry("crash:port-in-use", "the log reported an address already in use"),
    RuleEntry(
        "crash:death-first",
        "a member died by a signal (or ended unseen) before any exception: the exceptions after it are "
        "its consequences",
    ),
    RuleEntry(
        "crash:left-silently",
        "a member ended of its own and wrote none of the first traceback: the exception is a peer noticing",
    ),
    RuleEntry(
        "crash:exception-first",
        "an exception was logged before the first death by a signal: its writer is the culprit",
    ),
    RuleEntry("crash:dead-peer", "a member other than the command failed with no exception logged"),
    RuleEntry("crash:vanished", "the first failure ended unseen (reaped before its status was read)"),
    RuleEntry("crash:no-traceback", "the command failed with no traceback or known message: its last words"),
)

RULEBOOK: tuple[RuleEntry, ...] = (*_TICK, *_STOP, *_NODES, *_STACKS, *_STATE, *_REFINE, *_CRASH)

_BY_ID = {r.id: r for r in RULEBOOK}


def section(table: str) -> tuple[str, ...]:
    """The ids of one section, in the order its table tries them (KeyError for a table not in TABLES)."""
    if table not in dict(TABLES):
        raise KeyError(table)
    return tuple(r.id for r in RULEBOOK if r.table == table)


def statement(rule_id: str) -> str:
    """What the rule requires (KeyError for an id not in the book: a rule without an entry is a bug)."""
    return _BY_ID[rule_id].statement


def statement_of(rule_id: str) -> str:
    """What the rule requires, for a reader: an id this version does not know (a report written by another
    version, read back by isolate's --resume) is said to be unknown, not an error."""
    entry = _BY_ID.get(rule_id)
    return entry.statement if entry is not None else "a rule this version of hangwatch does not know"


def known(rule_id: str) -> bool:
    return rule_id in _BY_ID


def stack_rule_id(function_name: str) -> str:
    """``rule_collective_wait`` -> ``stacks:collective-wait``."""
    return "stacks:" + function_name.removeprefix("rule_").replace("_", "-")
