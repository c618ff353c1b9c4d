"""Processes that wait for each other in the kernel, with frames that name no lock and no collective.

``--mode pipe``: workers ``waiter-A`` and ``waiter-B`` each ``recv()`` first on a one-way pipe that only
the other writes (``multiprocessing.Pipe(duplex=False)``: ``os.pipe``), then would send: both block in
``read`` forever. ``--mode socketpair``: the same over a duplex pipe (a Unix socketpair), each with an
extra thread parked on an Event of its own. ``--mode tcp``: the same over a loopback TCP connection
(``waiter-B`` listens on a port the launcher picked, ``waiter-A`` connects), each blocked in ``recv``.
``--mode flock``: each takes a file lock (``flock``) of its own, then the other's: both blocked in
``flock`` forever (the files are temporary, in a folder removed at the end).
``--mode self``: one worker waits on a ``threading.Event``
nobody sets (a private futex: only its own threads could wake it). ``--mode timed``: one worker polls
its pipe with a 0.5 s timeout in a loop, for a message that never comes: a wait that ends by itself
every half second, which nothing proves closed.

The launcher ``join()``s its workers (``wait4``) and writes ``--ready-file`` once each has said it is
about to wait.
"""

from __future__ import annotations

import argparse
import fcntl
import multiprocessing as mp
import os
import shutil
import socket
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier

from _util import add_ready_file_arg
from _util import die_with_parent
from _util import log
from _util import set_title
from _util import write_ready


def tcp_worker(name: str, port: int, up: Connection) -> None:
    """B accepts one connection on ``port``, A connects to it; then each waits to hear from the other."""
    set_title(f"waiter-{name}")
    die_with_parent()
    if name == "B":
        with socket.create_server(("127.0.0.1", port)) as listener:
            up.send(name)
            up.close()
            conn, _ = listener.accept()
    else:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port))
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        up.send(name)
        up.close()
    conn.recv(1)  # the other one sends only after its own recv: never
    conn.sendall(b"x")


def flock_worker(name: str, mine: str, theirs: str, up: Connection, barrier: Barrier) -> None:
    """Hold a lock of its own, then take the other's (held by the other, which wants this one)."""
    set_title(f"waiter-{name}")
    die_with_parent()
    with open(mine, "w") as own, open(theirs, "w") as other:
        fcntl.flock(own, fcntl.LOCK_EX)
        up.send(name)
        up.close()
        barrier.wait()  # both hold their own before either asks for the other's
        fcntl.flock(other, fcntl.LOCK_EX)


def worker(name: str, mode: str, inbox: Connection | None, outbox: Connection | None, up: Connection) -> None:
    set_title(f"waiter-{name}")
    die_with_parent()
    if mode == "socketpair":
        threading.Thread(target=threading.Event().wait, name="idle", daemon=True).start()
    up.send(name)
    up.close()
    if mode == "self":
        threading.Event().wait()
    elif mode == "timed":
        assert inbox is not None
        while not inbox.poll(0.5):
            pass
    else:
        assert inbox is not None and outbox is not None
        inbox.recv()  # the other one sends only after its own recv: never
        outbox.send("done")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mode", choices=("pipe", "socketpair", "tcp", "flock", "self", "timed"), required=True
    )
    add_ready_file_arg(parser)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    up_r, up_w = ctx.Pipe(duplex=False)
    if args.mode == "pipe":
        a_in, b_out = ctx.Pipe(duplex=False)
        b_in, a_out = ctx.Pipe(duplex=False)
        plans = [("A", a_in, a_out), ("B", b_in, b_out)]
    elif args.mode == "socketpair":
        a, b = ctx.Pipe(duplex=True)
        plans = [("A", a, a), ("B", b, b)]
    else:
        never, _keep = ctx.Pipe(duplex=False)
        plans = [("A", never, None)]
    procs = [
        ctx.Process(target=worker, args=(n, args.mode, i, o, up_w), name=f"waiter-{n}") for n, i, o in plans
    ]
    if args.mode == "tcp":
        with socket.socket() as probe:  # a port free a moment ago, for B to listen on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        procs = [ctx.Process(target=tcp_worker, args=(n, port, up_w), name=f"waiter-{n}") for n in ("B", "A")]
    if args.mode == "flock":
        folder = tempfile.mkdtemp(prefix="wait-cycle-")
        files = {n: os.path.join(folder, f"lock-{n}") for n in ("A", "B")}
        barrier = ctx.Barrier(2)
        procs = [
            ctx.Process(target=flock_worker, args=(n, files[n], files[o], up_w, barrier), name=f"waiter-{n}")
            for n, o in (("A", "B"), ("B", "A"))
        ]
    for proc in procs:
        proc.start()
    up_w.close()
    names = [up_r.recv() for _ in procs]
    up_r.close()
    log(f"launcher: {', '.join(names)} waiting ({args.mode})")
    write_ready(args.ready_file)
    try:
        for proc in procs:
            proc.join()
    finally:
        if args.mode == "flock":
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
