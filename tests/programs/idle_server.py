"""A server that starts, listens on 127.0.0.1 and then only waits for work: nothing is stuck, no request
comes. What a healthy server between requests looks like to a watcher that has no readiness rule.

``--kind`` is how it waits:

- ``http``: the standard library's ``http.server`` (``serve_forever``, a poll with a 0.5 s timeout);
- ``asyncio``: an ``asyncio`` server answering one line per connection (an epoll with no timeout);
- ``accept``: a bare blocking ``socket.accept()`` loop, with no event loop at all;
- ``workers``: an ``asyncio`` front that hands each line to a worker process over a pipe and waits for
  its answer: the worker waits on a pipe only the front writes, the front for the outside.

``--ready-file`` is written once the socket listens (and, for ``workers``, the worker is up).

Example::

    python tests/programs/idle_server.py --kind asyncio --port 8765
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import socket
from http.server import BaseHTTPRequestHandler
from http.server import HTTPServer
from multiprocessing.connection import Connection

from _util import add_ready_file_arg
from _util import die_with_parent
from _util import log
from _util import write_ready


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_http(port: int, ready: str | None) -> None:
    server = HTTPServer(("127.0.0.1", port), _Hello)
    log(f"listening on 127.0.0.1:{server.server_address[1]} (http)")
    write_ready(ready)
    server.serve_forever()


async def _serve_lines(port: int, ready: str | None, answer: object) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        writer.write(await answer(line))  # type: ignore[operator]
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    log(f"listening on 127.0.0.1:{port} (asyncio)")
    write_ready(ready)
    async with server:
        await server.serve_forever()


def serve_asyncio(port: int, ready: str | None) -> None:
    async def echo(line: bytes) -> bytes:
        return line

    asyncio.run(_serve_lines(port, ready, echo))


def serve_accept(port: int, ready: str | None) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        log(f"listening on 127.0.0.1:{port} (accept)")
        write_ready(ready)
        while True:
            conn, _ = sock.accept()
            with conn:
                conn.sendall(conn.recv(1024))


def _worker(conn: Connection) -> None:
    die_with_parent()
    while True:
        line = conn.recv_bytes()
        conn.send_bytes(line.upper())


def serve_workers(port: int, ready: str | None) -> None:
    front, back = mp.Pipe()
    worker = mp.get_context("fork").Process(target=_worker, args=(back,), name="idle-worker", daemon=True)
    worker.start()

    async def through_worker(line: bytes) -> bytes:
        front.send_bytes(line)
        return await asyncio.get_running_loop().run_in_executor(None, front.recv_bytes)

    asyncio.run(_serve_lines(port, ready, through_worker))


def main() -> None:
    """Parse arguments and serve forever."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("http", "asyncio", "accept", "workers"), default="http")
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    add_ready_file_arg(parser)
    args = parser.parse_args()
    serve = {"http": serve_http, "asyncio": serve_asyncio, "accept": serve_accept, "workers": serve_workers}
    serve[args.kind](args.port, args.ready_file)


if __name__ == "__main__":
    main()
