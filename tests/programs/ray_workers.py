"""A driver that starts vLLM-like Ray worker actors on a running head and leaves them hung.

``--world N`` detached actors of class ``RayWorkerWrapper`` named ``vllm_Worker_test_TP<r>`` (vLLM 0.33's
naming), each joining one gloo process group; every rank enters an all_reduce except ``--culprit R``,
which sleeps in ``rank_busy_elsewhere``: the others wait in the collective for it. Writes
``READY_DIR/rankR`` just before the call each blocks in, then exits (the actors are detached).
Runs in the Ray venv (ray and torch); needs nothing of hangwatch.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import ray


@ray.remote(num_cpus=0)
class RayWorkerWrapper:
    def run(self, rank: int, world: int, port: int, culprit: int, ready: str) -> None:
        import torch
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        from datetime import timedelta

        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(hours=1))
        Path(ready, f"rank{rank}").write_text("ready")
        if rank == culprit:
            rank_busy_elsewhere()
        dist.all_reduce(torch.ones(1))


def rank_busy_elsewhere() -> None:
    while True:
        time.sleep(3600)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", required=True)
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--culprit", type=int, default=2)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ready-dir", required=True)
    a = ap.parse_args()
    ray.init(address=a.address, namespace="hangwatch-test", log_to_driver=False)
    actors = [
        RayWorkerWrapper.options(name=f"vllm_Worker_test_TP{r}", lifetime="detached").remote()
        for r in range(a.world)
    ]
    for r, actor in enumerate(actors):
        actor.run.remote(r, a.world, a.port, a.culprit, a.ready_dir)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(list(Path(a.ready_dir).glob("rank*"))) < a.world:
        time.sleep(0.2)


if __name__ == "__main__":
    main()
