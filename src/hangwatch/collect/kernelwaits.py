"""Read where each thread of a process waits in the kernel, and what could wake it (model/kernelwaits.py).

From /proc/PID/task/TID/syscall (the blocked system call and its six arguments), /proc/PID/fd (what
each fd is) and /proc/PID/fdinfo (a pipe end's access mode, an epoll instance's watched fds). Read just
before the py-spy dump, while the threads sit in their waits (a dump interrupts them briefly).

What the arguments say, per call:
- ``read``/``readv``/``recvfrom``/``recvmsg``/``accept``: waits on one fd, with no timeout of its own;
- ``wait4``/``waitid``: a child's exit (its first argument: a pid, or -1 for any child);
- ``futex``: a timeout pointer of 0 waits until woken; a private futex (FUTEX_PRIVATE_FLAG) is woken
  only by a thread of the same process (a Python lock, an Event), a shared one by anyone mapping it;
- ``epoll_wait``/``epoll_pwait``: a timeout of -1 waits until one of the watched fds (fdinfo) is ready;
- ``flock``/``fcntl(F_SETLKW)``: a file lock, ended by whoever holds it (/proc/locks names the holders;
  the file is the fd's, ``MAJ:MIN:INODE``); with ``LOCK_NB`` it never blocks;
- ``poll``/``select`` and friends: their fds are in the target's memory, unread here: anyone may wake
  them; with a finite timeout they end by themselves, as every sleep does.
Anything else blocked in the kernel is taken as able to end by itself or be ended from outside.
"""

from __future__ import annotations

import platform
from dataclasses import replace
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.kernelwaits import ThreadWait
from hangwatch.model.kernelwaits import Waker

# System call numbers by machine (the kernel's unistd tables), for the calls whose arguments we read.
_SYSCALLS = {
    "x86_64": {
        0: "read", 19: "readv", 45: "recvfrom", 47: "recvmsg", 43: "accept", 288: "accept4",
        61: "wait4", 247: "waitid", 202: "futex", 232: "epoll_wait", 281: "epoll_pwait",
        441: "epoll_pwait2", 7: "poll", 271: "ppoll", 23: "select", 270: "pselect6",
        35: "nanosleep", 230: "clock_nanosleep", 34: "pause", 73: "flock", 72: "fcntl",
    },
    "aarch64": {
        63: "read", 65: "readv", 207: "recvfrom", 212: "recvmsg", 202: "accept", 242: "accept4",
        260: "wait4", 95: "waitid", 98: "futex", 22: "epoll_pwait", 441: "epoll_pwait2",
        73: "ppoll", 72: "pselect6", 101: "nanosleep", 115: "clock_nanosleep", 32: "flock", 25: "fcntl",
    },
}  # fmt: skip
_ON_FD = frozenset({"read", "readv", "recvfrom", "recvmsg", "accept", "accept4"})
_FUTEX_CMD = 0x7F  # op & this: FUTEX_WAIT 0, FUTEX_WAIT_BITSET 9, FUTEX_WAIT_REQUEUE_PI 11, FUTEX_LOCK_PI 6
_FUTEX_WAITS = frozenset({0, 6, 9, 11, 13})
_FUTEX_PRIVATE = 0x80
_O_ACCMODE = 0o3
_O_RDONLY = 0
_MINUS_ONE = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)  # an int argument of -1 as /proc prints it
_LOCK_NB = 4  # flock(fd, LOCK_EX | LOCK_NB) never blocks
_F_SETLKW = frozenset({7, 38})  # fcntl(fd, F_SETLKW | F_OFD_SETLKW, ...): wait for a record lock


def syscall_names(machine: str | None = None) -> dict[int, str]:
    return _SYSCALLS.get(machine or platform.machine(), {})


def read_waits(pid: int, root: Path = procfs.PROC, machine: str | None = None) -> ProcessWaits | None:
    """Every thread's wait and the pipes and Unix sockets the process holds; None when it is gone or
    its waits cannot be read (no ptrace access, a machine whose system call numbers we do not know)."""
    names = syscall_names(machine)
    if not names:
        return None
    links = procfs.fd_links(pid, root)
    threads = []
    for tid in procfs.thread_ids(pid, root):
        call = procfs.read_syscall(pid, tid, root)
        if isinstance(call, procfs.Denied):
            return None
        wait = _thread_wait(pid, tid, call, names, links, root=root)
        threads.append(replace(wait, wakeups=procfs.read_wakeups(pid, tid, root)))
    if not threads:
        return None
    writes = tuple(
        sorted({t for fd, t in links.items() if t.startswith("pipe:") and _writable(pid, fd, root)})
    )
    sockets = tuple(sorted(procfs.sockets_among(links.values())))
    return ProcessWaits(pid, tuple(threads), writes, sockets, _open_files(pid, links, root))


