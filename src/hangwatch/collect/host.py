"""The host as a server will meet it: /dev/shm, limits, memory, cache disks, a port, GPU device holders.

Every reading is cheap (statvfs, getrlimit, one scan of /proc fds) so that ``hangwatch run``'s
preflight can afford all of it. A reading that fails is an entry of ``HostFacts.errors`` and
an absent field, never an exception.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import socket
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.model.doctor import CacheFolder
from hangwatch.model.doctor import CheckpointFacts
from hangwatch.model.doctor import DeviceHolder
from hangwatch.model.doctor import DirSpace
from hangwatch.model.doctor import HostFacts
from hangwatch.model.doctor import PortFacts
from hangwatch.words import plural

SHM = Path("/dev/shm")  # noqa: S108 - the POSIX shared-memory mount
SYS = Path("/sys")


def read_host(
    env: Mapping[str, str] | None = None,
    exclude_pids: Iterable[int] = (),
    *,
    engine_caches: Sequence[CacheFolder],
) -> HostFacts:
    """``engine_caches``: the engines' cache folders (the registry's cache_folders())."""
    env = os.environ if env is None else env
    errors: list[str] = []
    shm_total = shm_free = None
    try:
        st = os.statvfs(SHM)
        shm_total, shm_free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError as exc:
        errors.append(f"{SHM}: {exc.strerror}")
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    meminfo = procfs.read_meminfo()
    holders, denied = device_holders(set(exclude_pids) | {os.getpid()})
    return HostFacts(
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
        nofile_soft=_limit(nofile[0]),
        nofile_hard=_limit(nofile[1]),
        memlock_soft=_limit(memlock[0]),
        memlock_unlimited=memlock[0] == resource.RLIM_INFINITY,
        mem_available_bytes=meminfo.get("MemAvailable"),
        mem_total_bytes=meminfo.get("MemTotal"),
        cgroup_limit_bytes=cgroup_memory_limit(),
        infiniband=tuple(_listdir(SYS / "class" / "infiniband")),
        net_interfaces=tuple(_listdir(SYS / "class" / "net")),
        cache_dirs=tuple(cache_space(env, engine_caches)),
        device_holders=tuple(holders),
        device_scan_denied=denied,
        errors=tuple(errors),
    )


def _limit(value: int) -> int | None:
    return None if value == resource.RLIM_INFINITY else value


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(p.name for p in path.iterdir())
    except OSError:
        return []


def cgroup_memory_limit() -> int | None:
    """The cgroup v2 ``memory.max`` of this process (a container's real memory), if one is set."""
    cg = procfs.read_cgroup_path(os.getpid())
    if cg is None:
        return None
    path = SYS / "fs" / "cgroup" / cg.lstrip("/")
    # A limit set on a parent cgroup binds too: take the smallest on the way up.
    limits = []
    for folder in [path, *path.parents]:
        if not str(folder).startswith(str(SYS / "fs" / "cgroup")):
            break
        try:
            text = (folder / "memory.max").read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits) if limits else None


def cache_dirs(env: Mapping[str, str], engines: Sequence[CacheFolder]) -> list[tuple[str, Path]]:
    """The folders engines write compile and download caches to, as each tool resolves them;
    ``engines``: the engines' own (the registry's cache_folders())."""
    home = Path(env.get("HOME") or Path.home())
    xdg = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    hf_home = Path(env.get("HF_HOME") or xdg / "huggingface")
    user = env.get("USER") or env.get("LOGNAME") or str(os.getuid())
    return [
        ("Hugging Face cache", Path(env.get("HF_HUB_CACHE") or hf_home / "hub")),
        *((c.purpose, Path(env.get(c.env_var) or xdg / c.xdg_name)) for c in engines),
        (
            "torch.compile (Inductor) cache",
            Path(env.get("TORCHINDUCTOR_CACHE_DIR") or f"/tmp/torchinductor_{user}"),  # noqa: S108 - Inductor's default
        ),
        ("Triton cache", Path(env.get("TRITON_CACHE_DIR") or home / ".triton" / "cache")),
        (
            "FlashInfer JIT cache",
            Path(env.get("FLASHINFER_WORKSPACE_BASE") or home) / ".cache" / "flashinfer",
        ),
        ("CUDA JIT cache", Path(env.get("CUDA_CACHE_PATH") or home / ".nv" / "ComputeCache")),
    ]


