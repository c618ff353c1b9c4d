"""A torchrun worker script: join the gloo group from torchrun's environment, all_reduce once, print
``done RANK``. Started with more nodes than come (``--nnodes 2`` on one machine), its agent waits in the
rendezvous for the node that never starts.

Example::

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29500 \\
        tests/programs/torchrun_job.py
"""

from __future__ import annotations

import os

from _util import log
from _util import require_torch


def main() -> None:
    dist = require_torch()
    dist.init_process_group("gloo")
    import torch

    tensor = torch.ones(2)
    dist.all_reduce(tensor)
    log(f"done {os.environ['RANK']}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
