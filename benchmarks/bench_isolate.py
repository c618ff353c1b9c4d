"""The overhead ``hangwatch isolate`` adds between trials: clean-up of one trial and the start of the next.

    python benchmarks/bench_isolate.py [--trials N]

Runs ``hangwatch isolate --all`` on ``tests/programs/flag_hang.py`` twice: once with every trial
crashing at once (``--strict``: a traceback 0.2 s in), once with every trial booting (a live server that
clean-up must stop). A trial's overhead is its wall time outside the program's own time to a verdict:
the wait for the port, the launch, the tear-down (SIGTERM, reaping, GPU memory and /dev/shm checks),
writing its reports. It is given two ways: as isolate measures each run (``overheads_s`` in the JSON),
and from the outside (isolate's whole wall time, Python's start-up included, less the sum of the
trials' times to a verdict, per trial). Goal: under 2 s per trial.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "programs" / "flag_hang.py"
GOAL_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scenario(name: str, toggle: str, trials: int, tmp: Path) -> dict[str, Any]:
    port = free_port()
    matrix = tmp / f"{name}.toml"
    matrix.write_text(
        "".join(f'[[toggle]]\nname = "t{k}"\n{toggle}env = {{ BENCH_K = "{k}" }}\n' for k in range(trials))
    )
    report = tmp / f"{name}.json"
    argv = [
        sys.executable, "-m", "hangwatch", "isolate", "--matrix", str(matrix), "--all", "--no-doctor",
        "--stall-after", "5", "--grace", "5", "--ready-url", f"http://127.0.0.1:{port}/health",
        "--run-dir", str(tmp / name), "--report-json", str(report), "--quiet",
        "--", sys.executable, str(PROGRAM), "--port", str(port), "--strict",
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(argv, check=False, capture_output=True)
    wall = time.monotonic() - started
    data = json.loads(report.read_text())
    runs = [data["baseline"], *data["trials"]]
    inside = [o for t in runs for o in t["overheads_s"]]
    durations = sum(d for t in runs for d in t["durations_s"])
    states = sorted({t["verdict"]["state"] for t in data["trials"]})
    return {
        "trials": len(runs),
        "states": ", ".join(states),
        "median": statistics.median(inside),
        "max": max(inside),
        "outside": (wall - durations) / len(runs),
        "wall": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=8, help="toggles per scenario (plus the baseline)")
    args = ap.parse_args()
    n = args.trials + 1
    print(f"hangwatch isolate: overhead between trials, {n} trials per scenario (goal < {GOAL_S:g} s)")
    print(f"{'scenario':<34} {'trials':>6} {'median':>8} {'max':>8} {'outside, per trial':>19} {'wall':>7}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, toggle, label in (
            ("crash", "", "every trial crashes (0.2 s in)"),
            (
                "boot",
                'remove = ["--strict"]\nreplace = { "--graphs" = "off" }\n',
                "every trial boots (live server)",
            ),
        ):
            r = scenario(name, toggle, args.trials, Path(tmp))
            worst = max(worst, float(r["max"]), float(r["outside"]))
            print(
                f"{label:<34} {r['trials']:>6} {r['median']:>7.2f}s {r['max']:>7.2f}s {r['outside']:>18.2f}s "
                f"{r['wall']:>6.1f}s   ({r['states']})"
            )
    within = "within" if worst < GOAL_S else "OVER"
    print(f"worst per-trial overhead: {worst:.2f} s ({within} the {GOAL_S:g} s goal)")
    return 0 if worst < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
