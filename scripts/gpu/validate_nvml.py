"""Validate hangwatch's NVML path on a real GPU and print the figures (CI has no GPU).

Runs ``hangwatch run`` on gpu_program.py three ways and checks:
  1. alloc-then-ready: ready; per-GPU readings present; GPU memory attributed to the tree's process;
     after clean-up the memory is released (a note says so);
  2. alloc-then-hang: stalled, with GPU evidence (utilisation and flat memory) in the verdict;
  3. silent-growth: GPU memory moving with no log and little CPU is progress: never stalled.
Writes $OUT/nvml_validation.json (or ./nvml_validation.json) and prints a summary.

    PYTHONPATH=src python scripts/gpu/validate_nvml.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def hangwatch(mode: str, *options: str) -> dict:
    report = Path(tempfile.mkdtemp()) / "report.json"
    argv = [sys.executable, "-m", "hangwatch", "run", "--quiet", "--report-json", str(report), *options, "--"]
    argv += [sys.executable, str(HERE / "gpu_program.py"), mode]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-3000:])
    data = json.loads(report.read_text())
    data["_rc"] = proc.returncode
    return data


def gpu_facts(report: dict) -> dict:
    per_pid: dict[int, int] = {}
    readings = []
    for tick in report["timeline"]:
        gpu = tick.get("gpu") or {}
        for p in gpu.get("processes", []):
            per_pid[p["pid"]] = max(per_pid.get(p["pid"], 0), p["used_bytes"] or 0)
        for g in gpu.get("gpus", []):
            readings.append(g)
    tree = {p["pid"] for p in report["processes"]}
    return {
        "unavailable": next(
            ((t.get("gpu") or {}).get("unavailable") for t in report["timeline"] if t.get("gpu")), None
        ),
        "max_gpu_mem_of_tree_bytes": sum(v for k, v in per_pid.items() if k in tree),
        "util_range": [
            min((g["util_pct"] for g in readings), default=None),
            max((g["util_pct"] for g in readings), default=None),
        ],
        "power_range_w": [
            min((g["power_w"] for g in readings), default=None),
            max((g["power_w"] for g in readings), default=None),
        ],
        "sm_clock_mhz": readings[-1]["sm_clock_mhz"] if readings else None,
        "name": readings[-1]["name"] if readings else None,
    }


def main() -> int:
    results = {}
    ready = hangwatch(
        "alloc-then-ready", "--until-ready", "--ready-pattern", "ALLOCATED", "--stall-after", "30"
    )
    results["alloc_then_ready"] = {
        "verdict": ready["verdict"]["state"],
        "notes": ready["notes"],
        **gpu_facts(ready),
    }
    hang = hangwatch("alloc-then-hang", "--until-ready", "--stall-after", "10")
    results["alloc_then_hang"] = {
        "verdict": hang["verdict"]["state"],
        "cause": hang["verdict"]["cause"],
        "evidence": hang["verdict"]["evidence"],
        "notes": hang["notes"],
        **gpu_facts(hang),
    }
    grow = hangwatch("silent-growth", "--until-ready", "--ready-pattern", "GREW", "--stall-after", "6")
    results["silent_growth"] = {
        "verdict": grow["verdict"]["state"],
        "notes": grow["notes"],
        **gpu_facts(grow),
    }
    checks = {
        "ready": results["alloc_then_ready"]["verdict"] == "ready",
        "tree memory attributed (>= 4 GiB)": results["alloc_then_ready"]["max_gpu_mem_of_tree_bytes"]
        >= 4 * 2**30,
        "released after clean-up": any("released" in n for n in results["alloc_then_ready"]["notes"]),
        "hang stalled with GPU evidence": results["alloc_then_hang"]["verdict"] == "stalled"
        and any(e.startswith("GPU 0") for e in results["alloc_then_hang"]["evidence"]),
        "silent GPU-memory growth not stalled": results["silent_growth"]["verdict"] == "ready",
    }
    results["checks"] = checks
    out = Path(os.environ.get("OUT", ".")) / "nvml_validation.json"
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
