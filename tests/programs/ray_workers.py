"""A driver that starts vLLM-like Ray worker actors on a running head and leaves them hung.

``--world N`` detached actors of class ``RayWorkerWrapper`` named ``vllm_Worker_test_TP<r>`` (vLLM 0.33's
naming), each joining one gloo process group; every rank enters an all_reduce except ``--culprit R``,
which sleeps in ``rank_busy_elsewhere``: the others wait in the collective for it. Writes
``READY_DIR/rankR`` just before the call each blocks in, then exits (the actors are detached).
``--place R=NODE_ID[:IFNAME]`` pins rank R to a Ray node (NodeAffinitySchedulingStrategy, not soft) and
names the interface gloo binds there: the emulated nodes have no route to each other's hostnames, so gloo
must be told (GLOO_SOCKET_IFNAME), as on real multi-homed nodes. Runs in the Ray venv (ray and torch);
needs nothing of hangwatch.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
class RayWorkerWrapper:
    def run(
        self, rank: int, world: int, master: str, port: int, culprit: int, ready: str, ifname: str
    ) -> None:
        import torch
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port))
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
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
    ap.add_argument("--master-addr", default="127.0.0.1", help="where rank 0's TCPStore listens")
    ap.add_argument("--place", action="append", default=[], metavar="R=NODE_ID[:IFNAME]")
    a = ap.parse_args()
    places = {}
    for item in a.place:
        rank, _, where = item.partition("=")
        node_id, _, ifname = where.partition(":")
        places[int(rank)] = (node_id, ifname)
    ray.init(address=a.address, namespace="hangwatch-test", log_to_driver=False)
    actors = []
    for r in range(a.world):
        options: dict = {"name": f"vllm_Worker_test_TP{r}", "lifetime": "detached"}
        if r in places:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(places[r][0], soft=False)
        actors.append(RayWorkerWrapper.options(**options).remote())
    for r, actor in enumerate(actors):
        ifname = places.get(r, ("", ""))[1]
        actor.run.remote(r, a.world, a.master_addr, a.port, a.culprit, a.ready_dir, ifname)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(list(Path(a.ready_dir).glob("rank*"))) < a.world:
        time.sleep(0.2)


if __name__ == "__main__":
    main()
