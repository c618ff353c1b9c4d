"""``--stall-after auto`` against fixed windows, on real boots under ``hangwatch run``.

    python benchmarks/bench_stall_auto.py [--quiet-spell S] [--fixed S]

The program is ``tests/programs/phase_boot.py``: vLLM's start-up lines, each phase a 1 s pause, except
``weights``, a silent wait of ``--quiet-spell`` seconds (no CPU, no output: a checkpoint fetched by
another process, a peer that comes late). Three healthy boots are recorded first, in a state folder of
the benchmark's own; then each scenario runs once with ``--stall-after auto`` and once with a fixed
window:

- a healthy boot with the long silent weights phase: a fixed window shorter than the spell kills it
  (a false stall); auto must not;
- a hang in ``model_loaded``, a phase whose spells are short: auto must call it no later than the
  default fixed window (60 s) does; the figure is the time from the phase's start to the verdict.
- a hang in ``weights``: auto waits for twice the usual spell plus its margin, the fixed window does not.

Prints one row per scenario and window, and the windows auto drew. No timed assertion: figures go in
docs/history.md with the date.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "programs" / "phase_boot.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def boot(tmp: Path, name: str, stall: str, spell: float, *extra: str) -> dict[str, Any]:
    report = tmp / f"{name}.json"
    argv = [
        sys.executable, "-m", "hangwatch", "run", "--until-ready", "--quiet", "--no-doctor",
        "--no-own-request", "--no-stacks", "--engine", "vllm", "--stall-after", stall,
        "--ready-pattern", "READY to serve",
        "--run-dir", str(tmp / name), "--report-json", str(report),
        "--", sys.executable, str(PROGRAM), "--pause", "1", "--pause-in", f"weights={spell:g}",
        "--port", str(free_port()), *extra,
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(argv, check=False, capture_output=True, env=os.environ | {"XDG_STATE_HOME": str(tmp)})
    data: dict[str, Any] = json.loads(report.read_text())
    data["wall"] = time.monotonic() - started
    return data


def since_phase(data: dict[str, Any], phase: str) -> float | None:
    """Seconds from the phase's start to the verdict (the end of the run)."""
    start = next((p["start"] for p in data["phases"] if p["name"] == phase), None)
    return None if start is None else data["duration_s"] - start


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiet-spell", type=float, default=35.0, help="the weights phase's silent wait (s)")
    ap.add_argument("--fixed", type=float, default=30.0, help="a fixed window shorter than the spell (s)")
    args = ap.parse_args()
    spell = args.quiet_spell
    print(f"--stall-after auto vs fixed windows: phase_boot.py, weights silent {spell:g} s, other phases 1 s")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for k in range(3):
            seeded = boot(tmp, f"seed{k}", "60", spell)
            print(f"  seed boot {k + 1}: {seeded['verdict']['state']} in {seeded['duration_s']:.1f} s")
        scenarios = (
            ("healthy, weights silent", (), "weights", ("auto", f"{args.fixed:g}", "60")),
            ("hang in model_loaded", ("--hang-in", "model_loaded"), "model_loaded", ("auto", "60")),
            ("hang in weights", ("--hang-in", "weights"), "weights", ("auto", "60")),
        )
        windows: list[dict[str, Any]] = []
        print(f"{'scenario':<26} {'window':>8} {'verdict':>9} {'phase start to verdict':>23} {'wall':>7}")
        for label, extra, phase, stalls in scenarios:
            for stall in stalls:
                data = boot(tmp, f"{phase}-{stall}-{len(extra)}", stall, spell, *extra)
                windows = data["stall_windows"] or windows
                took = since_phase(data, phase)
                shown = f"{took:.1f} s" if took is not None else "-"
                state = data["verdict"]["state"]
                print(f"{label:<26} {stall:>8} {state:>9} {shown:>23} {data['wall']:>6.1f}s")
        print(
            "windows auto drew (3 boots): " + ", ".join(f"{w['phase']} {w['window_s']:g} s" for w in windows)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
