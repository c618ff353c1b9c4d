"""How launchers and engines spell the world they expect on their command lines, as data.

torchrun (``--nnodes``, ``--nproc-per-node``, ``--node-rank``, ``--master-addr``/``--master-port`` or
``--rdzv-endpoint``), SGLang (``--nnodes``, ``--node-rank``, ``--dist-init-addr``) and vLLM's multi-node
data parallel (``--data-parallel-size``, ``--data-parallel-size-local``, ``--data-parallel-address``)
each say how many nodes and ranks should come and where they meet. The analysis reads these words
(analyse/world.py) to say what never came; a new launcher is a new entry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorldFlags:
    """One launcher's flags for the world it expects (every spelling: dashes and underscores)."""

    name: str  # "torchrun"
    recognise: tuple[str, ...]  # a command-line word that marks this launcher (the script or module)
    nodes: tuple[str, ...] = ()
    node_rank: tuple[str, ...] = ()
    per_node: tuple[str, ...] = ()  # ranks (processes) per node
    endpoint: tuple[str, ...] = ()  # host:port where the nodes meet
    host: tuple[str, ...] = ()  # or a host and a port of their own
    port: tuple[str, ...] = ()
    # Where the launcher counts ranks, not nodes (vLLM's data parallel): the whole world's ranks and the
    # first rank of this node; the nodes are then the ranks over the ranks per node.
    ranks: tuple[str, ...] = ()
    start_rank: tuple[str, ...] = ()
    rank_word: str = "ranks"  # what its ranks are called ("DP ranks": vLLM's engine cores)


def _both(*flags: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*flags, *("--" + f[2:].replace("-", "_") for f in flags)]))


LAUNCHERS: tuple[WorldFlags, ...] = (
    WorldFlags(
        "torchrun",
        ("torchrun", "torch.distributed.run", "torch.distributed.launch"),
        nodes=_both("--nnodes"),
        node_rank=_both("--node-rank"),
        per_node=_both("--nproc-per-node"),
        endpoint=_both("--rdzv-endpoint"),
        host=_both("--master-addr"),
        port=_both("--master-port"),
    ),
    WorldFlags(
        "sglang",
        ("sglang.launch_server", "sglang.srt", "sglang"),
        nodes=_both("--nnodes"),
        node_rank=_both("--node-rank"),
        endpoint=_both("--dist-init-addr"),
    ),
    WorldFlags(
        "vllm",
        ("vllm", "vllm.entrypoints.openai.api_server"),
        per_node=_both("--data-parallel-size-local"),
        host=_both("--data-parallel-address"),
        port=_both("--data-parallel-rpc-port"),
        ranks=_both("--data-parallel-size"),
        start_rank=_both("--data-parallel-start-rank"),
        rank_word="DP ranks",
    ),
)
