"""Who holds a connection's client end, on real sockets: hangwatch, a process of the tree, or a client.

The engines' processes connect to each other on the tree's own ports (vLLM's workers and engine core),
and such a connection can carry a few bytes its peer never answers: that must not read as a request
waiting. Three real processes here: a server of the tree that never answers, a member of the tree that
connects to it and sends 8 bytes, and a ``sleep`` standing for hangwatch (holding no socket). The test
process itself is the outside client.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

from hangwatch.collect.connections import ConnectionWatcher
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
