"""A "server" that makes visible progress for a while and then goes silent forever (stall latency).

Prints ``progress step N/M`` every ``--interval`` seconds (default 0.5) for ``--seconds`` (default 5),
then writes ``--ready-file`` (its mtime marks the start of the stall) and hangs in ``time.sleep``:
state S, no CPU, no I/O. With ``--waiting-line TEXT`` the hung process still prints ``TEXT`` every
``--waiting-every`` seconds, like vLLM's ``No available shared memory broadcast block found in 60
seconds...`` lines from a process that is itself waiting on a stuck peer: output that is not progress.
With ``--resume-after S`` it is silent for S seconds only, then progresses again for good.

Example::

    python tests/programs/progress_then_hang.py --seconds 3 --waiting-line "still waiting" --waiting-every 2
"""

from __future__ import annotations

import argparse
import math
import time

from _util import add_ready_file_arg
from _util import block_forever
from _util import log
from _util import write_ready


def main() -> None:
    """Make progress, then hang (optionally printing a still-waiting line)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to make progress")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between progress lines")
    parser.add_argument("--waiting-line", metavar="TEXT", help="line to print periodically while hung")
    parser.add_argument("--waiting-every", type=float, default=60.0, help="period of --waiting-line")
    parser.add_argument(
        "--resume-after",
        type=float,
        metavar="S",
        help="after S seconds silent, progress again for good (a long GC, a late peer): a stall that ends",
    )
    add_ready_file_arg(parser)
    args = parser.parse_args()

    steps = max(1, math.ceil(args.seconds / args.interval))
    start = time.monotonic()
    for step in range(1, steps + 1):
        log(f"progress step {step}/{steps}")
        if step < steps:
            # Absolute schedule: the line rate does not drift with print cost.
            time.sleep(max(0.0, start + step * args.interval - time.monotonic()))
    write_ready(args.ready_file)
    if args.resume_after is not None:
        time.sleep(args.resume_after)
        step = 0
        while True:  # real work between the lines (about 0.2 s of CPU): a loop that only slept and printed
            step += 1  # would be a wait that logs, a heartbeat
            done = sum(i * i for i in range(2_000_000 + step))
            log(f"progress again: step {step} ({done % 997})")
            time.sleep(args.interval)
    if not args.waiting_line:
        block_forever()
    hung_at = time.monotonic()
    beat = 0
    while True:
        beat += 1
        time.sleep(max(0.0, hung_at + beat * args.waiting_every - time.monotonic()))
        log(args.waiting_line)


if __name__ == "__main__":
    main()
