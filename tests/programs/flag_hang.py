"""A start-up whose fate depends on its flags, for ``hangwatch isolate``.

Two "ranks" (the main process and one forked child) load, then capture "graphs" together, then the main
process serves ``GET /health`` on ``--port``:

* ``--spec on`` and ``--graphs on`` (both the defaults) with ``--backend fast`` (the default): rank 1 takes
  the draft path inside ``CudaGraphRunner.capture`` and waits on a queue rank 0 never fills, while rank 0
  waits for rank 1: a real deadlock (both blocked in ``Queue.get``, no CPU, no output).
* ``--strict``: a check fails while loading: a traceback, exit 1.
* ``--load-seconds S``: loading takes S seconds, reading 1 MiB a second (a slow but healthy phase).
* Any of ``--spec off`` (or no ``--spec``), ``--graphs off``, ``--backend safe``: the capture completes
  and the server boots.

``--marker FILE`` appends one line per process (``boot PID alive=... port=... FLAGS`` for the main
process, ``rank PID`` for the child): at each boot, ``alive=`` lists the processes of earlier boots still
there (``none`` when clean-up did its job) and ``port=`` says whether ``--port`` was free to bind.

Example::

    python tests/programs/flag_hang.py --port 8000 --spec on --graphs on
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from _util import log
from _util import serve_health


class CudaGraphRunner:
    """Captures "graphs" with its peer; with speculative decoding and the fast backend, rank 1 takes the
    draft path and waits for a draft buffer rank 0 never sends."""

    def __init__(self, rank: int, to_peer: Any, from_peer: Any, draft: Any, spec: bool, fast: bool) -> None:
        self.rank = rank
        self.to_peer = to_peer
        self.from_peer = from_peer
        self.draft = draft
        self.spec = spec
        self.fast = fast

    def capture(self) -> None:
        for bs in (8, 4, 2, 1):
            log(f"[rank {self.rank}] Capturing batches (bs={bs})")
            if self.spec and self.fast and self.rank == 1 and bs == 4:
                self.broadcast_draft_buffers()
            self.all_reduce(bs)
        log(f"[rank {self.rank}] Capture done")

    def broadcast_draft_buffers(self) -> None:
        self.draft.get()  # rank 0 never puts: blocks forever

    def all_reduce(self, bs: int) -> None:
        self.to_peer.put(bs)
        got = self.from_peer.get()  # blocks forever once the peer is stuck
        assert got == bs


def rank1(to_peer: Any, from_peer: Any, draft: Any, spec: bool, fast: bool, marker: str | None) -> None:
    if marker:
        with Path(marker).open("a") as f:
            f.write(f"rank {os.getpid()}\n")
    CudaGraphRunner(1, to_peer, from_peer, draft, spec, fast).capture()


def earlier_alive(marker: Path) -> list[int]:
    """The processes of earlier boots (from the marker file) that still exist with a thread left (a zombie
    main thread whose peers still run, or still die, is not gone: num_threads counts them)."""
    if not marker.exists():
        return []
    alive = []
    for line in marker.read_text().splitlines():
        pid = int(line.split()[1])
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" or int(fields[17]) > 1:
            alive.append(pid)
    return alive


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--spec", choices=("on", "off"), default="off")
    parser.add_argument("--graphs", choices=("on", "off"), default="on")
    parser.add_argument("--backend", choices=("fast", "safe"), default="fast")
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--load-seconds", type=float, default=0.2)
    parser.add_argument("--marker", help="append one line per boot to this file")
    args = parser.parse_args()
    if args.marker:
        alive = earlier_alive(Path(args.marker))
        with Path(args.marker).open("a") as f:
            port = "free" if port_free(args.port) else "busy"
            f.write(f"boot {os.getpid()} alive={','.join(map(str, alive)) or 'none'} port={port} ")
            f.write(" ".join(sys.argv[1:]) + "\n")
    log("Loading weights")
    end = time.monotonic() + args.load_seconds
    with Path("/dev/zero").open("rb") as weights:
        while time.monotonic() < end:
            weights.read(1 << 20)  # I/O that hangwatch counts as progress, as a real load's reads
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
    if args.strict:
        raise RuntimeError("strict check failed: the weights' checksum does not match")
    log("Weights loaded")
    spec, fast = args.spec == "on", args.backend == "fast"
    if args.graphs == "on":
        ctx = mp.get_context("fork")
        to_1, to_0, draft = ctx.Queue(), ctx.Queue(), ctx.Queue()
        child = ctx.Process(target=rank1, args=(to_0, to_1, draft, spec, fast, args.marker), name="rank1")
        child.start()
        CudaGraphRunner(0, to_1, to_0, draft, spec, fast).capture()
        child.join()
    serve_health(args.port)


if __name__ == "__main__":
    main()
