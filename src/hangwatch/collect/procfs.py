"""The /proc boundary: every read of /proc goes through here.

Errors are translated at this edge (as psutil's ``wrap_exceptions`` does): a process that is gone
gives ``None``; a file we may not read gives ``Denied`` with the reason. ``root`` is injectable so
parsers can be tested against captured /proc text.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hangwatch.model.samples import ProcessId
from hangwatch.model.samples import ProcState

PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PF_KTHREAD = 0x00200000  # include/linux/sched.h: "I am a kernel thread"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_TCP_LISTEN = "0A"


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/PID/stat that hangwatch uses (see proc(5))."""

    pid: int
    comm: str
    state: ProcState
    ppid: int
    pgrp: int
    session: int
    utime_ticks: int
    stime_ticks: int
    num_threads: int
    starttime_ticks: int  # with pid, identifies a process across pid reuse
    rss_pages: int
    exit_code: int | None  # field 52: the waitpid status, meaningful once the process is a zombie
    # Minor and major page faults of every thread so far (fields 10 and 12): a thread that touches fresh
    # memory (allocating, building tables, copying buffers) faults; a spin re-reading a flag does not.
    faults: int = 0
    # Field 9, the kernel's PF_* flags: PF_KTHREAD marks a kernel thread (kthreadd and its children),
    # which no command of ours may list, dump or signal.
    flags: int = 0

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)

    @property
    def cpu_s(self) -> float:
        return (self.utime_ticks + self.stime_ticks) / CLOCK_TICKS

    @property
    def identity(self) -> ProcessId:
        return ProcessId(self.pid, self.starttime_ticks)

    @property
    def exited(self) -> bool:
        """Every thread of it has ended: what is left is a zombie for its parent to reap.

        State Z alone is not that. It is the main thread's state, and the main thread ends first whenever
        it exits alone or its peers are slower to die (after SIGKILL the last thread unmaps the whole
        address space: 0.1 s for a process holding 40 GiB on an idle H200, docs/gpu-validation.md). Until
        they are gone, waitpid cannot reap it and it still holds its memory, files and ports; num_threads
        counts each thread until it is released (a trial's APIServer lay unreaped beside the next trial,
        2026-12-04).
        """
        return self.state in (ProcState.ZOMBIE, ProcState.DEAD) and self.num_threads <= 1


@dataclass(frozen=True)
class Denied:
    """A /proc file exists but may not be read by us; ``reason`` says which and why."""

    reason: str


def parse_stat(pid: int, text: str) -> Stat:
    # comm is in parentheses and may itself contain spaces and parentheses: split at the last ')'.
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    comm = text[open_paren + 1 : close_paren]
    f = text[close_paren + 2 :].split()
    exit_code = int(f[49]) if len(f) > 49 else None
    return Stat(
        pid=pid,
        comm=comm,
        state=ProcState(f[0]),
        ppid=int(f[1]),
        pgrp=int(f[2]),
        session=int(f[3]),
        utime_ticks=int(f[11]),
        stime_ticks=int(f[12]),
        num_threads=int(f[17]),
        starttime_ticks=int(f[19]),
        rss_pages=int(f[21]),
        exit_code=exit_code,
        faults=int(f[7]) + int(f[9]),
        flags=int(f[6]),
    )


def _read(path: str) -> bytes:
    # Plain os calls, not pathlib: these reads run for every process on every tick.
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def read_stat(pid: int, root: Path = PROC) -> Stat | None:
    try:
        text = _read(f"{root}/{pid}/stat").decode("utf-8", "replace")
    except OSError:
        return None
    try:
        return parse_stat(pid, text)
    except (ValueError, IndexError):
        return None


def list_pids(root: Path = PROC) -> list[int]:
    return [int(name) for name in os.listdir(root) if name.isdigit()]


def read_children(pid: int, root: Path = PROC) -> list[int]:
    """Children created by the main thread (/proc/PID/task/PID/children); others come with a full scan."""
    try:
        return [int(x) for x in _read(f"{root}/{pid}/task/{pid}/children").split()]
    except (OSError, ValueError):
        return []


