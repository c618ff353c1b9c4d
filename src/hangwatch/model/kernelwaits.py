"""Where each thread of a process waits in the kernel, and what could wake it: the raw facts of a wait-for
graph across processes, read from /proc at a stack capture (collect/kernelwaits.py).

A stack says where a thread's code stopped; the kernel says what it is waiting *for*: a read of pipe
12345, the exit of a child, a futex only its own threads can touch, a timeout. Who holds the other end
of that pipe or socket is who can wake it, whatever the frames are called (analyse/waitgraph.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Waker(StrEnum):
    """Who can end a thread's wait, as far as the kernel shows."""

    OBJECTS = "objects"  # whoever holds the other end of ``on`` (pipes, connected sockets, file locks)
    CHILDREN = "children"  # a child's exit (wait4): ``child`` is the pid, or -1 for any child
    ITSELF = "itself"  # another thread of the same process (a private futex: a lock, an Event)
    ANYONE = "anyone"  # someone the kernel does not name (a shared futex, a TCP peer, poll's fds)
    TIMEOUT = "timeout"  # it ends by itself (a sleep, a wait with a timeout)
    RUNNING = "running"  # not waiting at all (on CPU, or runnable)


# System calls that wait for input on file descriptors (a read, a receive, a poll of several): whoever
# is to send it, the thread in one waits for a message.
RECEIVE_CALLS = frozenset(
    {"read", "readv", "recvfrom", "recvmsg", "poll", "ppoll", "select", "pselect6"}
    | {"epoll_wait", "epoll_pwait", "epoll_pwait2"}
)


@dataclass(frozen=True)
class ThreadWait:
    """One thread's system call at the capture, and what can end it."""

    tid: int
    call: str  # the system call's name ("read", "wait4", "futex", "epoll_wait"), or "running"
    waker: Waker
    on: tuple[
        str, ...
    ] = ()  # for OBJECTS: what it waits on ("pipe:[123]", "socket:[45]", "lock:08:01:77 /path")
    child: int | None = None  # for CHILDREN: wait4's pid argument (-1: any child)
    # Times the thread was put on a CPU so far (schedstat): compared across captures, a thread in a timed
    # wait whose count rises wakes and looks again (a poll); one whose count stays is parked.
    wakeups: int | None = None


@dataclass(frozen=True)
class ProcessWaits:
    """Every thread's wait, and the objects the process holds that could wake a waiter elsewhere: pipes
    it may write (``writes``) and the Unix sockets it holds (``sockets``, by inode)."""

    pid: int
    threads: tuple[ThreadWait, ...]
    writes: tuple[str, ...] = ()  # sorted; tuples, not sets, so that reports and node bundles carry them
    sockets: tuple[int, ...] = ()
    # Regular files it holds open, as /proc/locks names them, with their paths ("08:01:77 /tmp/x.lock"):
    # a process polling for a file lock (a non-blocking try, then a sleep) shows no lock wait in the
    # kernel, only the file it keeps trying; whoever holds that file's lock is whom it waits for.
    files: tuple[str, ...] = ()
    # How many times hangwatch's own dumps had stopped this process's threads before this reading (None:
    # not counted, as in an older collector's bundle). Each stop puts every waiting thread on a CPU twice,
    # which a thread's wakeup count must not be mistaken for.
    our_stops: int | None = None

    def main(self) -> ThreadWait | None:
        """The main thread's wait (its tid is the pid). /proc/PID/task lists the thread group's leader
        first: searched for only if not (a pass over every thread of 10,000 ranks costs)."""
        threads = self.threads
        if threads and threads[0].tid == self.pid:
            return threads[0]
        return next((t for t in threads if t.tid == self.pid), None)

    def untimed(self) -> bool:
        """Every thread waits for someone else to act: none runs, none ends its wait by itself."""
        return bool(self.threads) and all(t.waker not in (Waker.RUNNING, Waker.TIMEOUT) for t in self.threads)

    def key(self) -> tuple[tuple[int, str, Waker, tuple[str, ...], int | None], ...]:
        """What stays the same while it waits in the same place (compared across captures)."""
        return tuple((t.tid, t.call, t.waker, t.on, t.child) for t in self.threads)
