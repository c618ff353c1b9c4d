"""The ssh boundary: ``hangwatch collect`` on every node through the system ``ssh`` client.

The system client, not a library: the user's keys, agent, certificates, ``~/.ssh/config`` (aliases,
``ProxyJump``, ``ControlMaster``) all work, and hangwatch never reads a key. ``BatchMode=yes`` turns
every prompt (a password, an unknown host key) into a failure instead of a hang; host keys stay
checked. One invocation per node that dumps all of its ranks: a new connection costs 0.3-0.45 s here
(multinode.md 2.8), so one per rank would not scale.

Nodes run in parallel, at most ``concurrency`` at once (pdsh's default fan-out is 32), each under its
own deadline (its ssh is killed with its process group when it passes). ssh's exit statuses and
messages never leave this module: each node ends as a ``NodeAnswer`` whose ``outcome`` says what
happened (refused, auth, host key, timeout, no collector, too much output), so one dead node is
evidence about that node, and the others are still merged. What the collector printed is decoded by
the caller (``nodes/gather.py``): the transport knows nothing of bundles.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
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
from hangwatch.transports.stream import StreamSessions

T = TypeVar("T")

SSH_ERROR = 255  # ssh's own failures (connect, auth, host key); anything else is the remote command's
DEFAULT_CONCURRENCY = 32
MAX_OUTPUT_BYTES = 64_000_000  # the collector caps its bundle at 8 MB by default; this guards the controller

_PATTERNS: tuple[tuple[NodeOutcome, tuple[str, ...], str], ...] = (
    (NodeOutcome.REFUSED, ("Connection refused",), "nothing listens for ssh there (sshd down?)"),
    (
        NodeOutcome.AUTH,
        ("Permission denied", "Too many authentication failures"),
        "the node refused our credentials (batch mode: no prompts; check the key, agent or ssh_config)",
    ),
    (
        NodeOutcome.HOST_KEY,
        ("Host key verification failed", "HOST IDENTIFICATION HAS CHANGED", "host key is known"),
        "the node's host key is unknown or changed (add it to known_hosts; hangwatch keeps the check)",
    ),
    (
        NodeOutcome.UNREACHABLE,
        (
            "Could not resolve hostname",
            "No route to host",
            "Network is unreachable",
            "Name or service not known",
        ),
        "the node cannot be reached",
    ),
    (
        NodeOutcome.TIMEOUT,
        ("Connection timed out", "Operation timed out", "timed out during banner exchange"),
        "the connection timed out",
    ),
)


@dataclass(frozen=True)
class SshOptions:
    ssh: str = "ssh"
    config: Path | None = None  # -F FILE; default: the user's ~/.ssh/config
    options: tuple[str, ...] = ()  # extra -o KEY=VALUE
    connect_timeout_s: float = 5.0
    node_timeout_s: float = 30.0  # connect plus collect plus transfer
    concurrency: int = DEFAULT_CONCURRENCY
    # How to start hangwatch on the node: ("hangwatch",) from the remote PATH, or ("/opt/venv/bin/python",
    # "-m", "hangwatch").
    remote: tuple[str, ...] = ("hangwatch",)


def ssh_argv(host: str, remote_args: Sequence[str], options: SshOptions) -> list[str]:
    """The ssh command line for one node; the remote command is quoted word by word for the remote shell."""
    if host.startswith("-"):
        raise ValueError(f"not a host: {host!r}")
    argv = [
        options.ssh,
        "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={max(1, round(options.connect_timeout_s))}",
    ]
    if options.config is not None:
        argv += ["-F", str(options.config)]
    for opt in options.options:
        argv += ["-o", opt]
    remote = " ".join(shlex.quote(a) for a in [*options.remote, "collect", *remote_args])
    return [*argv, "--", host, remote]


# The runner is the same for every transport: one client process in a session of its own, killed with its
# group at the deadline (transports/runner.py).
run_ssh = run_bounded


@dataclass(frozen=True)
class SshTransport(ClientTransport[SshOptions, str]):
    """``ssh HOST hangwatch collect ...`` (runner.Transport)."""

    def argv(self, target: str, remote_args: Sequence[str]) -> list[str]:
        return ssh_argv(target, remote_args, self.options)

    def answer_of(self, target: str, ex: Exchange) -> NodeAnswer:
        return answer_of(target, ex, self.options)


def collect_nodes(
    hosts: Sequence[str],
    remote_args: Sequence[str],
    options: SshOptions,
    finish: Callable[[NodeAnswer], T],
    runner: Runner = run_ssh,
) -> list[T]:
    """``hangwatch collect REMOTE_ARGS`` on every host, in parallel; one result per host, in host order."""
    return collect(SshTransport(options), hosts, remote_args, lambda _host, answer: finish(answer), runner)


def answer_of(host: str, ex: Exchange, options: SshOptions) -> NodeAnswer:
    def failed(outcome: NodeOutcome, detail: str) -> NodeAnswer:
        return NodeAnswer(host, outcome, detail, b"", ex.sent_wall_s, ex.received_wall_s)

    said = last_line(ex.stderr, noise=("Warning: Permanently",))
    if ex.rc is None:
        return failed(
            NodeOutcome.TIMEOUT,
            f"no answer within {options.node_timeout_s:g} s (connect, collect and transfer)"
            + (f"; ssh said: {said}" if said else ""),
        )
    if ex.rc == SSH_ERROR:
        for outcome, needles, meaning in _PATTERNS:
            if any(n in ex.stderr for n in needles):
                return failed(outcome, f"{meaning}: {said}")
        # ssh exits 255 without a word when an open connection drops (the node's sshd killed, a reboot).
        return failed(
            NodeOutcome.UNREACHABLE,
            f"ssh failed: {said}" if said else "the ssh connection closed (exit status 255, no message)",
        )
    if ex.rc in (126, 127):
        return failed(
            NodeOutcome.NO_COLLECTOR,
            f"hangwatch was not found on the node ({said}); give its path with --remote-hangwatch "
            "(for example '/opt/venv/bin/python -m hangwatch')",
        )
    if ex.rc != 0:
        return failed(NodeOutcome.REMOTE_ERROR, f"the collector failed (exit status {ex.rc}): {said}")
    if len(ex.stdout) > MAX_OUTPUT_BYTES:
        return failed(NodeOutcome.BAD_OUTPUT, f"{len(ex.stdout)} bytes, over the {MAX_OUTPUT_BYTES} limit")
    return NodeAnswer(host, NodeOutcome.OK, "", ex.stdout, ex.sent_wall_s, ex.received_wall_s)


def ssh_session(host: str, remote_args: Sequence[str], options: SshOptions) -> StreamSession:
    """One long-lived ``hangwatch collect --stream`` on one node over ssh (transports/stream.py)."""
    return StreamSession(
        host,
        ssh_argv(host, [*remote_args, "--stream"], options),
        lambda ex: answer_of(host, ex, options),
        open_timeout_s=options.connect_timeout_s,
    )


class SshSessions(StreamSessions):
    def __init__(self, hosts: Sequence[str], remote_args: Sequence[str], options: SshOptions) -> None:
        super().__init__([ssh_session(h, remote_args, options) for h in hosts], options.concurrency)
