"""The one writer of every file hangwatch writes (render/files.py), on the nodes a user may name: a
regular file and a new path are replaced atomically, a symlink is written through (the link stays), a
FIFO, a character device and a descriptor are written straight (they stay what they are), and a folder or
a socket is refused, never replaced. Every special file is made here, in tmp_path; none under /dev."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangwatch.render.files import output_path_problem
from hangwatch.render.files import write_atomically
from hangwatch.render.files import write_outputs

TEXT = '{"schema": "hangwatch.report/1"}\n'
STDOUT = Path("-")  # what an output option's `-` becomes


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@contextlib.contextmanager
def fifo_with_reader(path: Path) -> Iterator[int]:
    """A FIFO with a reader already there (a non-blocking read end, held open), so that a writer that
    opens it straight does not wait, and one that replaces it writes nothing the reader sees."""
    os.mkfifo(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        yield fd
    finally:
        os.close(fd)


def _read_available(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def test_a_regular_file_is_replaced_whole_and_keeps_its_mode(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    path.chmod(0o600)  # a user who made the report private: it stays private
    write_atomically(path, TEXT)
    assert path.read_text() == TEXT
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _leftovers(tmp_path) == []


def test_a_new_path_is_created(tmp_path):
    write_atomically(tmp_path / "new.json", TEXT)
    assert (tmp_path / "new.json").read_text() == TEXT
    assert _leftovers(tmp_path) == []


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    target = tmp_path / "elsewhere" / "real.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "r.json"
    link.symlink_to(target)
    write_atomically(link, TEXT)
    assert link.is_symlink() and link.readlink() == target
    assert target.read_text() == TEXT
    assert _leftovers(tmp_path) == [] and _leftovers(target.parent) == []


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "r.json"
    link.symlink_to("made.json")  # relative: beside the link
    write_atomically(link, TEXT)
    assert link.is_symlink()
    assert (tmp_path / "made.json").read_text() == TEXT


def test_a_fifo_is_written_straight_and_stays_a_fifo(tmp_path):
    path = tmp_path / "r.fifo"
    with fifo_with_reader(path) as reader:
        write_atomically(path, TEXT)
        assert _read_available(reader) == TEXT.encode()
    assert stat.S_ISFIFO(path.lstat().st_mode)
    assert _leftovers(tmp_path) == []


def test_a_symlink_to_a_fifo_is_written_into_the_fifo(tmp_path):
    fifo = tmp_path / "r.fifo"
    link = tmp_path / "r.json"
    with fifo_with_reader(fifo) as reader:
        link.symlink_to(fifo)
        write_atomically(link, TEXT)
        assert _read_available(reader) == TEXT.encode()
    assert link.is_symlink() and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_descriptor_link_is_written_into_the_open_pipe(tmp_path):
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(read_end, False)
        write_atomically(Path(f"/proc/self/fd/{write_end}"), TEXT)
        assert _read_available(read_end) == TEXT.encode()
        # and through a link of our own to it, as /dev/stdout is to /proc/self/fd/1: the link stays
        link = tmp_path / "stdout"
        link.symlink_to(f"/proc/self/fd/{write_end}")
        write_atomically(link, TEXT)
        assert _read_available(read_end) == TEXT.encode()
        assert link.is_symlink()
    finally:
        os.close(read_end)
        os.close(write_end)
    assert _leftovers(tmp_path) == []


def test_a_descriptor_of_a_regular_file_is_appended_to_not_replaced(tmp_path):
    held = tmp_path / "held.log"
    with held.open("w") as fh:
        fh.write("before\n")
        fh.flush()
        write_atomically(Path(f"/proc/self/fd/{fh.fileno()}"), TEXT)
        inode = os.fstat(fh.fileno()).st_ino
    assert held.read_text() == "before\n" + TEXT
    assert held.stat().st_ino == inode  # the file its holder writes, not a new one in its place


def test_a_character_device_is_written_straight_and_stays_a_device(tmp_path):
    """A terminal (a pty made here), through a link in tmp_path as /dev/stdout is a link; and /dev/null
    the same way: both stay character devices, and the link stays a link."""
    master, slave = os.openpty()
    try:
        pts = os.ttyname(slave)
        link = tmp_path / "tty"
        link.symlink_to(pts)
        write_atomically(link, "to the terminal\n")
        os.set_blocking(master, False)
        assert b"to the terminal" in _read_available(master)
        assert link.is_symlink() and stat.S_ISCHR(Path(pts).stat().st_mode)
        write_atomically(Path(f"/proc/self/fd/{slave}"), "by descriptor\n")
        assert b"by descriptor" in _read_available(master)
    finally:
        os.close(master)
        os.close(slave)
    null = tmp_path / "null"
    null.symlink_to(os.devnull)
    write_atomically(null, TEXT)
    assert null.is_symlink() and stat.S_ISCHR(Path(os.devnull).stat().st_mode)
    assert _leftovers(tmp_path) == []


def test_a_full_device_is_an_error_said_not_a_regular_file_made(tmp_path, capsys):
    link = tmp_path / "full"
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this machine")
    link.symlink_to("/dev/full")
    assert not write_outputs([("--report-json", link, lambda p: write_atomically(p, TEXT))])
    assert "No space left on device" in capsys.readouterr().err
    assert link.is_symlink() and stat.S_ISCHR(Path("/dev/full").stat().st_mode)


def test_a_folder_or_a_socket_is_refused_never_replaced(tmp_path, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(sock_path))
        outputs = [
            ("--report-json", folder, lambda p: write_atomically(p, TEXT)),
            ("--report-md", sock_path, lambda p: write_atomically(p, TEXT)),
        ]
        assert not write_outputs(outputs)
        assert stat.S_ISSOCK(sock_path.lstat().st_mode)
    finally:
        sock.close()
    assert folder.is_dir() and list(folder.iterdir()) == []
    err = capsys.readouterr().err
    assert f"--report-json {folder}: not written: is a folder" in err
    assert f"--report-md {sock_path}: not written: is a socket" in err
    assert _leftovers(tmp_path) == []


def test_stdout_is_written_to_standard_output(capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a writer that took `-` for a file name would leave it
    write_atomically(STDOUT, TEXT)
    assert capfd.readouterr().out == TEXT
    assert list(tmp_path.iterdir()) == []


def test_the_check_before_start_accepts_what_the_writer_writes(tmp_path):
    """Trying the folder for real (below) is for what is replaced: a FIFO, a device or a descriptor is
    written straight, and its folder (/dev, /proc/self/fd) is never tried."""
    fifo = tmp_path / "r.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "null"
    link.symlink_to(os.devnull)
    read_end, write_end = os.pipe()
    try:
        fd_link = Path(f"/proc/self/fd/{write_end}")
        for path in (STDOUT, fifo, link, Path(os.devnull), fd_link, tmp_path / "new.json"):
            assert output_path_problem(path) is None, path
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_check_before_start_refuses_a_socket(tmp_path):
    sock_path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(sock_path))
        problem = output_path_problem(sock_path)
    assert problem is not None and "is a socket" in problem


def test_the_check_before_start_tries_the_folder_for_real():
    """/sys refuses new files even to root, for whom os.access says yes: only trying tells."""
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs on this machine")
    problem = output_path_problem(Path("/sys/report.json"))
    assert problem is not None and "cannot create files in /sys" in problem
    assert not list(Path("/sys").glob(".hangwatch-probe-*"))


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes into a folder of mode 0555 (/sys is tried instead)"
)
def test_the_check_before_start_refuses_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        problem = output_path_problem(folder / "r.json")
    finally:
        folder.chmod(0o755)
    assert problem is not None and "cannot create files in" in problem
    assert list(folder.iterdir()) == []
