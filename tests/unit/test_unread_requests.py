"""Bytes a server has not read, from the kernel (sock_diag's receive queue), on real sockets; and what
the stack rules make of a server that reads none."""

from __future__ import annotations

import socket
import time

from hangwatch.collect.connections import ConnectionWatcher
from hangwatch.model.samples import ConnectionSample


def _read(watcher: ConnectionWatcher, port: int) -> ConnectionSample:
    sample = watcher.read([port])
    assert sample is not None and sample.error is None, sample
    return sample


def test_bytes_left_in_the_queue_are_unread_and_bytes_read_are_not() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    try:
        client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        time.sleep(0.3)
        watcher = ConnectionWatcher()
        # Not accepted yet: the connection waits in the listening socket's queue, its bytes unread.
        waiting = _read(watcher, port)
        assert [c.unread_s is not None for c in waiting.connections] == [True], waiting
        accepted, _ = server.accept()
        with accepted:
            assert accepted.recv(64)
            read = _read(watcher, port)
            assert [c.unread_s for c in read.connections] == [None], read  # read: nothing waits unread
            client.sendall(b"GET /next HTTP/1.1\r\n\r\n")
            time.sleep(1.1)
            left = _read(watcher, port)
            (conn,) = left.connections
            assert conn.unread_s is not None and conn.unread_s >= 1.0, conn  # unread since it came
    finally:
        client.close()
        server.close()
