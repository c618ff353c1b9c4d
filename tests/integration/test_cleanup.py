"""``hangwatch cleanup`` on a real tree: shm segments, a stopped member, a zombie, one that ignores SIGTERM,
and a process outside the tree that must survive (and keep the segment it shares)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hangwatch.supervise.runrecord import write_run_record
from hwrun import hangwatch_argv
from proc_helpers import MAIN_THREAD_EXITS
from proc_helpers import free_port
from proc_helpers import proc_ended
from proc_helpers import proc_state
from proc_helpers import spawn
from proc_helpers import wait_for_file

pytestmark = pytest.mark.timeout(120)
HERE = Path(__file__).resolve().parent
SHM = Path("/dev/shm")


def cleanup(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        hangwatch_argv("cleanup", *args), capture_output=True, text=True, timeout=90, check=False
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def alive(pid: int) -> bool:
    return not proc_ended(pid)


@pytest.fixture
def tree(tmp_path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, int], str, int]]:
    name = f"hwtest-{uuid.uuid4().hex[:8]}"
    ready = tmp_path / "tree.ready"
    port = free_port()
    cmd = [
        sys.executable,
        str(HERE / "cleanup_tree.py"),
        "--ready",
        str(ready),
        "--shm",
        name,
        "--port",
        str(port),
    ]
    try:
        with spawn(cmd) as popen:
            pids = json.loads(wait_for_file(ready, timeout=30, popen=popen))
            yield popen, pids, name, port
    finally:
        for suffix in ("-root", "-shared"):
            (SHM / f"{name}{suffix}").unlink(missing_ok=True)


@pytest.fixture
def outsider(tree, tmp_path) -> Iterator[int]:
    _popen, _pids, name, _port = tree
    ready = tmp_path / "outsider.ready"
    with spawn(
        [sys.executable, str(HERE / "shm_holder.py"), str(SHM / f"{name}-shared"), str(ready)]
    ) as popen:
        wait_for_file(ready, timeout=30, popen=popen)
        yield popen.pid


def test_dry_run_changes_nothing(tree):
    _popen, pids, name, _port = tree
    before = {k: proc_state(p) for k, p in pids.items()}
    out = cleanup("--pid", str(pids["root"]), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "nothing was changed" in out.stdout
    for key in ("root", "mapper", "stopped", "stubborn", "grandchild"):
        assert f"pid {pids[key]:>7}" in out.stdout
    assert {k: proc_state(p) for k, p in pids.items()} == before
    assert before["stopped"] == "T" and before["zombie"] == "Z"
    assert (SHM / f"{name}-root").exists() and (SHM / f"{name}-shared").exists()


def test_stops_the_tree_frees_shm_and_spares_the_outsider(tree, outsider):
    popen, pids, name, _port = tree
    out = cleanup("--pid", str(pids["root"]), "--grace", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    for key in ("mapper", "stopped", "stubborn", "grandchild"):
        assert not alive(pids[key]), (key, out.stdout)
    assert proc_state(pids["root"]) in ("Z", "")  # exited; our Popen reaps it
    assert "needed SIGKILL" in out.stdout  # the one that ignores SIGTERM
    assert psutil.Process(outsider).status() != psutil.STATUS_ZOMBIE  # outside the tree: untouched
    assert not (SHM / f"{name}-root").exists()
    assert (SHM / f"{name}-shared").exists()  # still mapped by the outsider: kept
    assert f"still mapped or open by pid {outsider}" in out.stdout
    assert f"{name}-root: removed" in out.stdout
    popen.wait(timeout=10)


def test_by_port(tree):
    _popen, pids, name, port = tree
    dry = cleanup("--port", str(port), "--dry-run")
    assert dry.returncode == 0 and f"pid {pids['root']:>7}" in dry.stdout
    out = cleanup("--port", str(port), "--grace", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert not alive(pids["mapper"]) and not alive(pids["stubborn"])
    assert not (SHM / f"{name}-root").exists() and not (SHM / f"{name}-shared").exists()


def test_by_run_directory(tree, tmp_path):
    _popen, pids, _name, _port = tree
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = write_run_record(run_dir, pids["root"], ("python", "cleanup_tree.py"))
    assert record is not None and json.loads((run_dir / "run.json").read_text())["pid"] == pids["root"]
    out = cleanup("--run", str(run_dir), "--grace", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert not alive(pids["grandchild"])


def test_refuses_what_it_must_not_touch(tmp_path):
    assert cleanup("--pid", "1", "--dry-run").returncode == 2
    mine = cleanup("--pid", str(os.getpid()), "--dry-run")  # the tree would contain hangwatch itself
    assert mine.returncode == 2 and "hangwatch itself" in mine.stderr
    assert "no process with PID" in cleanup("--pid", "999999999").stderr
    assert "run.json" in cleanup("--run", str(tmp_path)).stderr


def test_a_finished_run_is_already_clean(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        hangwatch_argv("run", "--quiet", "--no-doctor", "--run-dir", str(run_dir), "--", "true"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and (run_dir / "run.json").is_file(), proc.stderr
    for extra in ((), ("--dry-run",)):
        out = cleanup("--run", str(run_dir), *extra)
        assert out.returncode == 0, out.stderr
        assert "already clean" in out.stdout and not out.stderr


def _threads(pid: int) -> int:
    return len(psutil.Process(pid).threads()) if psutil.pid_exists(pid) else 0


def test_a_process_whose_main_thread_ended_is_stopped_not_called_exited():
    code = MAIN_THREAD_EXITS.format(ignore_term=True, sleep=120)
    with spawn([sys.executable, "-c", code]) as popen:
        pid = popen.pid
        deadline = time.monotonic() + 30.0
        while proc_state(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc_state(pid) == "Z" and _threads(pid) == 2
        dry = cleanup("--pid", str(pid), "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "1 process would be stopped" in dry.stdout and "its main thread ended" in dry.stdout
        done = cleanup("--pid", str(pid), "--grace", "1")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 needed SIGKILL" in done.stdout, done.stdout
        assert popen.wait(timeout=10) == -9  # ended at last: its parent (this test) reaps it
