"""A start-up that hangs in a seeded fraction of its boots, for ``hangwatch isolate --repeat``.

Boot number n (counted in ``--counter FILE``, shared by every boot of a test) hangs when
``random.Random(f"{seed}-{n}").random() < --hang-fraction``: the main thread waits on a queue nothing
will ever fill. Otherwise it serves ``GET /health`` on ``--port``. ``outcome(seed, n, fraction)`` below
is the same rule, for a test to know what to expect.

Example::

    python tests/programs/flaky_boot.py --port 8000 --counter /tmp/n --seed 3 --hang-fraction 0.5
"""

from __future__ import annotations

import argparse
import fcntl
import queue
import random
import time
from pathlib import Path

from _util import log
from _util import serve_health


def outcome(seed: int, n: int, fraction: float) -> bool:
    """True when boot ``n`` hangs."""
    return random.Random(f"{seed}-{n}").random() < fraction


def next_boot(counter: Path) -> int:
    with counter.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = len(f.read().splitlines())
        f.write(f"{n}\n")
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--counter", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-fraction", type=float, default=0.5)
    args = parser.parse_args()
    n = next_boot(Path(args.counter))
    log(f"boot {n}: loading")
    time.sleep(0.2)
    if outcome(args.seed, n, args.hang_fraction):
        log(f"boot {n}: waiting for the scheduler")
        queue.Queue().get()  # forever
    serve_health(args.port)


if __name__ == "__main__":
    main()
