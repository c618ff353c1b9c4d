"""The fixed vocabularies every command shares: verdict states and causes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Confidence(StrEnum):
    """How sure a conclusion is: a stack rule's diagnosis, the verdict that takes it, isolate's culprit."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    NONE = "none"  # isolate: inconclusive, or nothing to isolate


class State(StrEnum):
    """What hangwatch concluded about the tree as a whole."""

    READY = "ready"
    STALLED = "stalled"
    CRASHED = "crashed"
    EXITED = "exited"
    TIMEOUT = "timeout"
    # Not a conclusion about the server: the user stopped hangwatch before one was reached.
    INTERRUPTED = "interrupted"

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self]


_EXIT_CODES = {
    State.READY: 0,
    State.EXITED: 0,
    State.STALLED: 3,
    State.CRASHED: 4,
    State.TIMEOUT: 5,
    State.INTERRUPTED: 130,
}

USAGE_EXIT_CODE = 2


class Cause(StrEnum):
    """Why the tree is not progressing. One vocabulary for every command and report."""

    COLLECTIVE_WAIT = "collective-wait"
    RENDEZVOUS_WAIT = "rendezvous-wait"
    DEAD_PEER = "dead-peer"
    CUDA_GRAPH_CAPTURE = "cuda-graph-capture"
    COMPILE_STALL = "compile-stall"
    LOCK_DEADLOCK = "lock-deadlock"
    # Processes each blocked until another of them acts (a pipe only the other writes, a child's exit),
    # none able to: the kernel's wait-for graph closes on itself (analyse/waitgraph.py).
    WAIT_CYCLE = "wait-cycle"
    GPU_SPIN = "gpu-spin"
    IO_WAIT = "io-wait"
    STOPPED = "stopped"
    OOM_KILLED = "oom-killed"
    CUDA_OOM = "cuda-oom"
    EXCEPTION = "exception"
    PORT_IN_USE = "port-in-use"
    # Not a hang: every process waits for input from outside the tree (a server between requests).
    IDLE = "idle"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class OptionWords:
    """What the analysis calls the watch's settings where its verdicts and advice name them. The analysis
    names no command-line flag itself: the commands hand it their own names (``CLI_WORDS``), and anything
    else that builds a watch (a library user, a test) gets these plain words."""

    window: str = "watch window"  # "the 60 s watch window"
    timeout: str = "time limit"  # "after time limit 600 s"
    ready_url: str = "a readiness URL such as"
    ready_pattern: str = "a readiness log pattern"
    engine: str = "naming the engine"


# The command line's names for those settings (cli/: attach's --window, run's --timeout, ...).
CLI_WORDS = OptionWords(
    window="--window",
    timeout="--timeout",
    ready_url="--ready-url",
    ready_pattern="--ready-pattern",
    engine="--engine",
)
