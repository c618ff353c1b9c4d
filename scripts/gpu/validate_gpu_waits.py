"""Validate the GPU side of the behaviour rules on a real GPU and record the figures (CI has no GPU).

Runs ``hangwatch run`` (stacks, NVML and GPM on) over gpu_waits.py and checks:
  ipc-sync:   a CUDA-IPC flag barrier across two ranks, rank 1 never arrives (a Python wait), rank 0's
              host in CuPy's cudaDeviceSynchronize -> stalled, gpu-spin, culprit rank 1;
  ipc-poll:   the same, rank 0's host in a Python loop polling a CuPy event (no rule knows its frames)
              -> stalled, gpu-spin, culprit rank 1;
  ipc-sleep:  the same, the host polling with sleeps, rank 1 busy-spinning on the CPU instead
              -> stalled, gpu-spin, culprit rank 1;
  ipc-poll-unranked: ipc-poll with no RANK in either process (a producer and a consumer, not a group)
              -> stalled, gpu-spin, culprit the process that never arrives (the other one mapping the GPU);
  ipc-sync-logs: ipc-sync with rank 0 logging "still waiting (attempt N)" every 2 s from a thread
              -> stalled, gpu-spin, culprit rank 1 (a wait that logs is no progress);
  ipc-healthy: both ranks arrive, barriers and GEMMs for --seconds, silently -> ready, never stalled;
  ipc-healthy-logs: the same, each rank logging "step N" about once a second, its host parked in
              cudaDeviceSynchronize between -> ready, never stalled (a working GPU's heartbeat counts);
  compile:    torch.compile max-autotune into a fresh cache, silenced -> ready, never stalled;
  capture:    CUDA graph capture of a 16-layer decoder for 17 batch sizes, silently -> ready;
  gemm:       the long silent GEMM loop of stack_program.py -> ready, never stalled;
  side-gemm-poll: tensor-core GEMMs on a side stream, the host polling their completion event with 5 ms
              sleeps, --stall-after 20 -> ready, never stalled (GPU work is progress whatever the host does);
  gemm-blocked-launch: GEMMs launched back to back, the host blocked in the launch -> ready, never stalled;
  fma-poll / small-gemm-poll: compute that moves almost no memory (an FMA chain in registers; a CUDA graph
              of small GEMMs in L2), the host polling with 5 ms sleeps, --stall-after 20 -> ready, never
              stalled (GPM's pipes, read every tick, say it is work where NVML's memory utilisation cannot).
Writes $OUT/gpu_waits_validation.json and, for the hang shapes, raw py-spy fixtures of the whole tree
($OUT/fixture_gpu_ipc_*.json, the format of tests/fixtures/stacks/capture.py).

    HANGWATCH_PY_SPY=$PWD/.gpu-tools/py-spy PYTHONPATH=src python3 scripts/gpu/validate_gpu_waits.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "stacks"))
sys.path.insert(0, str(HERE))

from validate_stacks import ENV  # noqa: E402
from validate_stacks import figures  # noqa: E402
from validate_stacks import hangwatch  # noqa: E402
from validate_stacks import idle_baseline  # noqa: E402
from validate_stacks import write_fixture  # noqa: E402

from hangwatch.collect.stacks import find_py_spy  # noqa: E402

PROGRAM = HERE / "gpu_waits.py"
HANGS = {
    "ipc-sync": ["--host-wait", "sync", "--absent", "wait"],
    "ipc-poll": ["--host-wait", "poll", "--absent", "wait"],
    "ipc-sleep": ["--host-wait", "sleep", "--absent", "spin"],
    "ipc-sync-logs": ["--host-wait", "sync", "--absent", "wait", "--log"],
    # No RANK in either process: the wait-for edge is the GPU memory both map (NVML's contexts), not a group.
    "ipc-poll-unranked": ["--host-wait", "poll", "--absent", "wait", "--unranked"],
}
# GPU work whose host is in no synchronize (issue 23): progress from the GPU itself, never stalled.
GPU_WORK = {"side-gemm-poll": ["--host-wait", "poll"], "gemm-blocked-launch": ["--host-wait", "launch"]}
# Compute in registers or L2 (issue 23): NVML's memory utilisation under 10 %, GPM's pipes busy.
CACHE_WORK = {"fma-poll": ["--kind", "fma"], "small-gemm-poll": ["--kind", "small-gemm"]}
CASES = (*HANGS, "ipc-healthy", "ipc-healthy-logs", "compile", "capture", "gemm", *GPU_WORK, *CACHE_WORK)
PROGRESS = ["--until-ready", "--ready-pattern", "^DONE$", "--stall-after", "10"]


def run_case(name: str, seconds: float) -> dict[str, Any]:
    if name in HANGS:
        report = hangwatch("ipc", ["--stall-after", "20"], HANGS[name], program=PROGRAM)
    elif name in ("ipc-healthy", "ipc-healthy-logs"):
        logs = ["--log"] if name.endswith("-logs") else []
        report = hangwatch("ipc", PROGRESS, ["--arrive", "--seconds", str(seconds), *logs], program=PROGRAM)
    elif name in GPU_WORK:
        report = hangwatch(
            "gpu-work", [*PROGRESS[:-1], "20"], [*GPU_WORK[name], "--seconds", str(seconds)], program=PROGRAM
        )
    elif name in CACHE_WORK:
        report = hangwatch(
            "cache-work",
            [*PROGRESS[:-1], "20"],
            [*CACHE_WORK[name], "--seconds", str(seconds)],
            program=PROGRAM,
        )
    elif name in ("compile", "capture"):
        report = hangwatch(name, PROGRESS, ["--seconds", str(seconds)], timeout=600, program=PROGRAM)
    else:
        report = hangwatch("matmul", PROGRESS, ["--seconds", str(seconds)], program=HERE / "stack_program.py")
    found = figures(report)
    # A process's side of the barrier: its RANK, else its --rank argument (the unranked shape).
    ranks = {p["pid"]: p.get("rank") or _rank_arg(p.get("cmdline", ())) for p in report.get("processes", [])}
    found["culprit_ranks"] = [ranks.get(pid) for pid in found.get("culprits", [])]
    sm_by_rank: dict[str, list[float]] = {}
    for t in report.get("timeline", []):
        for p in (t.get("gpu") or {}).get("processes", []):
            if p.get("sm_util_pct") is not None:
                sm_by_rank.setdefault(str(ranks.get(p["pid"], p["pid"])), []).append(p["sm_util_pct"])
    found["sm_util_by_rank"] = {k: [min(v), max(v), round(sum(v) / len(v), 1)] for k, v in sm_by_rank.items()}
    # GPM's pipes as the loop read them every tick (empty on code that read GPM only at captures).
    pipes: dict[str, float] = {}
    for t in report.get("timeline", []):
        for a in (t.get("gpu") or {}).get("activity", []):
            for key in ("tensor_util", "fp32_util", "fp16_util", "integer_util", "dram_bw_util"):
                if a.get(key) is not None:
                    pipes[key] = max(pipes.get(key, 0.0), a[key])
    found["tick_pipes_max"] = pipes
    found["stalled_events"] = [e for e in report.get("events", []) if "stall" in json.dumps(e).lower()][:5]
    return found


def _rank_arg(cmdline: list[str] | tuple[str, ...]) -> str | None:
    args = list(cmdline)
    return args[args.index("--rank") + 1] if "--rank" in args[:-1] else None


def capture_fixture(name: str, py_spy: str, out: Path) -> dict[str, Any]:
    """The whole tree of a hang shape, dumped twice (native and Python), for the unit tests."""
    from capture import capture_round  # tests/fixtures/stacks/capture.py

    from proc_helpers import spawn
    from proc_helpers import tree_of
    from proc_helpers import wait_for_file

    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        argv = [sys.executable, str(PROGRAM), "ipc", *HANGS[name], "--ready-file", str(ready)]
        with spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV) as popen:
            wait_for_file(ready, 90, popen)
            started = time.monotonic()
            time.sleep(4)  # rank 0 inside its host wait, rank 1 parked
            pids = sorted(p.pid for p in tree_of(popen.pid))
            samples = [capture_round(py_spy, pids, time.monotonic() - started)]
            time.sleep(2)
            samples.append(capture_round(py_spy, pids, time.monotonic() - started))
    root = pids[0] if pids else None
    machine = "GPU validation machine (one H200)"
    write_fixture(
        out, name, "scripts/gpu/gpu_waits.py", ["ipc", *HANGS[name]], root, machine, py_spy, samples
    )
    return {"written": out.name, "processes": len(samples[0]["processes"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--py-spy", help="path to the py-spy binary (default: $HANGWATCH_PY_SPY, then PATH)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the progressing shapes run")
    parser.add_argument("--only", nargs="*", choices=CASES, help="run only these shapes (default: all)")
    parser.add_argument("--fixtures", action="store_true", help="also capture raw fixtures of the hangs")
    args = parser.parse_args()
    if args.py_spy:
        os.environ["HANGWATCH_PY_SPY"] = args.py_spy
    py_spy = find_py_spy()
    if py_spy is None:
        print(
            "py-spy not found: carry its binary and give --py-spy PATH (or HANGWATCH_PY_SPY)", file=sys.stderr
        )
        return 2
    ENV["HANGWATCH_PY_SPY"] = py_spy
    out_dir = Path(os.environ.get("OUT", "."))
    results: dict[str, Any] = {"baseline": idle_baseline(), "py_spy": py_spy, "cases": {}}
    checks: dict[str, bool] = {}
    for name in args.only or CASES:
        r = results["cases"][name] = run_case(name, args.seconds)
        if name in HANGS:
            checks[f"{name}: stalled, gpu-spin"] = (r.get("state"), r.get("cause")) == ("stalled", "gpu-spin")
            checks[f"{name}: culprit rank 1 (the one that never arrives)"] = r.get("culprit_ranks") == ["1"]
        else:
            checks[f"{name}: ready, never stalled"] = r.get("state") == "ready"
        print(
            f"{name:12} {r.get('state')}/{r.get('cause')} ({r.get('confidence')}) "
            f"culprits {r.get('culprit_ranks')} "
            f"after {r.get('duration_s')} s; util {r.get('util_pct')} %, mem util {r.get('mem_util_pct')} %, "
            f"power {r.get('power_w')} W; SM util by rank (min, max, mean) {r.get('sm_util_by_rank')}; "
            f"tick pipes max {r.get('tick_pipes_max')}",
            flush=True,
        )
    if args.fixtures:
        results["fixtures"] = {
            name: capture_fixture(name, py_spy, out_dir / f"fixture_gpu_{name.replace('-', '_')}.json")
            for name in HANGS
            if name in (args.only or CASES)
        }
    results["checks"] = checks
    path = out_dir / "gpu_waits_validation.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(f"wrote {path}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
