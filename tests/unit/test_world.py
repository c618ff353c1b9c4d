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
