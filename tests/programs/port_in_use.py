"""A server whose port is taken: binding 127.0.0.1:--port fails with a real ``OSError`` traceback.

Prints ``Starting server on 127.0.0.1:N``, then binds a plain TCP socket (no SO_REUSEADDR) to the
port, which the caller has already bound and put in LISTEN; Linux answers EADDRINUSE and Python prints
``OSError: [Errno 98] Address already in use`` at the end of an uncaught traceback. Exit status 1.
If the port happens to be free the program listens and prints ``listening`` instead, and runs until
killed, so a mistake in the test setup shows up as a hang, not as a false crash.

``--then-hang`` (SGLang's launcher under uvicorn): the error is logged, not raised, and the shutdown
that follows joins a thread that never ends, while a helper process waits for messages from it: no
exit, a tree that just stops, with the log's line as the only word of why.

``--helper-holds-port`` (with ``--then-hang``; SGLang's scheduler, whose random internal ports took the
launcher's --port in a fault-matrix run): the helper process binds and listens on the port first, so
the owner is inside the tree itself. The caller then passes a free port, not a taken one.

Example::

    python tests/programs/port_in_use.py --port 8000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import selectors
import socket
import threading
from multiprocessing.connection import Connection

from _util import add_ready_file_arg
from _util import block_forever
from _util import log
from _util import write_ready


def bind_http_socket(port: int) -> socket.socket:
    """Bind and listen on 127.0.0.1:port the way a server's startup does."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


def _helper(conn: Connection, port: int | None) -> None:
    """Waits for its parent's messages, polling with a timeout (as an engine's helper does); with
    ``port``, listens on it first and says so to its parent."""
    held = bind_http_socket(port) if port is not None else None
    conn.send("bound" if held is not None else "idle")
    sel = selectors.DefaultSelector()
    sel.register(conn.fileno(), selectors.EVENT_READ)
    while True:
        sel.select(timeout=1.0)


def _hang_after_the_error(port: int, helper_holds_port: bool) -> None:
    ours, theirs = mp.Pipe()
    held = port if helper_holds_port else None
    helper = mp.get_context("spawn").Process(target=_helper, args=(theirs, held), daemon=True)
    helper.start()
    ours.recv()  # the helper is up (and holds the port, when asked to)
    try:
        sock = bind_http_socket(port)
    except OSError as exc:
        log(
            f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address ('127.0.0.1', {port}): {exc.strerror.lower()}"
        )
        log("INFO:     Waiting for application shutdown.")
        worker = threading.Thread(target=threading.Event().wait, name="never-ends")
        worker.start()
        worker.join()  # shutdown waits for a thread that never ends
    else:
        log("listening")
        block_forever()
        sock.close()
    ours.close()


def main() -> None:
    """Parse arguments and try to take the port."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the port to (fail to) bind")
    parser.add_argument("--then-hang", action="store_true", help="log the error and hang in shutdown")
    parser.add_argument(
        "--helper-holds-port",
        action="store_true",
        help="with --then-hang: a helper process listens on it first",
    )
    add_ready_file_arg(parser)
    args = parser.parse_args()

    log(f"Starting server on 127.0.0.1:{args.port}")
    if args.then_hang:
        _hang_after_the_error(args.port, args.helper_holds_port)
        return
    sock = bind_http_socket(args.port)
    log("listening")
    write_ready(args.ready_file)
    try:
        block_forever()
    finally:
        sock.close()


if __name__ == "__main__":
    main()