# Where a process's open files can hold a lock someone else takes: not devices, /proc or /sys. Bounded,
# since each costs a stat: a process keeps few regular files open (its log, a lock, a cache index).
_NOT_FILES = ("/dev/", "/proc/", "/sys/")
MAX_FILES = 64


def _open_files(pid: int, links: dict[int, str], root: Path) -> tuple[str, ...]:
    out = []
    for fd, target in sorted(links.items()):
        if not target.startswith("/") or target.startswith(_NOT_FILES) or target.endswith(" (deleted)"):
            continue
        key = procfs.file_key(pid, fd, root)
        if key is not None:
            out.append(f"{key} {target}")
        if len(out) >= MAX_FILES:
            break
    return tuple(sorted(set(out)))


def _thread_wait(
    pid: int,
    tid: int,
    call: tuple[int, tuple[int, ...]] | None,
    names: dict[int, str],
    links: dict[int, str],
    *,
    root: Path,
) -> ThreadWait:
    if call is None:
        return ThreadWait(tid, "running", Waker.RUNNING)
    nr, args = call
    name = names.get(nr, f"syscall {nr}")
    arg = [*args, 0, 0, 0, 0, 0, 0]
    if name in _ON_FD:
        return _on_fds(tid, name, (arg[0],), links)
    if name in ("wait4", "waitid"):
        child = arg[0] if name == "wait4" else (arg[1] if arg[0] == 1 else -1)  # waitid(P_PID=1, pid, ...)
        return ThreadWait(tid, name, Waker.CHILDREN, child=-1 if child in _MINUS_ONE else int(child))
    if name == "futex":
        op = arg[1]
        if op & _FUTEX_CMD not in _FUTEX_WAITS or arg[3] != 0:
            return ThreadWait(tid, name, Waker.TIMEOUT)
        return ThreadWait(tid, name, Waker.ITSELF if op & _FUTEX_PRIVATE else Waker.ANYONE)
    if name in ("epoll_wait", "epoll_pwait", "epoll_pwait2"):
        untimed = arg[3] in _MINUS_ONE if name != "epoll_pwait2" else arg[3] == 0
        if not untimed:
            return ThreadWait(tid, name, Waker.TIMEOUT)
        info = procfs.read_fdinfo(pid, arg[0], root)
        watched = info[1] if info is not None else ()
        if not watched:
            return ThreadWait(tid, name, Waker.ANYONE)
        return _on_fds(tid, name, watched, links)
    if name in ("flock", "fcntl"):
        blocking = not arg[1] & _LOCK_NB if name == "flock" else arg[1] in _F_SETLKW
        key = procfs.file_key(pid, arg[0], root) if blocking else None
        if key is None:
            return ThreadWait(tid, name, Waker.TIMEOUT if not blocking else Waker.ANYONE)
        # Ended by the lock's holders; the file's path is for the words.
        return ThreadWait(tid, name, Waker.OBJECTS, (f"lock:{key} {links.get(arg[0], '?')}",))
    if name in ("poll", "ppoll", "select", "pselect6"):
        timeout = {"poll": arg[2], "ppoll": arg[2], "select": arg[4], "pselect6": arg[4]}[name]
        untimed = timeout in _MINUS_ONE if name == "poll" else timeout == 0
        return ThreadWait(tid, name, Waker.ANYONE if untimed else Waker.TIMEOUT)
    return ThreadWait(tid, name, Waker.TIMEOUT)


def _on_fds(tid: int, call: str, fds: tuple[int, ...], links: dict[int, str]) -> ThreadWait:
    """A wait on fds: ended by whoever holds their other ends, if every one is a pipe or a Unix
    socket (connected sockets are resolved against sock_diag's peers by the analysis)."""
    objects = tuple(links.get(fd, "") for fd in fds)
    if not objects or not all(o.startswith(("pipe:[", "socket:[")) for o in objects):
        return ThreadWait(tid, call, Waker.ANYONE, objects)
    return ThreadWait(tid, call, Waker.OBJECTS, objects)


def _writable(pid: int, fd: int, root: Path) -> bool:
    info = procfs.read_fdinfo(pid, fd, root)
    return info is not None and info[0] is not None and info[0] & _O_ACCMODE != _O_RDONLY
