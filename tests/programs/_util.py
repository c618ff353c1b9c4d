"""Shared bits of the purpose-built test programs in this folder.

Every program here is a script run as ``python tests/programs/NAME.py``; Python puts the script's folder
first on ``sys.path``, so ``import _util`` works from the script and from its ``spawn`` children (which
inherit the parent's ``sys.path``). Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import http.server
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1


def log(message: str) -> None:
    """Print one log line to stdout and flush it at once (a watcher reads the pipe live)."""
    print(message, flush=True)


def write_ready(path: str | None, text: str = "ready\n") -> None:
    """Atomically write ``text`` to ``path`` (tmp file + rename), so a reader never sees half a file."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(target)


def add_ready_file_arg(parser: argparse.ArgumentParser) -> None:
    """Add the ``--ready-file PATH`` option every program shares."""
    parser.add_argument(
        "--ready-file",
        metavar="PATH",
        help="write 'ready' here (atomically) once the program reaches its interesting state",
    )


def signal_self(rank: int, go: Any, delay: float, sig: signal.Signals) -> None:
    """The victim rank's act: wait for the launcher's go-ahead (an Event set once the ready file is written),
    ``delay`` seconds more, then send itself ``sig`` (SIGKILL: a dead peer; SIGSTOP: a stopped one)."""
    go.wait()
    time.sleep(delay)
    log(f"[rank {rank}] sending {sig.name} to myself")
    os.kill(os.getpid(), sig)


def set_title(title: str) -> None:
    """Name this process like the engines do: setproctitle when installed, else only /proc/PID/comm.

    setproctitle rewrites /proc/PID/cmdline and also sets comm; without it only comm (15 bytes) can be
    changed, through prctl(PR_SET_NAME).
    """
    try:
        import setproctitle
    except ImportError:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    else:
        setproctitle.setproctitle(title)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies, as SGLang's schedulers do.

    Keeps hand-run programs from leaving orphans behind; harmless under the test reaper.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def block_forever() -> None:
    """Sleep forever in one long ``time.sleep`` per hour: state S, no CPU, no output."""
    while True:
        time.sleep(3600)


class _HealthHandler(http.server.BaseHTTPRequestHandler):
    """GET /health answers 200 (or 503 while warming up); every other path 404."""

    server: _HealthServer

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/health":
            self._reply(404, b"not found\n")
        elif time.monotonic() < self.server.healthy_at:
            self._reply(503, b"warming up\n")
        else:
            self._reply(200, b"ok\n")

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Access lines are log output; a watcher would count them as progress, so they are opt-in.
        if self.server.access_log:
            log(f"{self.address_string()} - {format % args}")


class _HealthServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    healthy_at: float = 0.0
    access_log: bool = False


def serve_health(
    port: int, health_after: float = 0.0, access_log: bool = False, ready_file: str | None = None
) -> None:
    """Serve GET /health on 127.0.0.1:port forever; print ``Server ready on port N`` once listening.

    ``health_after`` seconds after listening /health turns from 503 into 200.
    """
    server = _HealthServer(("127.0.0.1", port), _HealthHandler)
    server.healthy_at = time.monotonic() + health_after
    server.access_log = access_log
    bound = server.server_address[1]
    log(f"Server ready on port {bound}")
    write_ready(ready_file)
    server.serve_forever()


def compile_like(seconds: float) -> int:
    """Work like a compiler for ``seconds``: build expression trees and fold them, recursively.

    100 % of one core, no syscalls, no output, and the stack moves: each capture finds the recursion
    at another depth and in another function, as a real compiler (Dynamo, Inductor, a parser) is
    found. Compare ``burn_cpu``, a loop that stays on one line: by behaviour that is a spin, not work.
    """
    import random

    rng = random.Random(7)
    deadline = time.monotonic() + seconds
    total = 0

    def build(depth: int) -> Any:
        if depth == 0 or rng.random() < 0.15:
            return rng.randint(1, 99)
        return (rng.choice("+*"), build(depth - 1), build(depth - 1))

    def fold(node: Any) -> int:
        if isinstance(node, int):
            return node
        op, left, right = node
        a, b = fold(left), fold(right)
        return (a + b) & 0xFFFF if op == "+" else (a * b) & 0xFFFF

    while time.monotonic() < deadline:
        total = (total + fold(build(rng.randint(6, 14)))) & 0xFFFFFFFF
    return total


def burn_cpu(seconds: float) -> int:
    """Spin a pure-Python loop for ``seconds``: 100 % of one core, no syscalls, no output.

    The stack stays on one line for the whole time: by behaviour, a spin (``compile_like`` works).
    """
    deadline = time.monotonic() + seconds  # vDSO clock: reading it is not a syscall
    x = 1
    while True:
        for _ in range(20000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        if time.monotonic() >= deadline:
            return x


def require_torch() -> Any:
    """Import torch.distributed or exit 2 with a message (the gloo programs need torch, CPU is enough)."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        print(f"this program needs torch (pip install torch==2.13.0): {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    if not dist.is_available() or not dist.is_gloo_available():
        print("this torch build has no torch.distributed gloo backend", file=sys.stderr, flush=True)
        sys.exit(2)
    return dist
