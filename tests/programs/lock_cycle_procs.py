"""A lock-order deadlock between two processes: multiprocessing locks taken in opposite order.

Process ``locker-A`` takes ``lock_a``, process ``locker-B`` takes ``lock_b``; once each holds its
first lock (a barrier makes it certain) A asks for ``lock_b`` and B for ``lock_a``: both wait in
``SemLock.__enter__`` forever (state S, 0 % CPU, no output). The launcher ``join()``s them and writes
``--ready-file`` once both hold their first lock.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from multiprocessing.synchronize import Barrier
from multiprocessing.synchronize import Lock

from _util import add_ready_file_arg
from _util import die_with_parent
from _util import log
from _util import set_title
from _util import write_ready


def locker(name: str, first: Lock, second: Lock, both: Barrier) -> None:
    set_title(f"locker-{name}")
    die_with_parent()
    with first:
        both.wait()
        with second:  # never acquired: the other process holds it and waits for ours
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_ready_file_arg(parser)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    lock_a, lock_b = ctx.Lock(), ctx.Lock()
    both = ctx.Barrier(3)
    procs = [
        ctx.Process(target=locker, args=("A", lock_a, lock_b, both)),
        ctx.Process(target=locker, args=("B", lock_b, lock_a, both)),
    ]
    for p in procs:
        p.start()
    both.wait()
    log("deadlocked")
    write_ready(args.ready_file, "deadlocked\n")
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
