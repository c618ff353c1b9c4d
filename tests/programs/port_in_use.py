"""A server whose port is taken: binding 127.0.0.1:--port fails with a real ``OSError`` traceback.

Prints ``Starting server on 127.0.0.1:N``, then binds a plain TCP socket (no SO_REUSEADDR) to the
port, which the caller has already bound and put in LISTEN; Linux answers EADDRINUSE and Python prints
``OSError: [Errno 98] Address already in use`` at the end of an uncaught traceback. Exit status 1.
If the port happens to be free the program listens and prints ``listening`` instead, and runs until
killed, so a mistake in the test setup shows up as a hang, not as a false crash.

Example::

    python tests/programs/port_in_use.py --port 8000
"""

from __future__ import annotations

import argparse
import socket

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


def main() -> None:
    """Parse arguments and try to take the port."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the port to (fail to) bind")
    add_ready_file_arg(parser)
    args = parser.parse_args()

    log(f"Starting server on 127.0.0.1:{args.port}")
    sock = bind_http_socket(args.port)
    log("listening")
    write_ready(args.ready_file)
    try:
        block_forever()
    finally:
        sock.close()


if __name__ == "__main__":
    main()
