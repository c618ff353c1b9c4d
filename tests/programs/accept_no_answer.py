"""A TCP server that accepts every connection and never sends a single byte.

Listens on 127.0.0.1:--port, prints ``listening on 127.0.0.1:N`` and writes ``--ready-file``, then
accepts connections forever, prints ``accepted connection from HOST:PORT`` for each and keeps them all
open without reading or writing: an HTTP health probe connects fine and then times out waiting for a
status line, which is what a server whose event loop is wedged looks like from outside.

Example::

    python tests/programs/accept_no_answer.py --port 8000
"""

from __future__ import annotations

import argparse
import socket

from _util import add_ready_file_arg
from _util import log
from _util import write_ready


def main() -> None:
    """Parse arguments, listen, and accept forever without answering."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: pick a free one)")
    add_ready_file_arg(parser)
    args = parser.parse_args()

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", args.port))
    server.listen(128)
    log(f"listening on 127.0.0.1:{server.getsockname()[1]}")
    write_ready(args.ready_file)
    held: list[socket.socket] = []  # keep every connection referenced, hence open
    while True:
        conn, (host, port) = server.accept()
        held.append(conn)
        log(f"accepted connection from {host}:{port}")


if __name__ == "__main__":
    main()