def cache_space(env: Mapping[str, str], engines: Sequence[CacheFolder]) -> list[DirSpace]:
    mounts = sorted(procfs.read_mounts(), key=lambda m: len(m[0]), reverse=True)
    out = []
    for purpose, path in cache_dirs(env, engines):
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        try:
            st = os.statvfs(existing)
            free: int | None = st.f_bavail * st.f_frsize
        except OSError:
            free = None
        fs_type = next(
            (
                t
                for mnt, t in mounts
                if str(existing) == mnt or str(existing).startswith(mnt.rstrip("/") + "/")
            ),
            None,
        )
        out.append(DirSpace(purpose, str(path), free, fs_type))
    return out


def device_holders(exclude: set[int]) -> tuple[list[DeviceHolder], int]:
    """Processes with /dev/nvidia* open, and how many processes we were not allowed to look into."""
    holders = []
    denied = 0
    for pid in procfs.list_pids():
        if pid in exclude:
            continue
        targets = procfs.fd_targets(pid)
        if isinstance(targets, procfs.Denied):
            denied += 1
            continue
        devices = sorted({t for t in targets or () if t.startswith("/dev/nvidia")})
        if devices:
            holders.append(DeviceHolder(pid, process_label(pid), tuple(devices)))
    return holders, denied


def process_label(pid: int) -> str:
    """The title of a process with the start of its command line, for a person to recognise it."""
    cmdline = procfs.read_cmdline(pid) or ()
    comm = procfs.read_comm(pid) or "?"
    title = procfs.process_title(cmdline, comm)
    args = " ".join(cmdline[:4])
    return f"{title} ({args[:80]})" if args and args != title else title


def listeners(port: int) -> list[tuple[int, str]]:
    """(pid, title) of the processes holding a socket listening on ``port``."""
    inodes = {inode for inode, p in procfs.read_listening().items() if p == port}
    if not inodes:
        return []
    found = []
    for pid in procfs.list_pids():
        if procfs.socket_inodes(pid) & inodes:
            found.append((pid, process_label(pid)))
    return found


def check_port(port: int) -> PortFacts:
    """Can a server bind ``port`` now? A test bind (as servers do it, with SO_REUSEADDR), and who holds it."""
    holders = tuple(listeners(port))
    error = None
    free = not holders
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):  # noqa: S104 - a test bind, closed at once
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                free = False
            elif exc.errno == errno.EACCES:
                free = False
                error = f"port {port} needs privileges to bind (below 1024)"
            elif exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue  # no IPv6 here
            else:
                error = f"test bind failed: {exc.strerror}"
    return PortFacts(port, free, holders, error)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def checkpoint_size(model_dir: Path) -> CheckpointFacts:
    """Bytes of weights in a checkpoint folder: the safetensors index's total, else the files' sizes."""
    path = str(model_dir)
    if not model_dir.is_dir():
        return CheckpointFacts(path, None, "", error=f"{model_dir} is not a folder")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text())["metadata"]["total_size"]
            return CheckpointFacts(path, int(total), f"{index.name} metadata.total_size")
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged index: fall back to the files themselves
    for suffix in _WEIGHT_SUFFIXES:
        files = [f for f in model_dir.iterdir() if f.name.endswith(suffix) and f.is_file()]
        if files:
            return CheckpointFacts(
                path, sum(f.stat().st_size for f in files), f"sum of {plural(len(files), f'*{suffix} file')}"
            )
    return CheckpointFacts(
        path, None, "", error=f"no weight files (*.safetensors, *.bin, *.gguf) in {model_dir}"
    )
