"""One client process (ssh, kubectl, srun) run for one node under a deadline: what every transport shares.

Each runs in a session of its own, so that at the deadline its whole group (the client and anything it
started) is killed, and nothing of it outlives the call. Its exit status, output and stderr come back
as an ``Exchange``; what they mean is the transport's to say. A transport is a ``Transport``: the client
command for a target, and the meaning of its exchange; ``collect`` runs one on every target at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic
from typing import Protocol
from typing import TypeVar

from hangwatch.model.nodes import NodeAnswer

T = TypeVar("T")
U = TypeVar("U")
K_contra = TypeVar("K_contra", contravariant=True)


@dataclass(frozen=True)
class Exchange:
    """What one run gave: exit status (None: killed at the deadline), output, and when."""

    rc: int | None
    stdout: bytes
    stderr: str
    sent_wall_s: float
    received_wall_s: float


def run_bounded(argv: list[str], deadline_s: float) -> Exchange:
    """Run ``argv`` in a session of its own; SIGKILL its whole group at the deadline."""
    sent = time.time()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:  # the client itself is missing: exit status 127, as a shell would say
        return Exchange(127, b"", f"{argv[0]}: {exc.strerror}", sent, time.time())
    try:
        out, err = proc.communicate(timeout=deadline_s)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    return Exchange(rc, out or b"", (err or b"").decode("utf-8", "replace"), sent, time.time())


Runner = Callable[[list[str], float], Exchange]


class Transport(Protocol[K_contra]):
    """One way of reaching a node (ssh, kubectl exec, srun); a target is a host, a pod or a Slurm node."""

    @property
    def deadline_s(self) -> float: ...  # connect, collect and transfer, per node

    @property
    def concurrency(self) -> int: ...  # clients at once

    def argv(self, target: K_contra, remote_args: Sequence[str]) -> list[str]: ...

    def answer_of(self, target: K_contra, ex: Exchange) -> NodeAnswer: ...

    def unreachable(self, target: K_contra) -> NodeAnswer | None:
        """An answer known without running the client (a pod that is not Running); None to run it."""
        ...


class Limited(Protocol):
    """What every transport's options say of the fan-out: the per-node deadline and the clients at once."""

    @property
    def node_timeout_s(self) -> float: ...

    @property
    def concurrency(self) -> int: ...


Opts = TypeVar("Opts", bound=Limited)


@dataclass(frozen=True)
class ClientTransport(Generic[Opts, T]):
    """The part every client transport shares: its limits from its options, and no answer known before
    the client runs. A transport adds ``argv`` and ``answer_of``."""

    options: Opts

    @property
    def deadline_s(self) -> float:
        return self.options.node_timeout_s

    @property
    def concurrency(self) -> int:
        return self.options.concurrency

    def unreachable(self, target: T) -> NodeAnswer | None:
        return None


def collect(
    transport: Transport[T],
    targets: Sequence[T],
    remote_args: Sequence[str],
    finish: Callable[[T, NodeAnswer], U],
    runner: Runner = run_bounded,
) -> list[U]:
    """``hangwatch collect REMOTE_ARGS`` on every target, in parallel; one result per target, in order.

    ``finish`` (decoding the bundle) runs in the worker thread as each answer arrives, overlapping the
    nodes still on the wire."""

    def one(target: T) -> U:
        answer = transport.unreachable(target)
        if answer is None:
            answer = transport.answer_of(
                target, runner(transport.argv(target, remote_args), transport.deadline_s)
            )
        return finish(target, answer)

    return fan_out(targets, one, transport.concurrency)


def last_line(text: str, noise: tuple[str, ...] = ()) -> str:
    """A client's last word on stderr (its reason), lines starting with ``noise`` left out, cut to 300."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(noise)]
    return lines[-1][:300] if lines else ""


def fan_out(targets: Sequence[T], one: Callable[[T], U], concurrency: int) -> list[U]:
    """``one(target)`` for every target, at most ``concurrency`` at once; the results in target order.

    Every transport reaches its nodes this way (a slow or dead node costs one worker, not the others).
    """
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(targets)))) as pool:
        return list(pool.map(one, targets))
