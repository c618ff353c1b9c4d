"""Catch the exit status of processes we are not the parent of.

A grandchild's exit status lives in the exit-code field of /proc/PID/stat only while it is a
zombie, and its parent may reap it within microseconds. Sampling once a second misses most of
those, so a thread holds a pidfd per process and reads the status the moment the kernel says the
process ended (pidfds become readable on exit, before the parent reaps).
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.model.samples import ProcessId


class DeathWatcher:
    """Records, for watched processes as they exit, their waitpid status, the moment they ended (on the
    watch's clock, to order deaths and log lines finer than a tick), their name at the end (a title
    set just before dying is in the zombie's comm, when no tick saw it) and the bytes they had written
    by then (a zombie's /proc/PID/io still counts them: who wrote a traceback no line names)."""

    def __init__(self, root: Path = procfs.PROC, clock: Callable[[], float] | None = None) -> None:
        self._root = root
        self._clock = clock
        self._times: dict[ProcessId, float] = {}
        self._comms: dict[ProcessId, str] = {}
        self._wchars: dict[ProcessId, int] = {}
        self._lock = threading.Lock()
        self._fds: dict[int, ProcessId] = {}  # fd -> identity
        self._watched: set[ProcessId] = set()
        self._statuses: dict[ProcessId, int] = {}
        self._poller = select.poll()
        self._wake_r, self._wake_w = os.pipe()
        self._poller.register(self._wake_r, select.POLLIN)
        self._stop = False
        self.supported = hasattr(os, "pidfd_open")
        self._thread = threading.Thread(target=self._loop, name="hangwatch-deaths", daemon=True)
        if self.supported:
            self._thread.start()

    def watch(self, identity: ProcessId) -> None:
        if not self.supported or identity in self._watched:
            return
        try:
            fd = os.pidfd_open(identity.pid)
        except OSError:
            return
        with self._lock:
            self._watched.add(identity)
            self._fds[fd] = identity
            self._poller.register(fd, select.POLLIN)
        os.write(self._wake_w, b"w")

    def status_of(self, identity: ProcessId) -> int | None:
        with self._lock:
            return self._statuses.get(identity)

    def ended_at(self, identity: ProcessId, wait_s: float = 0.05) -> float | None:
        """When it ended; a sampler that saw the death first waits briefly for our thread to stamp it
        (the pidfd is ready at once, the thread may just not have had the interpreter yet)."""
        deadline = time.monotonic() + (wait_s if self.supported else 0.0)
        while True:
            with self._lock:
                ended = self._times.get(identity)
                watched = identity in self._fds.values()
            if ended is not None or not watched or time.monotonic() >= deadline:
                return ended
            time.sleep(0.005)

    def name_at_end(self, identity: ProcessId) -> str | None:
        with self._lock:
            return self._comms.get(identity)

    def written_at_end(self, identity: ProcessId) -> int | None:
        """Its wchar (every byte it wrote, to its log or pipe included) when it ended."""
        with self._lock:
            return self._wchars.get(identity)

    def close(self) -> None:
        self._stop = True
        if self.supported:
            os.write(self._wake_w, b"q")
            self._thread.join(timeout=2)
        with self._lock:
            for fd in list(self._fds):
                os.close(fd)
            self._fds.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _loop(self) -> None:
        while not self._stop:
            events = self._poller.poll()
            for fd, _ in events:
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                self._on_exit(fd)

    def _on_exit(self, fd: int) -> None:
        with self._lock:
            identity = self._fds.pop(fd, None)
            self._poller.unregister(fd)
        os.close(fd)
        if identity is None:
            return
        ended = round(self._clock(), 3) if self._clock is not None else None
        stat = procfs.read_stat(identity.pid, self._root)
        io = procfs.read_io(identity.pid, self._root)
        with self._lock:
            if ended is not None:
                self._times[identity] = ended
            if stat is None or stat.starttime_ticks != identity[1]:
                return
            self._comms[identity] = stat.comm
            if isinstance(io, tuple):
                self._wchars[identity] = io[1]
            if stat.exit_code is not None:
                self._statuses[identity] = stat.exit_code
