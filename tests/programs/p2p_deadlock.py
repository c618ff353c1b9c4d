"""A point-to-point deadlock as a user's script writes it: two ranks started by ``torch.multiprocessing.spawn``,
with no titles and no RANK in their environment, each calling ``dist.recv`` from the other before its
``dist.send``. Both block in gloo's recv forever; the launcher joins them, its resource tracker reads its
pipe. Neither the launcher nor the tracker is a rank that "never entered" anything.

``--ready-file`` is written by rank 0 just before its recv.
"""

from __future__ import annotations

import argparse
import os
import socket

from _util import add_ready_file_arg
from _util import die_with_parent
from _util import require_torch
from _util import write_ready


def rank_main(rank: int, port: int, ready: str | None) -> None:
    import torch
    import torch.distributed as dist

    die_with_parent()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.zeros(4)
    print(f"rank{rank} receiving", flush=True)
    if rank == 0:
        write_ready(ready)
    dist.recv(t, src=1 - rank)  # both receive first: neither sends
    dist.send(t, dst=1 - rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_ready_file_arg(parser)
    args = parser.parse_args()
    require_torch()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.pop("RANK", None)
    mp.spawn(rank_main, args=(port, args.ready_file), nprocs=2)


if __name__ == "__main__":
    main()
