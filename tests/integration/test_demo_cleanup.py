"""``hangwatch demo`` leaves no temporary folder, whether it ends normally or by Ctrl-C, and the log its
verdict names is still there afterwards: in a run folder, where ``run`` puts its own (pruned like them)."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from hwrun import hangwatch_argv
from proc_helpers import spawn

pytestmark = pytest.mark.timeout(120)

DEAD = 99_999_999  # above any pid_max: never a live process


def _env(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp, {
        **os.environ,
        "TMPDIR": str(tmp),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PYTHONUNBUFFERED": "1",
    }


def test_the_demo_leaves_no_temporary_folder_and_its_log_stays(tmp_path):
    tmp, env = _env(tmp_path)
    runs = tmp_path / "state" / "hangwatch" / "runs"
    old = []
    for n in range(3):  # earlier runs' folders: with HANGWATCH_KEEP_RUNS=2 the two oldest go
        folder = runs / f"20260105-10{n:02d}00-{DEAD}"
        folder.mkdir(parents=True)
        (folder / "output.log").write_text("an earlier run\n")
        old.append(folder)
    proc = subprocess.run(
        hangwatch_argv("demo", "--ranks", "2", "--stall-after", "4", "--quiet"),
        capture_output=True, text=True, timeout=100, cwd=tmp_path, env={**env, "HANGWATCH_KEEP_RUNS": "2"},
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "hangwatch verdict: STALLED" in proc.stdout
    assert not list(tmp.glob("hangwatch-demo-*")), list(tmp.iterdir())
    log = re.search(r"^  log: (\S+)", proc.stdout, re.MULTILINE)
    assert log is not None, proc.stdout[-2000:]
    path = tmp_path / log[1]  # absolute: the join leaves it as it is
    assert path.parent.parent == runs and "Capture cuda graph begin" in path.read_text()
    assert sorted(p.name for p in runs.iterdir()) == sorted([old[2].name, path.parent.name])


@pytest.mark.parametrize("given", [False, True], ids=["default-run-dir", "run-dir-given"])
def test_the_demo_stopped_by_ctrl_c_leaves_no_temporary_folder(tmp_path, given):
    tmp, env = _env(tmp_path)
    mine = tmp_path / "mine"
    argv = hangwatch_argv("demo", "--ranks", "2", *(["--run-dir", str(mine)] if given else []))
    with spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path) as p:
        assert p.stdout is not None
        seen = []
        for line in p.stdout:
            seen.append(line)
            if "Load weight begin" in line:  # the story runs: its run folder is in use
                break
        p.send_signal(signal.SIGINT)
        rest, _ = p.communicate(timeout=60)
    out = "".join(seen) + rest
    assert p.returncode == 130, out[-2000:]
    assert not list(tmp.glob("hangwatch-demo-*")), list(tmp.iterdir())
    runs = tmp_path / "state" / "hangwatch" / "runs"
    logs = [mine / "output.log"] if given else list(runs.glob("*/output.log"))
    assert len(logs) == 1 and "Load weight begin" in logs[0].read_text(), out[-2000:]
    assert given is not runs.exists()  # --run-dir: nothing goes to the default place
