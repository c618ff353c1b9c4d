"""Rotation of the default run folders (supervise/rundirs.py), on real folders in tmp_path: the newest N
stay, only hangwatch's own folders go, never one whose run may be alive, never through a symlink."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from hangwatch.cli.options import default_run_dir_checked
from hangwatch.supervise.rundirs import DEFAULT_KEEP_RUNS
from hangwatch.supervise.rundirs import KEEP_RUNS_ENV
from hangwatch.supervise.rundirs import keep_runs_setting
from hangwatch.supervise.rundirs import prune_run_dirs
from proc_helpers import spawn

DEAD = 99_999_999  # above any pid_max (at most 2**22): never a live process


def make_run(base: Path, n: int, *, pid: int = DEAD, marker: str = "output.log", suffix: str = "") -> Path:
    """A run folder as ``hangwatch run`` leaves it, started ``n`` minutes past 10:00 on 2026-01-05."""
    folder = base / f"20260105-10{n:02d}00-{pid}{suffix}"
    folder.mkdir(parents=True)
    (folder / marker).parent.mkdir(parents=True, exist_ok=True)
    (folder / marker).write_text(json.dumps({"pid": DEAD, "supervisor_pid": DEAD}))
    return folder


def names(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir())


def test_the_newest_are_kept_and_the_oldest_removed(tmp_path):
    runs = [make_run(tmp_path, n, marker="run.json" if n % 2 else "output.log") for n in range(6)]
    pruned = prune_run_dirs(tmp_path, 4)
    assert names(tmp_path) == sorted(r.name for r in runs[2:])
    assert set(pruned.removed) == set(runs[:2]) and pruned.problems == () and pruned.kept_live == ()


def test_the_folder_about_to_be_made_counts_as_one_of_the_kept(tmp_path):
    runs = [make_run(tmp_path, n) for n in range(5)]
    new = tmp_path / f"20260105-110000-{os.getpid()}"
    prune_run_dirs(tmp_path, 3, new=new)
    assert names(tmp_path) == sorted(r.name for r in runs[3:])  # 2 old + the new one = 3


def test_keep_zero_keeps_everything(tmp_path):
    for n in range(5):
        make_run(tmp_path, n)
    assert prune_run_dirs(tmp_path, 0).removed == ()
    assert len(names(tmp_path)) == 5


def test_isolate_and_bench_folders_are_recognised(tmp_path):
    isolate = make_run(tmp_path, 0, marker="isolate-state.json", suffix="-isolate")
    trials = make_run(
        tmp_path, 1, marker="trial-00/run.json", suffix=f"-isolate-{DEAD}"
    )  # a pid never alive, not 77
    bench = make_run(tmp_path, 2, marker="server-a/output.log")
    newest = make_run(tmp_path, 3)
    assert set(prune_run_dirs(tmp_path, 1).removed) == {isolate, trials, bench}
    assert names(tmp_path) == [newest.name]


def test_what_is_not_certainly_ours_is_never_removed(tmp_path):
    base = tmp_path / "runs"
    outside = make_run(tmp_path / "elsewhere", 0)  # a run folder, but not of this base
    keep = [
        make_run(base, 1, marker="notes.txt"),  # named like ours, but holds nothing hangwatch writes
        make_run(base, 2, suffix="-mine"),  # a name that is not ours
    ]
    (base / "20260105-100300-5").write_text("a file named like a run folder")
    (base / "my-runs").mkdir()
    (base / "my-runs" / "output.log").write_text("someone's log")
    link = base / "20260105-100400-6"
    link.symlink_to(outside, target_is_directory=True)
    keep_marker_link = make_run(base, 5, marker="sub/placeholder")
    (keep_marker_link / "output.log").symlink_to(outside / "output.log")  # a marker that is a link: not ours
    newest = make_run(base, 9)
    pruned = prune_run_dirs(base, 1)
    assert pruned.removed == () and pruned.problems == ()
    assert all(p.exists() for p in keep) and link.is_symlink() and (outside / "output.log").is_file()
    assert newest.is_dir() and keep_marker_link.is_dir()


def test_a_symlink_inside_a_removed_folder_is_removed_not_followed(tmp_path):
    base = tmp_path / "runs"
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep me")
    old = make_run(base, 0)
    (old / "link").symlink_to(precious, target_is_directory=True)
    make_run(base, 1)
    assert prune_run_dirs(base, 1).removed == (old,)
    assert (precious / "data").read_text() == "keep me"


def test_a_folder_whose_process_is_alive_is_kept(tmp_path):
    with spawn([sys.executable, "-c", "import time; time.sleep(60)"]) as child:
        by_name = make_run(tmp_path, 0, pid=child.pid)  # the supervisor's pid is in the name
        by_record = make_run(tmp_path, 1, marker="run.json")
        (by_record / "run.json").write_text(json.dumps({"pid": child.pid, "supervisor_pid": DEAD}))
        by_trial = make_run(tmp_path, 2, marker="trial-01/run.json", suffix="-isolate")
        trial_record = {"pid": DEAD, "supervisor_pid": child.pid}
        (by_trial / "trial-01" / "run.json").write_text(json.dumps(trial_record))
        dead = make_run(tmp_path, 3)
        newest = make_run(tmp_path, 4)
        pruned = prune_run_dirs(tmp_path, 1)
        assert pruned.removed == (dead,)
        assert set(pruned.kept_live) == {by_name, by_record, by_trial}
        assert names(tmp_path) == sorted(p.name for p in (by_name, by_record, by_trial, newest))
    assert child.poll() is not None  # spawn() reaped it


def test_a_base_that_cannot_be_read_is_a_problem_not_an_error(tmp_path):
    pruned = prune_run_dirs(tmp_path / "missing", 3)
    assert pruned.removed == () and len(pruned.problems) == 1 and "cannot list" in pruned.problems[0]


@pytest.mark.parametrize(
    ("value", "keep", "noted"),
    [(None, DEFAULT_KEEP_RUNS, False), ("", DEFAULT_KEEP_RUNS, False), ("7", 7, False), (" 0 ", 0, False),
     ("-1", 0, True), ("ten", 0, True), ("2.5", 0, True)],
)  # fmt: skip
def test_the_setting_from_the_environment(value, keep, noted):
    env = {} if value is None else {KEEP_RUNS_ENV: value}
    got, note = keep_runs_setting(env)
    assert got == keep and (note is not None) == noted
    if noted:
        assert KEEP_RUNS_ENV in str(note) and "keeping every run folder" in str(note)


def test_the_default_run_dir_prunes_its_base(tmp_path, monkeypatch, capsys):
    """What ``run`` and ``demo`` call without --run-dir: the oldest folders of the default base go."""
    base = tmp_path / "hangwatch" / "runs"
    runs = [make_run(base, n) for n in range(5)]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setenv(KEEP_RUNS_ENV, "3")
    path = default_run_dir_checked()
    assert path.parent == base and not path.exists()  # made later, by the run itself
    assert names(base) == sorted(r.name for r in runs[3:])
    assert capsys.readouterr().err == ""


def test_a_bad_setting_keeps_every_folder_and_says_so(tmp_path, monkeypatch, capsys):
    base = tmp_path / "hangwatch" / "runs"
    for n in range(3):
        make_run(base, n)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setenv(KEEP_RUNS_ENV, "few")
    default_run_dir_checked()
    assert len(names(base)) == 3
    err = capsys.readouterr().err
    assert err.startswith("hangwatch: note: old run folders: HANGWATCH_KEEP_RUNS='few'")
    assert err.count("\n") == 1  # one line


def test_the_first_run_has_nothing_to_prune(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "fresh"))
    path = default_run_dir_checked()
    assert path.parent == tmp_path / "fresh" / "hangwatch" / "runs" and capsys.readouterr().err == ""
