"""Launch the command in a session of its own, become its subreaper, and start the guardian.

The command is spawned with ``posix_spawn`` rather than ``subprocess.Popen`` on purpose: Popen
reaps finished children behind our back (``subprocess._cleanup``), and the exit status of the
command is the one thing a supervisor must not lose. We wait for it ourselves.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from hangwatch.errors import CommandNotFound
from hangwatch.errors import UsageError
from hangwatch.model.samples import ProcessId

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of the tree are reparented to us instead of init, so we keep seeing and reaping them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclass
class Launched:
    pid: int
    output_fd: int  # read end of the pipe that carries the tree's stdout and stderr
    guardian: subprocess.Popen[bytes]
    guardian_known: set[ProcessId] = field(default_factory=set)

    def tell_guardian(self, identities: set[ProcessId]) -> None:
        new = identities - self.guardian_known
        if not new or self.guardian.stdin is None:
            return
        try:
            self.guardian.stdin.write(b"".join(f"{pid} {start}\n".encode() for pid, start in sorted(new)))
            self.guardian.stdin.flush()
        except OSError:
            return
        self.guardian_known |= new

    def release_guardian(self, clean: bool = True) -> None:
        """The tree is cleaned up: tell the guardian to stand down, and wait for it.

        Not ``clean`` (processes of the tree remain, e.g. in D state in a driver): close the pipe without
        the word, so that the guardian goes on killing what is left for a while after we are gone.
        """
        if self.guardian.stdin is not None:
            try:
                if clean:
                    self.guardian.stdin.write(b"clean\n")
                self.guardian.stdin.close()
            except OSError:
                pass
        if not clean:
            return  # it works on alone, in a session of its own; init reaps it after we exit
        try:
            self.guardian.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.guardian.kill()
            self.guardian.wait()


def launch(argv: list[str], cwd: Path | None = None, extra_env: Mapping[str, str] | None = None) -> Launched:
    """Start ``argv`` in a session of its own, its output into a pipe we read; ``extra_env``: variables
    added to our environment for it (the Flight Recorder's), never replacing one the user set."""
    if not argv:
        raise UsageError(
            "no command to run", "Put the command after `--`: hangwatch run -- python -m vllm..."
        )
    read_fd, write_fd = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        pid = os.posix_spawnp(
            argv[0],
            argv,
            {**(extra_env or {}), **os.environ},
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, write_fd, 1),
                (os.POSIX_SPAWN_DUP2, write_fd, 2),
            ],
            setsid=True,  # its own session and process group: signals reach the whole tree, and only it
        )
    except FileNotFoundError:
        os.close(read_fd)
        raise CommandNotFound(f"command not found: {argv[0]}") from None
    except PermissionError:
        os.close(read_fd)
        raise CommandNotFound(
            f"command is not executable: {argv[0]}", "Check its permissions (chmod +x)."
        ) from None
    finally:
        os.close(write_fd)
        os.close(devnull)
    guardian = subprocess.Popen(
        [sys.executable, "-m", "hangwatch.supervise.guardian", str(pid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return Launched(pid=pid, output_fd=read_fd, guardian=guardian)


class Reaper:
    """waitpid(WNOHANG) for our children, remembering every status it collected.

    Clean-up reaps the tree too, after the last tick; the statuses it collects must still reach
    the report (a killed worker is ``-9``, not "vanished"). waitpid is per process, so one
    instance serves the whole process: ``reap`` below.
    """

    def __init__(self) -> None:
        self._statuses: dict[int, int] = {}

    def __call__(self, pids: Iterable[int]) -> dict[int, int]:
        """{pid: status} for those of ``pids`` that are our children and have ended."""
        statuses: dict[int, int] = {}
        for pid in pids:
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if got == pid:
                statuses[pid] = status
        self._statuses.update(statuses)
        return statuses

    def status_of(self, pid: int) -> int | None:
        return self._statuses.get(pid)


reap = Reaper()
