"""A torchrun-like launcher: plain ``python3`` processes whose ranks only their environment names.

The launcher starts ``--ranks`` children of the same interpreter (so the same title) with RANK,
LOCAL_RANK and WORLD_SIZE set, as torchrun and the GPU programs' launchers do; each child prints one
line and blocks. After every child has spoken the launcher prints ``all ranks up``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from _util import block_forever
from _util import log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        log(f"rank {os.environ['RANK']} up")
        block_forever()
    children = []
    for rank in range(args.ranks):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(args.ranks)}
        children.append(
            subprocess.Popen(
                [sys.executable, __file__, "--child"], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    for child in children:
        assert child.stdout is not None
        print(child.stdout.readline().strip(), flush=True)
    log("all ranks up")
    block_forever()


if __name__ == "__main__":
    main()
