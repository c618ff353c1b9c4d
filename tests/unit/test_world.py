"""What a launcher's command line says the world should be, and what of it never came."""

from __future__ import annotations

from hangwatch.analyse.world import expected_world

TORCHRUN = (
    "/venv/bin/python", "/venv/bin/torchrun", "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "0",
    "--master-addr", "127.0.0.1", "--master-port", "29500", "train.py",
)  # fmt: skip


def test_torchrun_on_one_node_of_two_names_the_node_and_ranks_that_never_came():
    world = expected_world([("bash", "run.sh"), TORCHRUN])
    assert world is not None
    assert world.missing() == "node rank 1 (ranks 2-3 of 4)"
    assert world.describe() == (
        "torchrun expects 2 nodes of 2 ranks; this is node rank 0: node rank 1 (ranks 2-3 of 4) never "
        "joined (not started, or cannot reach 127.0.0.1:29500)"
    )


def test_every_spelling_and_the_elastic_range():
    argv = ("python", "-m", "torch.distributed.run", "--nnodes=1:3", "--nproc_per_node=4",
            "--rdzv_endpoint=head:29400", "job.py")  # fmt: skip
    assert expected_world([argv]) is None  # MIN 1: one node is a complete world
    argv = ("python", "-m", "torch.distributed.run", "--nnodes=2:3", "--node_rank=1", "--nproc_per_node=4",
            "--rdzv_endpoint=head:29400", "job.py")  # fmt: skip
    world = expected_world([argv])
    assert world is not None and world.missing() == "node rank 0 (ranks 0-3 of 8)"
    assert world.meet_at == "head:29400"


def test_an_sglang_node_of_two():
    argv = ("python3", "-m", "sglang.launch_server", "--model", "M", "--tp", "16", "--nnodes", "2",
            "--node-rank", "0", "--dist-init-addr", "10.0.0.1:5000")  # fmt: skip
    world = expected_world([argv])
    assert world is not None and world.missing() == "node rank 1"
    assert "10.0.0.1:5000" in world.describe()


def test_one_node_or_no_launcher_expects_nothing_absent():
    assert expected_world([("torchrun", "--nnodes", "1", "--nproc-per-node", "8", "job.py")]) is None
    assert expected_world([("python", "serve.py", "--nnodes", "2")]) is None  # not a launcher we know
    assert expected_world([("torchrun", "--nnodes", "two", "job.py")]) is None  # junk is no world


def test_vllm_data_parallel_across_nodes_counts_its_dp_ranks():
    """vLLM counts DP ranks, not nodes: 4 of them, 2 a node, is two nodes; the head is node 0, a
    headless node the one whose ranks start at --data-parallel-start-rank."""
    head = ("vllm", "serve", "M", "--data-parallel-size", "4", "--data-parallel-size-local", "2",
            "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345")  # fmt: skip
    world = expected_world([head])
    assert world is not None and world.nodes == 2 and world.node_rank == 0
    assert world.missing() == "node rank 1 (DP ranks 2-3 of 4)"
    assert world.describe() == (
        "vllm expects 2 nodes of 2 DP ranks; this is node rank 0: node rank 1 (DP ranks 2-3 of 4) never "
        "joined (not started, or cannot reach 10.0.0.1:13345)"
    )
    other = ("python", "-m", "vllm.entrypoints.openai.api_server", "--headless", "--data_parallel_size=6",
             "--data_parallel_size_local=2", "--data_parallel_start_rank=4")  # fmt: skip
    world = expected_world([other])
    assert world is not None and world.nodes == 3 and world.node_rank == 2
    assert world.missing() == "node rank 0 (DP ranks 0-1 of 6), node rank 1 (DP ranks 2-3 of 6)"


def test_vllm_on_one_node_expects_nothing_absent():
    # Tensor parallel only, or data parallel all on this node (the local size defaults to the whole).
    assert expected_world([("vllm", "serve", "M", "--tensor-parallel-size", "8")]) is None
    assert expected_world([("vllm", "serve", "M", "--data-parallel-size", "2")]) is None
    assert expected_world([("vllm", "serve", "M", "--data-parallel-size", "2",
                            "--data-parallel-size-local", "2")]) is None  # fmt: skip
