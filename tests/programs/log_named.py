"""Processes named by their log lines, and a forked helper that carries its parent's title.

A vLLM-like launcher starts a worker (``spawn``) that never sets a process title but prefixes its
lines ``(Worker_TP1 pid=N)``, as vLLM's workers do long before their titles are set; then a titled
worker (``VLLM::Worker_TP0``) forks a helper, which inherits that title as a scheduler's compile
helpers do. After ``--seconds`` it prints ``all done`` and every process lingers until killed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

from _util import block_forever
from _util import log
from _util import set_title


def untitled_worker(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        log(f"(Worker_TP1 pid={os.getpid()}) INFO loading shard")
        time.sleep(0.5)
    block_forever()


def titled_worker() -> None:
    set_title("VLLM::Worker_TP0")
    if os.fork() == 0:
        block_forever()  # the helper: the same title, not a rank
    block_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=untitled_worker, args=(args.seconds,)), ctx.Process(target=titled_worker)]
    for w in workers:
        w.start()
    time.sleep(args.seconds + 1.5)
    log("all done")
    block_forever()


if __name__ == "__main__":
    main()
