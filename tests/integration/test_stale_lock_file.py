"""A load that waits on torch's extension-build baton (torch.utils.file_baton.FileBaton, as
cpp_extension.load does): a lock file left by a killed build is named with the command that removes it;
the same wait ended by a build that finishes is progress, never called stuck (issue 23: a lock file
no process holds is what the user must delete)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from hwrun import program

pytestmark = pytest.mark.timeout(150)


def _marker(tmp_path, age_s: float):
    lock = tmp_path / "ext" / "py311_cpu" / "myext" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


def test_a_marker_a_killed_build_left_is_named_with_its_removal(hw, tmp_path):
    lock = _marker(tmp_path, 900)
    out = hw("run", "--no-doctor", "--stall-after", "8", "--", *program("stale_build_lock"),
             env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})  # fmt: skip
    assert out.rc == 3, (out.stdout[-3000:], out.stderr[-2000:])
    v = out.report["verdict"]
    assert v["cause"] == "compile-stall" and "stacks:stale-lock-file" in v["decided_by"], v
    assert str(lock) in v["summary"] and "15 min" in v["summary"]
    assert v["next_steps"][0].startswith(f"Remove the marker: `rm {lock}`"), v["next_steps"]
    assert lock.exists()  # named, never touched


def test_a_build_that_finishes_is_progress(hw, tmp_path):
    """The baton's holder is alive and done in 5 s (it removes the file): the loader goes on and ends."""
    lock = _marker(tmp_path, 900)
    remover = threading.Timer(5.0, lock.unlink)
    remover.start()
    try:
        out = hw("run", "--no-doctor", "--stall-after", "20", "--", *program("stale_build_lock"),
                 env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})  # fmt: skip
    finally:
        remover.cancel()
    assert out.rc == 0 and out.report["verdict"]["state"] == "exited", out.stdout[-3000:]
    assert "loaded" in out.stdout


def test_stacks_names_it_too(tmp_path):
    """The same wait, the same cause, under `hangwatch stacks` of a tree someone else started (run from
    the same shell: the loader's title, set with setproctitle, hides its environment in /proc)."""
    from hwrun import hangwatch_argv
    from proc_helpers import spawn

    lock = _marker(tmp_path, 900)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    with spawn(
        program("stale_build_lock"), env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as p:
        assert p.stdout is not None and "Loading extension" in p.stdout.readline()
        time.sleep(3)  # torch imported, in the baton's poll
        out = subprocess.run(
            hangwatch_argv("stacks", "--pid", str(p.pid)), capture_output=True, text=True, env=env, timeout=90
        )
    assert out.returncode == 0, out.stderr
    assert "cause: compile-stall" in out.stdout and str(lock) in out.stdout, out.stdout
    assert f"rm {lock}" in out.stdout
    assert lock.exists()