def read_cmdline(pid: int, root: Path = PROC) -> tuple[str, ...] | None:
    try:
        raw = _read(f"{root}/{pid}/cmdline")
    except OSError:
        return None
    return tuple(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)


def read_comm(pid: int, root: Path = PROC) -> str | None:
    try:
        return (root / str(pid) / "comm").read_text().rstrip("\n")
    except OSError:
        return None


def process_title(cmdline: tuple[str, ...], comm: str) -> str:
    """The name a person knows the process by.

    Engines rename their processes with setproctitle (``VLLM::Worker_TP1``,
    ``sglang::scheduler_TP0``); that overwrites argv, so the title is the first (often only)
    element of cmdline. Otherwise comm is the best short name.
    """
    if cmdline:
        first = cmdline[0].strip()
        if "::" in first:
            return first.split()[0] if " " in first and "::" in first.split()[0] else first
    return comm


def parse_io(text: str) -> tuple[int, int]:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            values[key.strip()] = int(value)
    return values["rchar"], values["wchar"]


def read_io(pid: int, root: Path = PROC) -> tuple[int, int] | Denied | None:
    """(rchar, wchar): every byte read or written, page cache and pipes included."""
    try:
        text = _read(f"{root}/{pid}/io").decode()
    except PermissionError:
        return Denied(f"/proc/{pid}/io is not readable by uid {os.geteuid()} (ptrace access mode)")
    except OSError:
        return None
    try:
        return parse_io(text)
    except KeyError:
        return None


