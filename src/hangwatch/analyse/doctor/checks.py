"""Doctor's host, GPU, version and environment checks: named pure functions from facts to ``Check``.

Each function documents the failure it guards against (see docs/engine-facts.md: "Hangs seen in the
wild", the engines' flags and NCCL's variables). Thresholds are named constants, chosen where a server
stops working or starts looking hung, not where it gets a little slower.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence

from hangwatch.engines import registry
from hangwatch.model.doctor import Check
from hangwatch.model.doctor import CheckpointFacts
from hangwatch.model.doctor import GpuFacts
from hangwatch.model.doctor import GpuInventory
from hangwatch.model.doctor import HostFacts
from hangwatch.model.doctor import PortFacts
from hangwatch.model.doctor import PyEnvFacts
from hangwatch.model.doctor import Status
from hangwatch.model.doctor import worst
from hangwatch.words import human_bytes
from hangwatch.words import plural

GiB = 2**30
SHM_PATH = "/dev/shm"  # noqa: S108 - the POSIX shared-memory mount, named in messages
MiB = 2**20
SHM_FAIL_FREE = 128 * MiB  # vLLM's broadcast queue alone maps ~100 MB; NCCL's SHM transport a few MB per peer
SHM_WARN = 1 * GiB
NOFILE_WANTED = 65536  # what vLLM and SGLang raise the soft limit to (up to the hard one)
MEMLOCK_WANTED = 64 * MiB
CACHE_FAIL = 1 * GiB
CACHE_WARN = 10 * GiB
FOREIGN_GPU_MEMORY_FAIL = 0.10  # vLLM's default --gpu-memory-utilization 0.9 leaves 10 %
WEDGED_UTIL_PCT = 90.0
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "fuse.", "9p", "ceph", "glusterfs")


def _gib(n: int | None) -> str:
    return human_bytes(n, "MiB", "GiB")


def check_shm(host: HostFacts) -> Check:
    """Shared memory too small (Docker's default is 64 MB): NCCL 'unhandled system error', vLLM bus errors."""
    name = "shm"
    fix = (
        "Give the container more: docker run --ipc=host (or --shm-size=16g); "
        "in Kubernetes mount an emptyDir with medium: Memory at /dev/shm."
    )
    if host.shm_total_bytes is None or host.shm_free_bytes is None:
        return Check(
            name,
            Status.FAIL,
            f"no usable {SHM_PATH}: NCCL's shared-memory transport and vLLM's queues need it",
            host.errors,
            fix,
        )
    evidence = (f"{SHM_PATH}: {_gib(host.shm_total_bytes)} total, {_gib(host.shm_free_bytes)} free",)
    if host.shm_free_bytes < SHM_FAIL_FREE:
        return Check(
            name,
            Status.FAIL,
            f"{SHM_PATH} has only {host.shm_free_bytes / MiB:.0f} MiB free: NCCL and the engine's "
            "shared-memory queues fail or die with SIGBUS",
            evidence,
            fix,
        )
    if host.shm_total_bytes < SHM_WARN or host.shm_free_bytes < SHM_WARN / 2:
        return Check(
            name,
            Status.WARN,
            f"{SHM_PATH} is small: enough for one small server, not for tensor parallelism",
            evidence,
            fix,
        )
    return Check(name, Status.PASS, f"{SHM_PATH} {_gib(host.shm_free_bytes)} free", evidence)


def check_open_files(host: HostFacts) -> Check:
    name = "open-files"
    soft, hard = host.nofile_soft, host.nofile_hard
    evidence = (f"ulimit -n: soft {soft or 'unlimited'}, hard {hard or 'unlimited'}",)
    if soft is None or soft >= NOFILE_WANTED or hard is None or hard >= NOFILE_WANTED:
        return Check(
            name,
            Status.PASS,
            "open-files limit is enough (engines raise the soft limit up to the hard one)",
            evidence,
        )
    return Check(
        name,
        Status.WARN,
        f"open-files hard limit {hard}: vLLM and SGLang want {NOFILE_WANTED}; many "
        "connections or workers end in 'Too many open files'",
        evidence,
        fix=f"Raise it: ulimit -Hn {NOFILE_WANTED} (as root), docker run --ulimit "
        f"nofile={NOFILE_WANTED}:{NOFILE_WANTED}.",
    )


def check_memlock(host: HostFacts, env: Mapping[str, str]) -> Check:
    """Only RDMA (InfiniBand/RoCE) needs locked memory; NCCL's IB transport then fails to register buffers."""
    name = "memlock"
    value = "unlimited" if host.memlock_unlimited else _gib(host.memlock_soft)
    evidence = (f"ulimit -l: {value}", f"InfiniBand/RoCE devices: {', '.join(host.infiniband) or 'none'}")
    uses_ib = bool(host.infiniband) and env.get("NCCL_IB_DISABLE") != "1"
    if uses_ib and not host.memlock_unlimited and (host.memlock_soft or 0) < MEMLOCK_WANTED:
        return Check(
            name,
            Status.WARN,
            f"locked-memory limit {value} with RDMA devices present: NCCL's IB transport "
            "cannot register its buffers",
            evidence,
            fix="ulimit -l unlimited; docker run --ulimit memlock=-1; or NCCL_IB_DISABLE=1 on a single host.",
        )
    return Check(
        name,
        Status.PASS,
        f"locked memory {value}" + ("" if uses_ib else " (no RDMA transport in use: not needed)"),
        evidence,
    )


def check_memory(
    host: HostFacts, checkpoint: CheckpointFacts | None, gpus: Sequence[GpuFacts], cpu_only: bool
) -> Check:
    """Weights bigger than free RAM load at disk speed through a thrashing page cache (F3: a 'hang')."""
    name = "memory"
    available = host.mem_available_bytes
    if host.cgroup_limit_bytes is not None and (available is None or host.cgroup_limit_bytes < available):
        available = host.cgroup_limit_bytes
    evidence = [f"RAM available {_gib(host.mem_available_bytes)} of {_gib(host.mem_total_bytes)}"]
    if host.cgroup_limit_bytes is not None:
        evidence.append(f"cgroup memory limit {_gib(host.cgroup_limit_bytes)}")
    if checkpoint is None:
        return Check(
            name,
            Status.PASS,
            f"{_gib(available)} of RAM available (give --model DIR to compare the checkpoint)",
            tuple(evidence),
        )
    if checkpoint.error or checkpoint.total_bytes is None:
        return Check(name, Status.WARN, f"cannot size the checkpoint: {checkpoint.error}", tuple(evidence))
    size = checkpoint.total_bytes
    evidence.append(f"checkpoint {checkpoint.path}: {_gib(size)} ({checkpoint.source})")
    gpu_total = sum(g.mem_total_bytes or 0 for g in gpus)
    if gpus and all(g.mem_total_bytes for g in gpus) and not cpu_only:
        evidence.append(f"memory of the {plural(len(gpus), 'GPU')} checked: {_gib(gpu_total)}")
        if size > gpu_total:
            return Check(
                name,
                Status.FAIL,
                f"the weights alone ({_gib(size)}) exceed the GPUs' memory ({_gib(gpu_total)})",
                tuple(evidence),
                fix="Use more GPUs (tensor parallelism), a quantised checkpoint, or a smaller model.",
            )
    if available is not None and size > available:
        status = Status.FAIL if cpu_only else Status.WARN
        why = (
            "a CPU engine keeps the weights in RAM"
            if cpu_only
            else "loading reads it through a page cache that cannot hold it: weights load at disk speed "
            "and look stuck"
        )
        return Check(
            name,
            status,
            f"checkpoint {_gib(size)} is larger than the RAM available ({_gib(available)}): {why}",
            tuple(evidence),
            fix="Free memory (stop other jobs), or load from fast local disk and expect a long weights "
            "phase.",
        )
    return Check(
        name,
        Status.PASS,
        f"checkpoint {_gib(size)} fits in the RAM available ({_gib(available)})",
        tuple(evidence),
    )


def check_cache_disk(host: HostFacts) -> Check:
    """Compile/JIT caches on a full disk fail; on a network filesystem their file locks deadlock (F4)."""
    name = "cache-disk"
    status = Status.PASS
    evidence, problems = [], []
    for d in host.cache_dirs:
        evidence.append(
            f"{d.purpose}: {d.path}: {_gib(d.free_bytes)} free" + (f" ({d.fs_type})" if d.fs_type else "")
        )
        if d.free_bytes is not None and d.free_bytes < CACHE_FAIL:
            status = Status.FAIL
            problems.append(f"{d.purpose} has {_gib(d.free_bytes)} free")
        elif d.free_bytes is not None and d.free_bytes < CACHE_WARN:
            status = worst([status, Status.WARN])
            problems.append(f"{d.purpose} has {_gib(d.free_bytes)} free")
        if d.fs_type and d.fs_type.startswith(NETWORK_FS) and "Hugging Face" not in d.purpose:
            status = worst([status, Status.WARN])
            problems.append(
                f"{d.purpose} is on {d.fs_type}: JIT caches lock files there, and file locks on network "
                "filesystems deadlock (flashinfer PR #993, vllm #18851)"
            )
    if status is Status.PASS:
        return Check(name, status, "cache folders have room and are on local disk", tuple(evidence))
    return Check(
        name,
        status,
        "; ".join(problems),
        tuple(evidence),
        fix="Free space, or point the caches at a local disk with room: "
        + ", ".join(
            ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", *(c.env_var for c in registry.cache_folders()))
        )
        + ", FLASHINFER_WORKSPACE_BASE, HF_HOME.",
    )


def check_port(port: PortFacts | None) -> Check | None:
    if port is None:
        return None
    name = "port"
    if port.free:
        return Check(name, Status.PASS, f"port {port.port} is free")
    holders = tuple(f"pid {pid}: {title}" for pid, title in port.holders)
    if port.error:
        return Check(name, Status.FAIL, port.error, holders, fix="Choose a port above 1024, or run as root.")
    who = f" by {holders[0]}" if holders else " (by a process hangwatch may not look into)"
    return Check(
        name,
        Status.FAIL,
        f"port {port.port} is already taken{who}: the server will exit with "
        "'Address already in use', or its health probe will reach the old server",
        holders,
        fix=f"If it is a stale server of yours: hangwatch cleanup --port {port.port}; else choose another "
        "--port.",
    )


def check_versions(inventory: GpuInventory, env: PyEnvFacts | None, planning: bool) -> Check:
    """torch built for a newer CUDA than the driver supports: 'CUDA driver version is insufficient'."""
    name = "versions"
    evidence = []
    if inventory.driver_version:
        cuda = inventory.cuda_driver_version
        evidence.append(
            f"NVIDIA driver {inventory.driver_version} (supports CUDA up to {cuda[0]}.{cuda[1]})"
            if cuda
            else f"NVIDIA driver {inventory.driver_version}"
        )
    if env is not None and env.torch_version:
        evidence.append(
            f"torch {env.torch_version}, CUDA runtime {env.torch_cuda or 'none (CPU build)'}"
            + (f", NCCL {env.nccl_version}" if env.nccl_version else "")
        )
    nccl_pkg = env.version_of("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11") if env else None
    if nccl_pkg:
        evidence.append(f"nvidia-nccl wheel {nccl_pkg} (what vLLM's pynccl loads)")
    if env is None or not env.torch_cuda:
        return Check(name, Status.PASS, "no CUDA build of torch to compare with the driver", tuple(evidence))
    if inventory.cuda_driver_version is None:
        if planning:
            return Check(
                name,
                Status.PASS,
                "driver not checked (planning with --capability, no GPU here)",
                tuple(evidence),
            )
        return Check(
            name,
            Status.WARN,
            f"cannot read the driver version ({inventory.unavailable or 'NVML'}); torch needs "
            f"a driver for CUDA {env.torch_cuda}",
            tuple(evidence),
        )
    try:
        runtime = tuple(int(x) for x in env.torch_cuda.split(".")[:2])
    except ValueError:
        return Check(name, Status.WARN, f"unreadable torch CUDA version {env.torch_cuda!r}", tuple(evidence))
    driver = inventory.cuda_driver_version
    if runtime[0] > driver[0]:
        return Check(
            name,
            Status.FAIL,
            f"torch needs CUDA {env.torch_cuda}; the driver supports only {driver[0]}.{driver[1]}: "
            "'CUDA driver version is insufficient for CUDA runtime version'",
            tuple(evidence),
            fix=f"Upgrade the NVIDIA driver to one for CUDA {runtime[0]}.x, or install the torch wheel for "
            f"CUDA {driver[0]}.x.",
        )
    if runtime > driver:
        return Check(
            name,
            Status.WARN,
            f"torch's CUDA {env.torch_cuda} is newer than the driver's {driver[0]}.{driver[1]}: it "
            "runs by minor-version compatibility, but PTX JIT and newer features fail",
            tuple(evidence),
            fix="Upgrade the driver, or use a torch wheel for the driver's CUDA version.",
        )
    return Check(
        name,
        Status.PASS,
        f"driver (CUDA {driver[0]}.{driver[1]}) is new enough for torch's CUDA {env.torch_cuda}",
        tuple(evidence),
    )


def _foreign(
    inventory: GpuInventory, gpus: Sequence[GpuFacts], ours: set[int]
) -> dict[int, list[tuple[int, int | None]]]:
    indices = {g.index for g in gpus}
    found: dict[int, list[tuple[int, int | None]]] = {}
    for p in inventory.processes:
        if p.gpu_index in indices and p.pid not in ours:
            found.setdefault(p.gpu_index, []).append((p.pid, p.used_bytes))
    return found


def check_gpu_processes(
    inventory: GpuInventory, host: HostFacts, gpus: Sequence[GpuFacts], ours: set[int]
) -> Check:
    """GPU memory already held by someone else: the engine's memory profiling fails or OOMs (F7 orphans)."""
    name = "gpu-processes"
    real = [g for g in gpus if not g.synthetic]
    if not real:
        return Check(
            name, Status.PASS, f"no GPU to look at ({inventory.unavailable or 'planning with --capability'})"
        )
    foreign = _foreign(inventory, real, ours)
    nvml_pids = {p.pid for p in inventory.processes}
    cuda_holders = [h for h in host.device_holders if "/dev/nvidia-uvm" in h.devices and h.pid not in ours]
    unattributed = [h for h in cuda_holders if h.pid not in nvml_pids]
    evidence = []
    status = Status.PASS
    for g in real:
        for pid, used in foreign.get(g.index, []):
            evidence.append(f"GPU {g.index}: pid {pid} holds {_gib(used)}")
            if used and g.mem_total_bytes and used > FOREIGN_GPU_MEMORY_FAIL * g.mem_total_bytes:
                status = Status.FAIL
            elif status is Status.PASS:
                status = Status.WARN
    for h in unattributed:
        evidence.append(
            f"pid {h.pid} {h.title} has CUDA open ({', '.join(h.devices)}) but NVML lists no memory for it"
        )
        if status is Status.PASS:
            status = Status.WARN
    others = [h for h in host.device_holders if h not in cuda_holders and h.pid not in ours]
    evidence += [f"pid {h.pid} {h.title} holds {', '.join(h.devices)} (no CUDA context)" for h in others[:5]]
    if host.device_scan_denied:
        evidence.append(
            f"{plural(host.device_scan_denied, 'process')} could not be looked into "
            "(not ours; run as root to see all)"
        )
    if status is Status.PASS:
        return Check(
            name, status, f"no other process uses the {plural(len(real), 'GPU')} checked", tuple(evidence)
        )
    summary = (
        "other processes hold GPU memory: the engine's memory profiling will fail or it will run out of "
        "memory"
        if status is Status.FAIL
        else "other processes use the GPUs"
    )
    return Check(
        name,
        status,
        summary,
        tuple(evidence),
        fix="If they are leftovers of an earlier server: hangwatch cleanup --pid PID (it stops only that "
        "tree). "
        "Otherwise pick free GPUs with CUDA_VISIBLE_DEVICES.",
    )


def check_gpu_wedged(inventory: GpuInventory, host: HostFacts, gpus: Sequence[GpuFacts]) -> Check:
    """A GPU busy with no process: a kernel still spinning after its process died (F1, rtx6kpro#15)."""
    name = "gpu-wedged"
    real = [g for g in gpus if not g.synthetic]
    if not real:
        return Check(name, Status.PASS, "no GPU to look at")
    on_gpu = {p.gpu_index for p in inventory.processes}
    cuda_visible = any("/dev/nvidia-uvm" in h.devices for h in host.device_holders)
    wedged = [
        g for g in real if (g.util_pct or 0) >= WEDGED_UTIL_PCT and g.index not in on_gpu and not cuda_visible
    ]
    if wedged:
        return Check(
            name,
            Status.FAIL,
            "GPU busy with no process: a kernel is still spinning (wedged); the next server "
            "will hang in its first collective",
            (
                *(
                    f"GPU {g.index} ({g.name}): {g.util_pct:.0f} % busy, {_gib(g.mem_used_bytes)} used, "
                    "no process"
                    for g in wedged
                ),
                "a process of another container (PID namespace) would look the same",
            ),
            fix="Reset it: nvidia-smi -r -i INDEX (no process may use it), or reboot the host. hangwatch "
            "never resets GPUs.",
        )
    return Check(
        name,
        Status.PASS,
        "no GPU is busy without a process",
        tuple(
            f"GPU {g.index} ({g.name}): {g.util_pct if g.util_pct is not None else '?'} % busy" for g in real
        ),
    )
