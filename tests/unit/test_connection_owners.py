"""Who holds a connection's client end, on real sockets: hangwatch, a process of the tree, or a client.

The engines' processes connect to each other on the tree's own ports (vLLM's workers and engine core),
and such a connection can carry a few bytes its peer never answers: that must not read as a request
waiting. Three real processes here: a server of the tree that never answers, a member of the tree that
connects to it and sends 8 bytes, and a ``sleep`` standing for hangwatch (holding no socket). The test
process itself is the outside client.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from typing import Any

import pytest

from hangwatch.collect import connections
from hangwatch.collect.connections import ConnectionWatcher
from hangwatch.collect.sockdiag import inet_diag
from proc_helpers import kill_tree

SERVER = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
held = []
while True:
    c, _ = s.accept(); held.append(c)  # accepted, never answered
"""
MEMBER = """
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); c.sendall(b"12345678")
print("sent", flush=True)
time.sleep(120)
"""


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)


def test_a_tree_members_connection_is_internal_and_a_clients_waits() -> None:
    procs: list[subprocess.Popen[Any]] = []
    try:
        server = _start(SERVER)
        procs.append(server)
        assert server.stdout is not None
        port = int(server.stdout.readline())
        member = _start(MEMBER, str(port))
        procs.append(member)
        assert member.stdout is not None and member.stdout.readline().strip() == "sent"
        standin = subprocess.Popen(["sleep", "120"])
        procs.append(standin)
        client = socket.create_connection(("127.0.0.1", port))
        try:
            client.sendall(b"GET / HTTP/1.1\r\n\r\n")
            time.sleep(0.3)
            watcher = ConnectionWatcher(pid=standin.pid)
            sample = watcher.read([port], [server.pid, member.pid])
            assert sample is not None and sample.error is None
            assert len(sample.connections) == 2
            internal = [c for c in sample.connections if c.internal]
            assert len(internal) == 1 and internal[0].received_bytes == 8
            assert [c.received_bytes for c in sample.unanswered] == [18]  # the client's request alone
            # Without knowing the tree, the member's handshake is a request waiting, as it was before.
            blind = ConnectionWatcher(pid=standin.pid).read([port], [server.pid])
            assert blind is not None and len(blind.unanswered) == 2
            # ... and once the member is known to be of the tree, its connection is internal.
            again = ConnectionWatcher(pid=standin.pid)
            again.read([port], [server.pid])
            later = again.read([port], [server.pid, member.pid])
            assert later is not None and len(later.unanswered) == 1
        finally:
            client.close()
    finally:
        for p in reversed(procs):
            kill_tree(p)


def test_hangwatchs_own_connection_is_ours() -> None:
    server = _start(SERVER)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as mine:
            mine.sendall(b"x")
            time.sleep(0.3)
            sample = ConnectionWatcher().read([port], [server.pid])
            assert sample is not None
            assert [(c.ours, c.internal) for c in sample.connections] == [(True, False)]
            assert sample.unanswered == ()
    finally:
        kill_tree(server)


def test_the_kernels_port_filter_keeps_both_ends_of_the_ports_connections_and_nothing_else() -> None:
    """The dump asks the kernel for the tree's ports only (sockdiag.port_filter): checked against
    the unfiltered dump of the same moment, on two listening sockets with a connection each."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    clients = [socket.create_connection(s.getsockname()[:2]) for s in listeners]
    accepted = [s.accept()[0] for s in listeners]
    try:
        kept, other = (s.getsockname()[1] for s in listeners)
        states = 1 << 1  # established
        whole = {_ports(d, m) for d, m, _ in inet_diag(socket.AF_INET, states)}
        cut = {_ports(d, m) for d, m, _ in inet_diag(socket.AF_INET, states, ports=[kept])}
        assert cut == {p for p in whole if kept in p}
        assert len(cut) == 2  # the server's end and the client's
        assert not any(other in p for p in cut) and any(other in p for p in whole)
        three = {_ports(d, m) for d, m, _ in inet_diag(socket.AF_INET, states, ports=[other, 1, kept])}
        assert three == {p for p in whole if kept in p or other in p}
        assert inet_diag(socket.AF_INET, states, ports=[]) == []
    finally:
        for s in [*accepted, *clients, *listeners]:
            s.close()


def _ports(data: bytes, msg: int) -> tuple[int, int]:
    return struct.unpack_from(">HH", data, msg + 4)


def test_a_kernel_that_refuses_the_filter_gets_the_whole_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels before inet_diag's port tests answer the filtered request with an error."""
    real = connections._dump

    def old_kernel(family: int, ports: tuple[int, ...] | None) -> list[tuple[int, int, int, bytes]]:
        if ports is not None:
            raise OSError("sock_diag returned an error")
        return real(family, None)

    monkeypatch.setattr(connections, "_dump", old_kernel)
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()[:2]):
        port = server.getsockname()[1]
        watcher = ConnectionWatcher()
        first, second = watcher.read([port]), watcher.read([port])
    assert first is not None and first.error is None and [c.ours for c in first.connections] == [True]
    assert second is not None and second.error is None and len(second.connections) == 1


def test_a_family_without_the_trees_connections_is_read_less_often_only_beside_one_with() -> None:
    """Each dump walks the kernel's whole table; IPv6 is skipped while only IPv4 has connections."""
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()[:2]):
        port = server.getsockname()[1]
        watcher = ConnectionWatcher()
        for _ in range(4):
            watcher.read([port])
        assert watcher._families() == [socket.AF_INET]
        seen = [watcher.read([port]) for _ in range(connections.EMPTY_EVERY)]
        assert all(s is not None and len(s.connections) == 1 for s in seen)
    nothing = ConnectionWatcher()
    for _ in range(6):
        nothing.read([1])
        assert set(nothing._families()) == {socket.AF_INET, socket.AF_INET6}