def read_environ(pid: int, keys: frozenset[str], root: Path = PROC) -> dict[str, str]:
    """Only the named variables of a process's environment (never the whole of it: it holds secrets)."""
    try:
        raw = (root / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name.decode("utf-8", "replace") in keys:
            found[name.decode()] = value.decode("utf-8", "replace")
    return found


def parse_listening(text: str) -> dict[int, int]:
    """socket inode -> local port, for TCP sockets in LISTEN state (/proc/net/tcp{,6})."""
    inodes: dict[int, int] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _TCP_LISTEN:
            continue
        port = int(fields[1].rsplit(":", 1)[1], 16)
        inodes[int(fields[9])] = port
    return inodes


def read_listening(root: Path = PROC) -> dict[int, int]:
    found: dict[int, int] = {}
    for name in ("tcp", "tcp6"):
        try:
            found.update(parse_listening((root / "net" / name).read_text()))
        except OSError:
            continue
    return found


def socket_inodes(pid: int, root: Path = PROC) -> set[int]:
    """Inodes of the sockets a process holds open (needs the same permission as /proc/PID/io)."""
    return sockets_among(fd_links(pid, root).values())


def sockets_among(targets: Iterable[str]) -> set[int]:
    """The socket inodes among fd targets (``socket:[123]``)."""
    return {int(t[8:-1]) for t in targets if t.startswith("socket:[") and t[8:-1].isdigit()}


def fd_target(pid: int, fd: int, root: Path = PROC) -> str | None:
    try:
        return os.readlink(root / str(pid) / "fd" / str(fd))
    except OSError:
        return None


def thread_ids(pid: int, root: Path = PROC) -> list[int]:
    """The process's threads (tids), main thread included; empty when it is gone."""
    try:
        return sorted(int(name) for name in os.listdir(f"{root}/{pid}/task") if name.isdigit())
    except OSError:
        return []


def parse_syscall(text: str) -> tuple[int, tuple[int, ...]] | None:
    """/proc/PID/task/TID/syscall: (number, six arguments) of the system call the thread is blocked
    in; None when it runs (``running``) or is blocked outside a system call (``-1 ...``)."""
    fields = text.split()
    if not fields or not fields[0].lstrip("-").isdigit() or int(fields[0]) < 0:
        return None
    try:
        return int(fields[0]), tuple(int(a, 16) for a in fields[1:7])
    except ValueError:
        return None


def read_syscall(pid: int, tid: int, root: Path = PROC) -> tuple[int, tuple[int, ...]] | Denied | None:
    """Where a thread waits in the kernel (needs ptrace access to the process, as py-spy does)."""
    try:
        return parse_syscall(_read(f"{root}/{pid}/task/{tid}/syscall").decode())
    except PermissionError:
        return Denied(f"/proc/{pid}/task/{tid}/syscall is not readable by uid {os.geteuid()}")
    except OSError:
        return None


def read_wakeups(pid: int, tid: int, root: Path = PROC) -> int | None:
    """How many times the thread was put on a CPU so far (/proc/PID/task/TID/schedstat, its third
    field): a thread parked in one wait keeps its count, one that sleeps and looks again adds one a try."""
    try:
        fields = _read(f"{root}/{pid}/task/{tid}/schedstat").split()
        return int(fields[2])
    except (OSError, ValueError, IndexError):
        return None


def fd_links(pid: int, root: Path = PROC) -> dict[int, str]:
    """fd -> what it points to (``pipe:[12]``, ``socket:[34]``, ``anon_inode:[eventpoll]``, a path)."""
    fd_dir = f"{root}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return {}
    links = {}
    for name in names:
        try:
            links[int(name)] = os.readlink(f"{fd_dir}/{name}")
        except (OSError, ValueError):
            continue
    return links


def parse_fdinfo(text: str) -> tuple[int | None, tuple[int, ...]]:
    """/proc/PID/fdinfo/FD: (its open flags, the fds an epoll instance watches: its ``tfd:`` lines)."""
    flags = None
    watched = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "flags" and value.strip():
            flags = int(value.strip(), 8)
        elif key == "tfd":
            first = value.split()
            if first and first[0].isdigit():
                watched.append(int(first[0]))
    return flags, tuple(watched)


def file_key(pid: int, fd: int, root: Path = PROC) -> str | None:
    """The file an fd is open on, as /proc/locks names it (``MAJ:MIN:INODE``, device numbers in hex)."""
    try:
        st = Path(f"{root}/{pid}/fd/{fd}").stat()  # follows the link: the file itself
    except OSError:
        return None
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


def parse_locks(text: str) -> tuple[tuple[str, int], ...]:
    """/proc/locks' granted locks: (``MAJ:MIN:INODE``, holder pid). Blocked requests (``->``) are left out:
    who waits is read from each waiter's own system call."""
    held: list[tuple[str, int]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or "->" in fields[1:2]:
            continue
        try:
            held.append((fields[5], int(fields[4])))
        except ValueError:
            continue
    return tuple(held)


def started_wall(pid: int, root: Path = PROC) -> float | None:
    """When a process started, in wall-clock seconds (boot time + its start in clock ticks)."""
    stat = read_stat(pid, root)
    if stat is None:
        return None
    try:
        for line in _read(f"{root}/stat").decode().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) + stat.starttime_ticks / CLOCK_TICKS
    except (OSError, ValueError):
        return None
    return None


def read_locks(root: Path = PROC) -> tuple[tuple[str, int], ...]:
    try:
        return parse_locks(_read(f"{root}/locks").decode(errors="replace"))
    except OSError:
        return ()


def read_fdinfo(pid: int, fd: int, root: Path = PROC) -> tuple[int | None, tuple[int, ...]] | None:
    try:
        return parse_fdinfo(_read(f"{root}/{pid}/fdinfo/{fd}").decode())
    except OSError:
        return None


def read_cgroup_path(pid: int, root: Path = PROC) -> str | None:
    """The cgroup v2 path of a process (the ``0::/path`` line)."""
    try:
        for line in (root / str(pid) / "cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        return None
    return None


def read_wchan(pid: int, root: Path = PROC) -> str | None:
    try:
        return (root / str(pid) / "wchan").read_text().strip() or None
    except OSError:
        return None


def fd_targets(pid: int, root: Path = PROC) -> list[str] | Denied | None:
    """Where every open fd of a process points (``/dev/nvidia0``, ``socket:[123]``, ``/dev/shm/x``)."""
    fd_dir = root / str(pid) / "fd"
    try:
        links = list(fd_dir.iterdir())
    except PermissionError:
        return Denied(f"/proc/{pid}/fd is not readable by uid {os.geteuid()}")
    except OSError:
        return None
    targets = []
    for link in links:
        try:
            targets.append(str(link.readlink()))
        except OSError:
            continue
    return targets


def mapped_paths(pid: int, prefix: str, root: Path = PROC) -> set[str] | Denied | None:
    """The files under ``prefix`` that a process has mapped (/proc/PID/maps), " (deleted)" removed."""
    try:
        text = (root / str(pid) / "maps").read_text(errors="replace")
    except PermissionError:
        return Denied(f"/proc/{pid}/maps is not readable by uid {os.geteuid()}")
    except OSError:
        return None
    return parse_mapped_paths(text, prefix)


def maps_library(pid: int, name: str, root: Path = PROC) -> bool | None:
    """Whether a process has a library whose file name starts with ``name`` mapped (``libnccl``), or
    None when its maps cannot be read. A mapped library is one the process loaded, used or not yet."""
    try:
        text = (root / str(pid) / "maps").read_text(errors="replace")
    except OSError:
        return None
    return f"/{name}" in text


def read_exe(pid: int, root: Path = PROC) -> str | None:
    """The path of the process's executable (/proc/PID/exe), " (deleted)" removed."""
    try:
        return os.readlink(root / str(pid) / "exe").removesuffix(" (deleted)")
    except OSError:
        return None


def parse_maps(text: str) -> list[tuple[int, int, str, int, int, str]]:
    """/proc/PID/maps as (start, end, perms, file offset, inode, path) for file-backed mappings and the
    vDSO (``[vdso]``: code a thread runs, in memory only), by address."""
    out = []
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and (fields[5].startswith("/") or fields[5] == "[vdso]"):
            lo, _, hi = fields[0].partition("-")
            with contextlib.suppress(ValueError):
                out.append(
                    (int(lo, 16), int(hi, 16), fields[1], int(fields[2], 16), int(fields[4]), fields[5])
                )
    out.sort()
    return out


def read_maps(pid: int, root: Path = PROC) -> list[tuple[int, int, str, int, int, str]] | None:
    try:
        return parse_maps((root / str(pid) / "maps").read_text(errors="replace"))
    except OSError:
        return None


def parse_mapped_paths(text: str, prefix: str) -> set[str]:
    found = set()
    for line in text.splitlines():
        # address perms offset dev inode pathname: the path is the 6th field and may hold spaces.
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith(prefix):
            path = fields[5]
            found.add(path[: -len(" (deleted)")] if path.endswith(" (deleted)") else path)
    return found


def read_nspid(pid: int, root: Path = PROC) -> tuple[int, ...]:
    """The pid in each nested pid namespace, outermost first (``NSpid:`` of /proc/PID/status); () when
    unreadable. A last entry of 1 is the init of a pid namespace: a container's init seen from the host."""
    try:
        for line in (root / str(pid) / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        return ()
    return ()


def read_uid(pid: int, root: Path = PROC) -> int | None:
    """The real uid of a process (/proc/PID/status is readable for every process)."""
    try:
        for line in (root / str(pid) / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_meminfo(root: Path = PROC) -> dict[str, int]:
    """/proc/meminfo in bytes: {"MemTotal": ..., "MemAvailable": ...}."""
    values: dict[str, int] = {}
    try:
        text = (root / "meminfo").read_text()
    except OSError:
        return values
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return values


def read_mounts(root: Path = PROC) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount this process sees."""
    try:
        text = (root / "self" / "mounts").read_text()
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            mounts.append((fields[1].replace("\\040", " "), fields[2]))
    return mounts
