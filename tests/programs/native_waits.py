"""Threads parked in every common kind of wait, for comparing two native unwinders on one process.

One thread each: ``time.sleep``, a ``Lock.acquire`` nobody releases, ``Event.wait``, an ``os.read`` of a
pipe nobody writes, ``Queue.get``, ``subprocess.run`` of ``sleep`` (a ``waitpid``), a 300-deep Python
recursion ending in a sleep, and a C call through ctypes (libc's ``pause``); ``--torch-port P`` adds a
two-rank gloo group on loopback whose rank 0 enters an ``all_reduce`` rank 1 never joins (native frames
inside libtorch: ``c10d::Work::wait``, gloo's ``waitRecv``). The main thread writes a heartbeat counter
to ``--heartbeat`` ten times a second: a test reads it to see the process still runs after being
unwound. ``--ready`` is written once every thread is in its wait.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import queue
import subprocess
import threading
import time

from _util import die_with_parent
from _util import log
from _util import write_ready


def deep(n: int) -> None:
    if n == 0:
        time.sleep(3600)
    deep(n - 1)


ENTERING = threading.Event()  # the gloo thread is about to enter its all_reduce


def gloo_pair(port: int) -> None:
    """Rank 1 (a child process) joins the group and sleeps; rank 0 (here) waits in the all_reduce."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    code = (
        "import os, time, torch.distributed as dist\n"
        "dist.init_process_group('gloo', rank=1, world_size=2)\n"
        "time.sleep(3600)\n"
    )
    import sys

    subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RANK": "1"})
    dist.init_process_group("gloo", rank=0, world_size=2)
    ENTERING.set()
    dist.all_reduce(torch.ones(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ready", required=True)
    parser.add_argument("--heartbeat", required=True)
    parser.add_argument("--torch-port", type=int, default=0, help="add the gloo pair on this port")
    args = parser.parse_args()
    die_with_parent()
    lock = threading.Lock()
    lock.acquire()
    read_end, _write_end = os.pipe()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    waits = {
        "sleeper": lambda: time.sleep(3600),
        "locker": lock.acquire,
        "eventer": threading.Event().wait,
        "piper": lambda: os.read(read_end, 1),
        "queuer": queue.Queue().get,
        "waiter": lambda: subprocess.run(["sleep", "3600"], check=False),
        "deep": lambda: deep(300),
        "native": libc.pause,
    }
    if args.torch_port:
        waits["gloo"] = lambda: gloo_pair(args.torch_port)
    for name, target in waits.items():
        threading.Thread(target=target, name=name, daemon=True).start()
    if args.torch_port and not ENTERING.wait(120):
        raise SystemExit("the gloo pair did not form in 120 s")
    time.sleep(0.5)  # each thread into its wait
    write_ready(args.ready)
    log("waiting")
    beats = 0
    while True:
        beats += 1
        with open(args.heartbeat, "w") as f:
            f.write(str(beats))
        time.sleep(0.1)


if __name__ == "__main__":
    main()
