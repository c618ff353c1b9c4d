"""Which processes of a Slurm job are ranks: what a real Slurm 22.05 showed (docs/multinode.md 6).

Every process of a step carries SLURM_PROCID, the step's task number: the agent that ``srun torchrun ...``
starts on each node (SLURM_PROCID 0-2, one task per node), its workers (RANK 0-3, and their agent's
SLURM_PROCID), and the ``srun`` of the batch script itself (task 0 of the batch step, its command line
matching the job's ``--match``). Only the workers are ranks; a task that launches nothing is one
(``srun python train.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from hangwatch.collect.proctree import TreeSampler
from hangwatch.engines.generic import generic_role
from proc_helpers import kill_tree
from proc_helpers import wait_until

# An agent (Slurm task 0 of a step) that starts two workers with a RANK of their own, as torchrun does.
AGENT = """
import os, subprocess, sys, time
for rank in ("0", "1"):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "RANK": rank})
time.sleep(60)
"""


@pytest.fixture
def step() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """An agent task with two workers, and a plain task (SLURM_PROCID 1) that launches nothing."""
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID")}
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT], env={**base, "SLURM_PROCID": "0"}, start_new_session=True
    )
    plain = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**base, "SLURM_PROCID": "1"},
        start_new_session=True,
    )
    try:
        yield agent, plain
    finally:
        kill_tree(agent)
        kill_tree(plain)


def test_a_slurm_task_that_launches_ranks_is_their_launcher_not_a_rank(
    step: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]],
) -> None:
    agent, plain = step
    sampler = TreeSampler([agent.pid, plain.pid], generic_role, watch_deaths=False)
    try:

        def three_ranks() -> dict[int, tuple[str | None, str | None]] | None:
            roles = {p.pid: (p.role, p.rank) for p in sampler.sample(0.0).processes}
            return roles if sum(role == "rank" for role, _ in roles.values()) == 3 else None

        roles = wait_until(three_ranks, 20, interval=0.1, what="the workers started")
    finally:
        sampler.close()
    assert roles[agent.pid] == ("main", None)
    assert roles[plain.pid] == ("rank", "1")
    workers = sorted(rank for pid, (role, rank) in roles.items() if pid not in (agent.pid, plain.pid))
    assert workers == ["0", "1"]


@pytest.mark.parametrize("program", ["srun", "/usr/bin/srun", "slurmstepd", "salloc"])
def test_slurms_own_programs_are_never_ranks(program: str) -> None:
    title = program.rsplit("/", 1)[-1]
    env = {"SLURM_PROCID": "0"}
    assert generic_role(title, (program, "sh", "-c", "python train.py"), True, env) == ("main", None)
    assert generic_role(title, (program,), False, env) == (None, None)
    assert generic_role("python", ("python", "train.py"), False, env) == ("rank", "0")
