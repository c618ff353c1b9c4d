"""Writing every file hangwatch writes (``--report-json``, ``--report-html``, ``--report-md``, run records,
isolate's state and reports): one function, :func:`write_atomically`, by the kind of node the path names.

* a regular file, or a path where nothing is: a temporary file beside it, renamed into place, so that a
  reader never sees half a report (the file's mode is kept); the temporary file never stays;
* a symbolic link: the same, onto what it points at (resolved), so the link stays a link;
* a FIFO, a character device (``/dev/null``, a terminal) or a descriptor (``/proc/self/fd/N``,
  ``/dev/stdout``): written straight, never created, truncated or renamed over, so that a device stays a
  device for every other program of the machine (a FIFO waits for its reader, as a shell's ``>`` does);
* anything else (a folder, a socket, a block device): refused, never replaced;
* ``-``: the real standard output (the command's own words then go to stderr: :func:`report_on_stdout`).

A write that fails is reported by :func:`write_outputs`, never raised: the verdict has been printed by
then, and a report that cannot be written must not cost it. :func:`output_path_problem` and
:func:`folder_problem` say before a command starts why a path cannot take what it will be given.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

STDOUT = Path("-")  # an output option's value that means "to standard output"


class _Stdout:
    """Where ``-`` is written: fd 1, unless report_on_stdout() moved fd 1 to stderr and kept the real
    stdout in another descriptor."""

    fd = 1


# A folder of descriptor links, once resolved (/proc/self/fd, /dev/fd, /proc/thread-self/fd all end here).
_FD_FOLDER = re.compile(r"/proc/\d+(?:/task/\d+)?/fd")


@contextlib.contextmanager
def report_on_stdout() -> Iterator[None]:
    """While inside: fd 1 is the process's stderr, and ``-`` is written to the real stdout.

    Done on the descriptors, not on ``sys.stdout``: streams bound at import time (the live view, Rich),
    and processes we start, write to fd 1 and must not end up inside the report.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    _Stdout.fd = saved
    try:
        yield
    finally:
        sys.stdout.flush()
        _Stdout.fd = 1
        os.dup2(saved, 1)
        os.close(saved)


def write_atomically(path: Path, text: str) -> None:
    """``text`` (UTF-8) into ``path`` by the rules of the module's docstring; OSError saying why not."""
    data = text.encode("utf-8")
    if path == STDOUT:
        _write_all(_Stdout.fd, data)
        return
    straight, target = _where(path)
    if straight:
        _write_straight(target, data, append=_is_descriptor(path))
    else:
        _replace(target, data)


def write_outputs(outputs: list[tuple[str, Path | None, Callable[[Path], None]]]) -> bool:
    """Call each ``(flag, path, writer)`` whose path is set; a failure is said on stderr with its flag.

    True when every file was written.
    """
    ok = True
    for flag, path, writer in outputs:
        if path is None:
            continue
        try:
            writer(path)
        except OSError as exc:
            ok = False
            reason = exc.strerror or str(exc)
            print(f"hangwatch: error: {flag} {path}: not written: {reason}", file=sys.stderr, flush=True)
    return ok


def output_path_problem(path: Path, example_name: str = "report") -> str | None:
    """Why ``path`` cannot take a report (checked before a command starts), or None when it can."""
    if path == STDOUT:
        return None
    if _is_descriptor(path):
        try:
            held = path.stat().st_mode
        except OSError as exc:
            return f"not an open descriptor ({exc.strerror}): give a file path"
        return "is a folder: give a file path" if stat.S_ISDIR(held) else None
    if not path.name:
        return f"is a folder: give a file in it, e.g. {path / example_name}"
    target = Path(os.path.realpath(path))
    try:
        mode: int | None = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        return f"cannot be read ({exc.strerror}): give another path"
    if mode is not None:
        if stat.S_ISDIR(mode):
            return f"is a folder: give a file in it, e.g. {path / example_name}"
        kind = _kind(mode)
        if kind is not None:
            return f"is {kind}, which hangwatch never replaces: give a file path"
        if not os.access(target, os.W_OK):
            return "the file exists and is not writable: remove it or give another path"
        if not stat.S_ISREG(mode):  # a FIFO or a character device: written straight, no folder needed
            return None
    parent = target.parent
    if not parent.exists():
        return f"the folder {parent} does not exist: create it first (mkdir -p {parent}) or give another path"
    if not parent.is_dir():
        return f"{parent} is not a folder"
    problem = folder_problem(parent)
    return None if problem is None else f"{problem}: give a path in a folder you can write to"


def folder_problem(folder: Path) -> str | None:
    """Why no file can be created in ``folder`` (an existing folder), or None (what is wrong, not what to do).

    Tried for real, with a file created and removed at once: ``os.access`` says yes to root for /sys, a
    read-only bind mount or an immutable folder, and a report refused only after the run costs the run.
    """
    probe = folder / f".hangwatch-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return f"cannot create files in {folder} ({reason})"
    os.close(fd)
    with contextlib.suppress(OSError):
        probe.unlink()
    return None


def _is_descriptor(path: Path) -> bool:
    """Whether ``path``, or a link on the way to what it names, is a descriptor link (/proc/self/fd/N).

    Such a link names an open file, a pipe or a terminal, not a place in a folder: resolving it gives
    ``pipe:[123]`` or a file another program holds open, and it can only be written through."""
    current = Path.cwd() / path  # absolute, without resolving the links (each is looked at in turn)
    for _ in range(40):  # the kernel's own limit on links followed
        if _FD_FOLDER.fullmatch(str(current.parent.resolve())):
            return True
        if not current.is_symlink():
            return False
        current = current.parent / current.readlink()  # an absolute link replaces the folder
    return False


def _where(path: Path) -> tuple[bool, Path]:
    """(written straight?, the node written): through symlinks to what they name."""
    if _is_descriptor(path):
        return True, path
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return False, target
    if stat.S_ISREG(mode):
        return False, target
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return True, target
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder: give a file path")
    raise OSError(errno.EEXIST, f"is {_kind(mode) or 'not a regular file'}, which hangwatch never replaces")


def _kind(mode: int) -> str | None:
    """The name of a node hangwatch refuses to write (None: one it writes)."""
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISDIR(mode):
        return None
    return "not a regular file"


def _write_straight(target: Path, data: bytes, append: bool) -> None:
    # No O_CREAT (the node exists: a vanished one is an error, not a new regular file in /dev) and no
    # O_TRUNC; a descriptor of a regular file is appended to, as the program holding it expects.
    flags = os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC | (os.O_APPEND if append else 0)
    fd = os.open(target, flags)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def _replace(target: Path, data: bytes) -> None:
    """A temporary file in the target's folder, renamed over it: the target is whole or as it was."""
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = None
    while True:
        tmp = target.with_name(f"{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            # 0o666 less the umask for a new file, as open(..., "w") would make it.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            break
        except FileExistsError:
            continue
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)  # the file's own mode, not a new default: a 0600 report stays 0600
            _write_all(fd, data)
        finally:
            os.close(fd)
        tmp.replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
