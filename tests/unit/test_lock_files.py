"""Lock files no process holds (collect/lockfiles.py): found in the build folders the tree's environment
names, never one a live process has locked, never through a link, within a bounded walk."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

from hangwatch.collect import procfs
from hangwatch.collect.lockfiles import MAX_FOUND
from hangwatch.collect.lockfiles import find_lock_files
from hangwatch.collect.lockfiles import lock_files_of
from hangwatch.collect.lockfiles import marker_dirs
from hangwatch.engines import registry


def _locked_now() -> set[str]:
    return {key for key, _ in procfs.read_locks()}


def test_a_marker_left_before_the_run_is_found_with_its_age(tmp_path):
    ext = tmp_path / "py311_cpu" / "myext"
    ext.mkdir(parents=True)
    marker = ext / "lock"
    marker.write_text("")
    os.utime(marker, (time.time() - 600, time.time() - 600))
    (ext / "build.ninja").write_text("")  # not a lock
    (tmp_path / "notalock.txt").write_text("")
    found = find_lock_files([tmp_path], _locked_now(), started_wall=time.time() - 5)
    assert [f.path for f in found] == [str(marker)]
    assert found[0].before_start and 590 <= found[0].age_s <= 700


def test_a_lock_a_live_process_holds_is_not_a_marker(tmp_path):
    held = tmp_path / "cache.lock"
    with open(held, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        assert find_lock_files([tmp_path], _locked_now(), started_wall=time.time()) == ()
    # Released (its holder done or dead): the file alone no longer blocks a flock user, but it is a lock
    # file nobody holds, said as such (with its age), not as a cause.
    found = find_lock_files([tmp_path], _locked_now(), started_wall=time.time() + 60)
    assert [f.path for f in found] == [str(held)] and found[0].before_start


def test_links_are_never_followed_and_the_walk_is_bounded(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "lock").write_text("")
    top = tmp_path / "top"
    top.mkdir()
    (top / "linked").symlink_to(elsewhere)
    (top / "x.lock").symlink_to(elsewhere / "lock")
    assert find_lock_files([top], set(), started_wall=time.time()) == ()
    many = tmp_path / "many"
    many.mkdir()
    for i in range(MAX_FOUND + 5):
        (many / f"{i}.lock").write_text("")
    assert len(find_lock_files([many], set(), started_wall=time.time())) == MAX_FOUND
    assert find_lock_files([tmp_path / "absent"], set(), started_wall=time.time()) == ()


def test_the_folders_come_from_the_tree_s_environment(tmp_path):
    ext = tmp_path / "ext"
    (ext / "py311_cpu" / "myext").mkdir(parents=True)
    (ext / "py311_cpu" / "myext" / "lock").write_text("")
    os.utime(ext / "py311_cpu" / "myext" / "lock", (time.time() - 60, time.time() - 60))  # an earlier run's
    caches = registry.cache_folders()
    assert marker_dirs({"TORCH_EXTENSIONS_DIR": str(ext)}, caches)[0] == ext
    assert (
        marker_dirs({"HOME": "/h"}, caches)[0]
        == marker_dirs({"HOME": "/h", "XDG_CACHE_HOME": "/h/.cache"}, caches)[0]
    )
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "HOME": str(tmp_path / "home")}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        time.sleep(0.2)
        found = lock_files_of([child.pid], caches)
    finally:
        child.kill()
        child.wait()
    assert [f.path for f in found] == [str(ext / "py311_cpu" / "myext" / "lock")]
    assert found[0].before_start  # written before the child started
