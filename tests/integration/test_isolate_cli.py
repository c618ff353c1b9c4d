"""``hangwatch isolate`` on real programs: a hang that depends on flags, a flaky one, Ctrl-C, --resume.

Every trial boots in a second or two (``flag_hang.py``, ``flaky_boot.py``); stalls are seen within
``--stall-after 3``. ``flag_hang.py --marker`` records, at each boot, whether any process of an earlier
boot was still there and whether the port was free: clean-up between trials is checked by the program
itself, at the moment the next trial starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hwrun import PROGRAMS
from proc_helpers import free_port
from proc_helpers import kill_tree
from proc_helpers import proc_ended
from proc_helpers import wait_until

MATRIX = """
[[toggle]]
name = "strict"
add = ["--strict"]
[[toggle]]
name = "p2p-off"
env = { NCCL_P2P_DISABLE = "1" }
[[toggle]]
name = "no-spec"
remove = ["--spec"]
why = "speculative decoding off"
[[toggle]]
name = "graphs-off"
replace = { "--graphs" = "off" }
[[toggle]]
name = "safe-backend"
replace = { "--backend" = "safe" }
"""


def isolate_argv(tmp_path: Path, port: int, *options: str, program: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "hangwatch", "isolate",
        "--stall-after", "3", "--ready-url", f"http://127.0.0.1:{port}/health", "--grace", "2",
        "--report-json", str(tmp_path / "isolate.json"), "--no-doctor",
        *options, "--", *program,
    ]  # fmt: skip


def flag_program(port: int, marker: Path, *extra: str) -> list[str]:
    return [sys.executable, str(PROGRAMS / "flag_hang.py"), "--port", str(port), "--marker", str(marker),
            "--spec", "on", "--graphs", "on", *extra]  # fmt: skip


def run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_tree(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def boots(marker: Path) -> list[dict[str, Any]]:
    out = []
    for line in marker.read_text().splitlines():
        parts = line.split()
        if parts[0] != "boot":
            continue
        fields = dict(p.split("=", 1) for p in parts[2:4])
        out.append(
            {"pid": int(parts[1]), "alive": fields["alive"], "port": fields["port"], "args": parts[4:]}
        )
    return out


def all_pids(marker: Path) -> list[int]:
    return [int(line.split()[1]) for line in marker.read_text().splitlines()]


def assert_clean_between_trials(marker: Path) -> None:
    for boot in boots(marker):
        assert boot["alive"] == "none", f"a process of an earlier trial was still there: {boot}"
        assert boot["port"] == "free", f"the port was busy when a trial started: {boot}"
    assert all(proc_ended(pid) for pid in all_pids(marker))


def test_isolate_names_the_toggles_that_make_it_boot(tmp_path: Path) -> None:
    port, marker, matrix = free_port(), tmp_path / "marker", tmp_path / "m.toml"
    matrix.write_text(MATRIX)
    argv = isolate_argv(
        tmp_path, port, "--matrix", str(matrix), "--all", "--run-dir", str(tmp_path / "runs"),
        "--report-html", str(tmp_path / "isolate.html"), program=flag_program(port, marker),
    )  # fmt: skip
    done = run(argv)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "isolate.json").read_text())
    assert report["schema"] == "hangwatch.isolate/1"
    assert report["baseline"]["verdict"]["state"] == "stalled"
    assert report["baseline"]["edits"] == []
    by_name = {t["name"]: t for t in report["trials"]}
    assert {n: t["verdict"]["state"] for n, t in by_name.items()} == {
        "strict": "crashed", "p2p-off": "stalled", "no-spec": "ready", "graphs-off": "ready",
        "safe-backend": "ready",
    }  # fmt: skip
    assert sorted(report["conclusion"]["culprit_toggles"]) == ["graphs-off", "no-spec", "safe-backend"]
    assert report["conclusion"]["confidence"] == "medium"  # one run each: p = 0.5
    assert "speculative decoding off" in report["conclusion"]["summary"]
    # The baseline's cause (its rank waits inside CudaGraphRunner.capture) puts the graph and spec toggles first.
    if report["baseline"]["verdict"]["cause"] == "cuda-graph-capture":
        assert [t["name"] for t in report["trials"]][:2] == ["no-spec", "graphs-off"]
    assert "makes it boot: " in done.stdout and "conclusion (medium confidence)" in done.stdout
    for i in range(6):
        trial = tmp_path / "runs" / f"trial-{i:02d}"
        assert (trial / "output.log").is_file() and (trial / "report.json").is_file()
    assert "<table>" in (tmp_path / "isolate.html").read_text()
    assert len(boots(marker)) == 6
    assert_clean_between_trials(marker)


def test_isolate_stops_at_the_first_change_that_boots_and_confirms_it_with_repeats(tmp_path: Path) -> None:
    port, marker, matrix = free_port(), tmp_path / "marker", tmp_path / "m.toml"
    matrix.write_text(
        '[[toggle]]\nname = "p2p-off"\nenv = { NCCL_P2P_DISABLE = "1" }\n'
        '[[toggle]]\nname = "safe-backend"\nreplace = { "--backend" = "safe" }\n'
        '[[toggle]]\nname = "strict"\nadd = ["--strict"]\n'
    )
    done = run(isolate_argv(tmp_path, port, "--matrix", str(matrix), "--repeat", "2",
                            "--run-dir", str(tmp_path / "runs"), program=flag_program(port, marker)))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "isolate.json").read_text())
    assert [t["name"] for t in report["trials"]] == ["p2p-off", "safe-backend"]
    assert report["not_run"] == ["strict"]
    assert report["trials"][1]["booted"] == 2 and len(report["trials"][1]["runs"]) == 2
    assert report["conclusion"]["culprit_toggles"] == ["safe-backend"]
    assert "safe-backend made it boot" in report["stopped"]
    assert (tmp_path / "runs" / "trial-02" / "run-2" / "report.json").is_file()
    assert len(boots(marker)) == 6
    assert_clean_between_trials(marker)


def test_a_flaky_hang_with_weak_evidence_is_inconclusive(tmp_path: Path) -> None:
    sys.path.insert(0, str(PROGRAMS))
    from flaky_boot import outcome

    port, counter, matrix = free_port(), tmp_path / "counter", tmp_path / "m.toml"
    matrix.write_text('[[toggle]]\nname = "calmer"\nreplace = { "--hang-fraction" = "0.3" }\n')
    seed = next(
        s
        for s in range(1000)
        if [outcome(s, n, 0.5) for n in range(3)].count(True) == 2
        and [outcome(s, n, 0.3) for n in range(3, 6)].count(True) == 1
    )  # fmt: skip — 1 of 3 boots without the change, 2 of 3 with it
    program = [sys.executable, str(PROGRAMS / "flaky_boot.py"), "--port", str(port), "--counter", str(counter),
               "--seed", str(seed), "--hang-fraction", "0.5"]  # fmt: skip
    done = run(isolate_argv(tmp_path, port, "--matrix", str(matrix), "--repeat", "3",
                            "--run-dir", str(tmp_path / "runs"), program=program))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((tmp_path / "isolate.json").read_text())
    assert report["baseline"]["booted"] == 1 and len(report["baseline"]["runs"]) == 3
    assert report["trials"][0]["booted"] == 2
    c = report["conclusion"]
    assert c["culprit_toggles"] == [] and c["confidence"] == "none"
    assert c["summary"].startswith("inconclusive: 2 of 3 booted with it, 1 of 3 without")
    assert c["runs_to_settle"] is not None and "runs each would settle it" in c["summary"]
    assert "2 of 3 booted (stalled)" in done.stdout


def test_ctrl_c_stops_cleanly_and_resume_skips_finished_trials(tmp_path: Path) -> None:
    port, marker, matrix, runs = free_port(), tmp_path / "marker", tmp_path / "m.toml", tmp_path / "runs"
    matrix.write_text(MATRIX)
    argv = isolate_argv(tmp_path, port, "--matrix", str(matrix), "--all", "--run-dir", str(runs),
                        program=flag_program(port, marker))  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        # The baseline ran to its verdict, and trial 1 (the second boot) is under way: interrupt it.
        wait_until(lambda: marker.exists() and len(boots(marker)) >= 2, timeout=60, interval=0.1)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 130, out + err
    report = json.loads((tmp_path / "isolate.json").read_text())
    assert report["interrupted"] is True and report["stopped"] == "interrupted"
    assert report["baseline"]["verdict"]["state"] == "stalled"
    assert all(proc_ended(pid) for pid in all_pids(marker)), "the interrupted trial's tree was left behind"
    state = json.loads((runs / "isolate-state.json").read_text())
    assert list(state["runs"]) and all(k.startswith("baseline") for k in state["runs"])

    # The summary says how to continue; the options are kept in the state (issue 24: --resume forgot
    # --stall-after, --ready-url and --all, and a trial that booted in 1 s came out "0 of 2 booted").
    assert f"continue with: hangwatch isolate --resume {runs}" in out
    # A different --stall-after is refused at once, with both values and what to do.
    refused = run(
        [sys.executable, "-m", "hangwatch", "isolate", "--resume", str(runs), "--stall-after", "60"]
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--stall-after 60 given, but that isolate ran with --stall-after 3" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and len(boots(marker)) == 2
    resumed = run(
        [
            sys.executable,
            "-m",
            "hangwatch",
            "isolate",
            "--resume",
            str(runs),
            "--no-doctor",
            "--report-json",
            str(tmp_path / "resumed.json"),
        ]
    )  # fmt: skip — no command and no options: the ones kept in the run directory
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    report = json.loads((tmp_path / "resumed.json").read_text())
    assert len(report["trials"]) == 5 and report["interrupted"] is False
    # Progress numbers the trials as the table and the run directories do (trial 0 is the baseline).
    assert "trial 0 (baseline): 1 run(s) reused from --resume" in resumed.stderr
    assert "trial 5 of 5 (" in resumed.stderr and "trial 6 of" not in resumed.stderr
    assert report["baseline"]["verdict"]["state"] == "stalled"
    # The baseline was not run again: 2 boots before the interruption, 5 trials after it.
    assert len(boots(marker)) == 2 + 5
    assert sum(1 for b in boots(marker) if b["args"][-4:] == ["--spec", "on", "--graphs", "on"]) == 2
    assert_clean_between_trials(marker)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[toggle]]\nname = "a"\nremove = ["--x"]\nflavour = "b"\n', "unknown key(s) flavour"),
        ('[[toggle]]\nname = "a"\n', "no edits"),
        ("<html>not toml</html>\n", "not valid TOML"),
    ],
)
def test_a_bad_matrix_file_exits_2_with_what_to_fix(tmp_path: Path, text: str, says: str) -> None:
    matrix = tmp_path / "m.toml"
    matrix.write_text(text)
    done = run([sys.executable, "-m", "hangwatch", "isolate", "--matrix", str(matrix), "--run-dir",
                str(tmp_path / "runs"), "--", "true"], timeout=30)  # fmt: skip
    assert done.returncode == 2
    assert says in done.stderr and "[[toggle]]" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_no_changes_to_try_is_a_usage_error(tmp_path: Path) -> None:
    done = run([sys.executable, "-m", "hangwatch", "isolate", "--run-dir", str(tmp_path / "r"), "--", "true"],
               timeout=30)  # fmt: skip
    assert done.returncode == 2 and "--matrix FILE" in done.stderr


def test_pairs_find_two_changes_that_are_needed_together(tmp_path: Path) -> None:
    port, marker, matrix = free_port(), tmp_path / "marker", tmp_path / "m.toml"
    matrix.write_text(
        '[[toggle]]\nname = "lenient"\nremove = ["--strict"]\n'
        '[[toggle]]\nname = "no-spec"\nremove = ["--spec"]\n'
    )
    # --strict crashes it; without --strict it deadlocks (spec and graphs on): only both changes boot it.
    done = run(isolate_argv(tmp_path, port, "--matrix", str(matrix), "--pairs", "--run-dir", str(tmp_path / "r"),
                            program=flag_program(port, marker, "--strict")))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "isolate.json").read_text())
    assert report["baseline"]["verdict"]["state"] == "crashed"
    assert {t["name"]: t["verdict"]["state"] for t in report["trials"]} == {
        "lenient": "stalled", "no-spec": "crashed", "lenient+no-spec": "ready",
    }  # fmt: skip
    assert report["conclusion"]["culprit_toggles"] == []
    assert report["conclusion"]["minimal_changes"] == ["lenient+no-spec"]
    assert "no single change" in report["conclusion"]["summary"]
    assert_clean_between_trials(marker)


def test_the_budget_stops_isolate_and_a_cut_run_does_not_count(tmp_path: Path) -> None:
    port, marker, matrix = free_port(), tmp_path / "marker", tmp_path / "m.toml"
    matrix.write_text(
        '[[toggle]]\nname = "slow-load"\nadd = ["--load-seconds", "90"]\n'
        '[[toggle]]\nname = "strict"\nadd = ["--strict"]\n'
    )
    started = time.monotonic()
    # The baseline stalls after about 4 s (7 s on a loaded machine); the next trial loads, healthy but
    # slowly, for longer than the whole budget: cut while it runs, not counted, whatever the load.
    done = run(isolate_argv(tmp_path, port, "--matrix", str(matrix), "--all", "--budget", "15",
                            "--run-dir", str(tmp_path / "r"), program=flag_program(port, marker)))  # fmt: skip
    assert time.monotonic() - started < 45
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((tmp_path / "isolate.json").read_text())
    assert report["stopped"] == "budget spent"
    assert report["baseline"]["verdict"]["state"] == "stalled"
    assert report["trials"] == [] and report["not_run"] == ["slow-load", "strict"]
    assert "cut short by --budget" in done.stderr
    assert_clean_between_trials(marker)
