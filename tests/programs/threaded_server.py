"""A thread-per-request HTTP server (the standard library's ``ThreadingHTTPServer``, as Flask's development
server and many Python model servers are) whose completion handler never returns, while its main thread
keeps accepting and answering ``/health``.

Beside the handlers run the threads a real server has, which must not be taken for the wedge: a
housekeeping thread that wakes on a timer (``Event.wait(0.5)`` in a loop) and a thread pool's idle worker
waiting for work on its queue.

``--wedge event|lock|spin`` (what the handler of ``POST /v1/completions`` does):

- ``event``: waits on an ``Event`` nobody sets;
- ``lock``: takes a lock that a background thread holds while it waits forever;
- ``spin``: a busy Python loop.

Example::

    python tests/programs/threaded_server.py --port 8000 --wedge event
"""

from __future__ import annotations

import argparse
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

from _util import add_ready_file_arg
from _util import log
from _util import write_ready

never = threading.Event()
held = threading.Lock()


def _housekeeping(stop: threading.Event) -> None:
    while not stop.wait(0.5):
        pass


def _hold_the_lock() -> None:
    with held:
        never.wait()


def _wedge(how: str) -> None:
    log(f"handler wedges ({how})")
    if how == "event":
        never.wait()
    elif how == "lock":
        with held:
            pass
    n = 0
    while True:
        n += 1


class Handler(BaseHTTPRequestHandler):
    wedge = "event"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, code: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/v1/"):
            _wedge(self.wedge)
        self._send(404, {"error": "not found"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--wedge", choices=("event", "lock", "spin"), default="event")
    add_ready_file_arg(parser)
    args = parser.parse_args()
    Handler.wedge = args.wedge
    threading.Thread(
        target=_housekeeping, args=(threading.Event(),), name="housekeeping", daemon=True
    ).start()
    if args.wedge == "lock":
        threading.Thread(target=_hold_the_lock, name="lock-holder", daemon=True).start()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool")
    pool.submit(lambda: None).result()  # its worker now idles on its queue
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    log(f"listening on 127.0.0.1:{args.port}")
    write_ready(args.ready_file, f"{args.port}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
