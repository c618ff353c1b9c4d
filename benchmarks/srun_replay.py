#!/usr/bin/env python3
"""A stand-in for ``srun --label`` over a step, for ``bench_scale.py --step``: it replays node bundles
made beforehand as srun delivers its tasks' output, each task's line cut into labelled messages of at
most 1,024 bytes (srun's I/O chunk, transports/slurm.py ``STEP_IO_CHUNK``), one task after another
``HANGWATCH_REPLAY_PACE_S`` apart, as the step's collectors finish; its arguments (the step's) are
ignored. It writes the wall time of its last line to ``HANGWATCH_REPLAY_DONE``.

    HANGWATCH_REPLAY=bundles.bin: the bundles, each a 4-byte big-endian length then the bytes.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from pathlib import Path

CHUNK = 1024


def main() -> int:
    data = Path(os.environ["HANGWATCH_REPLAY"]).read_bytes()
    pace = float(os.environ.get("HANGWATCH_REPLAY_PACE_S", "0"))
    bundles = []
    at = 0
    while at < len(data):
        (size,) = struct.unpack_from(">I", data, at)
        bundles.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    width = len(str(len(bundles) - 1))
    out = sys.stdout.buffer
    start = time.monotonic()
    for k, bundle in enumerate(bundles):
        due = start + k * pace
        if pace and due > time.monotonic():
            time.sleep(due - time.monotonic())
        label = f"{k:>{width}}: ".encode()
        body = bundle.rstrip(b"\n")
        pieces = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
        if len(pieces[-1]) == CHUNK:
            pieces.append(b"")  # a message of a full chunk goes on in the next: end the line
        out.write(b"".join(label + piece + b"\n" for piece in pieces))
        out.flush()
    Path(os.environ["HANGWATCH_REPLAY_DONE"]).write_text(repr(time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
