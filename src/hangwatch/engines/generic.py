"""Any program: ready by --ready-url (2xx) or --ready-pattern; ranks from the launcher's environment."""

from __future__ import annotations

from pathlib import PurePath

from hangwatch.engines.bootflags import BootFlags
from hangwatch.engines.profile import Profile
from hangwatch.model.samples import SUCCESS_STATUSES

# Slurm's own programs inherit the step's SLURM_PROCID (the srun of a batch script is task 0 of the batch
# step, and matches the job's --match through its command line): never a rank of the job.
SLURM_PROGRAMS = frozenset({"srun", "salloc", "sbatch", "sattach", "slurmstepd"})


def generic_role(
    title: str, cmdline: tuple[str, ...], is_root: bool, env: dict[str, str]
) -> tuple[str | None, str | None]:
    """torchrun/SLURM/MPI ranks from the environment (RANK=3 -> rank 3); the launched command is ``main``."""
    program = PurePath(cmdline[0]).name if cmdline else ""
    if title not in SLURM_PROGRAMS and program not in SLURM_PROGRAMS:
        for key in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
            if key in env:
                return "rank", env[key]
    if is_root:
        return "main", None
    return None, None


GENERIC = Profile(
    name="generic",
    phases=(),
    role_of=generic_role,
    ready_statuses=SUCCESS_STATUSES,
    extra_phase_labels={"running": "running", "ready": "serving"},
    # torchrun and its kin start this many ranks, which is what a rendezvous waits for; the version is
    # torch's (torch.distributed) when it has one.
    boot=BootFlags(
        switches=(("--nproc-per-node", True), ("--nproc_per_node", True), ("--nnodes", True)),
        versions=("torch",),
    ),
)
