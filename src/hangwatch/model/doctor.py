"""What ``hangwatch doctor`` found: the facts it collected, the checks it made, and the report.

Everything is frozen and typed; the JSON report (schema ``hangwatch.doctor/1``) is
``dataclasses.asdict`` of :class:`DoctorReport`, never a dict assembled by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from enum import StrEnum

from hangwatch.model.samples import GpuProcessMemory

DOCTOR_SCHEMA = "hangwatch.doctor/1"


class Status(StrEnum):
    PASS = "pass"  # noqa: S105 - a check status, not a password
    WARN = "warn"
    FAIL = "fail"


_RANK = {Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2}


def worst(statuses: list[Status] | tuple[Status, ...]) -> Status:
    return max(statuses, key=_RANK.__getitem__, default=Status.PASS)


@dataclass(frozen=True)
class Check:
    """One line of the checklist: what was checked, how it went, the evidence, and what to do."""

    name: str
    status: Status
    summary: str
    evidence: tuple[str, ...] = ()
    fix: str | None = None


# -- GPU code: fat binaries and what they can run on ------------------------------------------


class EntryKind(StrEnum):
    SASS = "sass"  # machine code (a cubin ELF) for one architecture
    PTX = "ptx"  # virtual-architecture code the driver compiles (JIT) at load time
    OTHER = "other"  # a kind this reader does not know (LTO IR, ...): counted, never judged


@dataclass(frozen=True)
class FatbinEntry:
    """One entry of a fat binary container, read from its header alone."""

    kind: EntryKind
    arch: int  # 90 for sm_90 / compute_90; 120 for sm_120
    variant: str = ""  # "" plain, "a" arch-specific (sm_90a), "f" family-specific (sm_100f)
    ptx_version: str | None = None  # PTX ISA version of a PTX entry, "9.0"
    compression: str | None = None  # "zstd", "lz4" or None
    size: int = 0  # bytes of the (possibly compressed) payload

    @property
    def target(self) -> str:
        prefix = "compute" if self.kind is EntryKind.PTX else "sm"
        return f"{prefix}_{self.arch}{self.variant}"


@dataclass(frozen=True)
class FatbinContainer:
    """One fatbin container (about one translation unit's device code)."""

    section: str  # ".nv_fatbin", "__nv_relfatbin", or "segment" when found without section headers
    offset: int
    entries: tuple[FatbinEntry, ...]

    @property
    def relocatable(self) -> bool:
        # __nv_relfatbin holds device code kept for a later device link; the runtime loads .nv_fatbin.
        return self.section == "__nv_relfatbin"


@dataclass(frozen=True)
class ModuleScan:
    """The fat binaries of one shared object, or why it could not be read."""

    path: str
    containers: tuple[FatbinContainer, ...] = ()
    problems: tuple[str, ...] = ()  # damaged or unknown structures, skipped with the reason
    unreadable: str | None = None  # not an ELF file we can read at all
    seconds: float = 0.0

    @property
    def loadable(self) -> tuple[FatbinContainer, ...]:
        """The containers the CUDA runtime registers when the library is loaded."""
        normal = tuple(c for c in self.containers if not c.relocatable)
        return normal or self.containers

    @property
    def has_device_code(self) -> bool:
        return any(c.entries for c in self.containers)

    def targets(self, kind: EntryKind) -> tuple[str, ...]:
        found = {e.target for c in self.loadable for e in c.entries if e.kind is kind}
        return tuple(sorted(found, key=_target_order))


def _target_order(target: str) -> tuple[int, str]:
    digits = "".join(ch for ch in target.split("_", 1)[-1] if ch.isdigit())
    return (int(digits or 0), target)


class Coverage(StrEnum):
    NATIVE = "native"  # SASS the GPU runs as is
    JIT = "jit"  # only PTX: the driver compiles it at first load (slow first start)
    NONE = "none"  # nothing this GPU can run: "no kernel image is available for execution"


@dataclass(frozen=True)
class ModuleCoverage:
    """A module's GPU code against the GPUs checked (the JSON ``modules`` list)."""

    path: str
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    verdict: Coverage  # the worst over the capabilities checked
    package: str | None = None
    by_capability: tuple[tuple[str, Coverage], ...] = ()  # (("12.0", "none"), ...)
    reason: str = ""
    partial: str | None = None  # "12 of 340 containers have no code for 12.0" (runtime dispatch may be fine)
    ptx_versions: tuple[str, ...] = ()
    # The one backend or feature that uses this module ("FlashAttention-3 ..."); None: core code.
    feature: str | None = None


# -- facts collected before judging ------------------------------------------------------------


@dataclass(frozen=True)
class GpuFacts:
    index: int
    name: str
    capability: tuple[int, int] | None  # None when NVML could not say
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    util_pct: float | None = None
    uuid: str | None = None
    nvlinks: int | None = None  # active NVLinks; 0 for a PCIe-only card
    synthetic: bool = False  # from --capability, not a GPU NVML saw


@dataclass(frozen=True)
class GpuInventory:
    """What NVML says about the machine's GPUs, once (not a time series)."""

    unavailable: str | None = None
    driver_version: str | None = None  # "580.159.03"
    cuda_driver_version: tuple[int, int] | None = None  # the newest CUDA the driver supports: (13, 0)
    gpus: tuple[GpuFacts, ...] = ()
    processes: tuple[GpuProcessMemory, ...] = ()  # the same record a watch's GpuSample holds
    # (gpu a, gpu b, level name): "NVLINK", "PIX", "PXB", "PHB", "NODE", "SYS" per NVML's topology.
    links: tuple[tuple[int, int, str], ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExtensionModule:
    path: str
    package: str
    size: int


@dataclass(frozen=True)
class PyEnvFacts:
    """The target environment's interpreter, as it describes itself from a subprocess."""

    python: str
    error: str | None = None  # the interpreter could not be run or said nothing we could read
    python_version: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None  # torch.version.cuda; None for a CPU build
    torch_arch_list: tuple[str, ...] = ()
    torch_error: str | None = None
    nccl_version: str | None = None  # the NCCL torch reports
    packages: tuple[tuple[str, str], ...] = ()  # (distribution, version) of the ones that matter here
    site_packages: tuple[str, ...] = ()
    extensions: tuple[ExtensionModule, ...] = ()
    listing_s: float = 0.0
    elapsed_s: float = 0.0

    def version_of(self, *names: str) -> str | None:
        wanted = {n.lower().replace("_", "-") for n in names}
        for name, version in self.packages:
            if name.lower().replace("_", "-") in wanted:
                return version
        return None


@dataclass(frozen=True)
class PortFacts:
    port: int
    free: bool
    holders: tuple[tuple[int, str], ...] = ()  # (pid, title) of processes listening on it
    error: str | None = None


@dataclass(frozen=True)
class CacheFolder:
    """A folder a tool caches in, as the tool resolves it: its variable, else a folder of the XDG cache."""

    purpose: str  # "Hugging Face cache"
    env_var: str
    xdg_name: str  # the folder under $XDG_CACHE_HOME (~/.cache) when the variable is unset


@dataclass(frozen=True)
class DirSpace:
    purpose: str  # "Hugging Face cache", "torch.compile (Inductor) cache"
    path: str
    free_bytes: int | None
    fs_type: str | None = None


@dataclass(frozen=True)
class DeviceHolder:
    """A process with /dev/nvidia* open."""

    pid: int
    title: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class HostFacts:
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None
    nofile_soft: int | None = None
    nofile_hard: int | None = None
    memlock_soft: int | None = None  # None also for RLIM_INFINITY: see memlock_unlimited
    memlock_unlimited: bool = False
    mem_available_bytes: int | None = None
    mem_total_bytes: int | None = None
    cgroup_limit_bytes: int | None = None
    infiniband: tuple[str, ...] = ()
    net_interfaces: tuple[str, ...] = ()
    cache_dirs: tuple[DirSpace, ...] = ()
    device_holders: tuple[DeviceHolder, ...] = ()
    device_scan_denied: int = 0  # processes whose fds we may not read
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckpointFacts:
    path: str
    total_bytes: int | None
    source: str  # "model.safetensors.index.json metadata.total_size" or "sum of 4 *.safetensors files"
    error: str | None = None


@dataclass(frozen=True)
class DoctorReport:
    schema: str
    created_at: str
    mode: str  # "full" or "fast"
    capabilities: tuple[str, ...]  # the GPU capabilities checked, "9.0"
    checks: tuple[Check, ...]
    modules: tuple[ModuleCoverage, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def status(self) -> Status:
        return worst([c.status for c in self.checks])

    @property
    def exit_code(self) -> int:
        return {Status.PASS: 0, Status.WARN: 1, Status.FAIL: 3}[self.status]
