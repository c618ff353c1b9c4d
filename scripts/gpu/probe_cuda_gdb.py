"""What cuda-gdb prints, and what it does to its target, on the GPU machine: raw material for
collect/cudagdb.py's reader (issue 25). Not a test: it writes what it saw.

For each case of kernel_program.py: start it, wait for its kernel, then
- ``plain``: ``cuda-gdb -p PID --batch -ex "info cuda kernels" -ex bt -ex detach``, timed, with the
  longest gap of the target's heartbeat (how long it was paused) and its state after;
- ``explore`` (spins only): more commands, to see what else names a kernel's module;
- ``killed`` (torch-spin only): cuda-gdb SIGKILLed 2 s into its start; the target's state for 3 s after;
- ``refused`` (torch-spin only): cuda-gdb as user nobody, which may not ptrace a root process.

python3 scripts/gpu/probe_cuda_gdb.py --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("torch-spin", "cupy-spin", "triton-spin", "gemm")
EXPLORE = [
    "set pagination off",
    "info cuda kernels",
    "info cuda devices",
    "bt",
    "info cuda contexts",
    "info cuda launch trace",
    "x/2i $pc",
    "info symbol $pc",
    "thread",
    "info threads",
    "detach",
]


def state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


def gpu_util() -> str:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=utilization.gpu,power.draw", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def longest_gap(path: Path, start: float, end: float) -> float:
    stamps = [float(x) for x in path.read_text().split() if x]
    inside = [t for t in stamps if start - 0.5 <= t <= end + 0.5]
    return max((b - a for a, b in itertools.pairwise(inside)), default=-1.0)


def cuda_gdb(pid: int, commands: list[str], timeout: float, prefix: list[str] | None = None) -> dict:
    argv = [*(prefix or []), CUDA_GDB, "-nx", "-p", str(pid), "--batch"]
    for c in commands:
        argv += ["-ex", c]
    t0 = time.time()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = "killed"
    t1 = time.time()
    return {
        "argv": argv,
        "rc": rc,
        "stdout": out,
        "stderr": err,
        "start": t0,
        "end": t1,
        "elapsed_s": round(t1 - t0, 3),
    }


def start(case: str, beat: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "kernel_program.py"), case, "600", "--heartbeat", str(beat)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if "LAUNCHED" in line or not line:
            break
    time.sleep(4)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    found = {
        "which": shutil.which("cuda-gdb"),
        "CUDA_HOME": os.environ.get("CUDA_HOME"),
        "usr_local": sorted(str(p) for p in Path("/usr/local").glob("cuda*/bin/cuda-gdb")),
    }
    version = subprocess.run([CUDA_GDB, "--version"], capture_output=True, text=True, check=False).stdout
    results: dict = {"found": found, "version": version, "cases": {}}
    for case in CASES:
        beat = args.out / f"beat-{case}.txt"
        proc = start(case, beat)
        rec: dict = {"pid": proc.pid, "state_before": state(proc.pid), "gpu_before": gpu_util()}
        runs = {"plain": ["info cuda kernels", "bt", "detach"]}
        if case != "gemm":
            runs["explore"] = EXPLORE
        for name, commands in runs.items():
            r = cuda_gdb(proc.pid, commands, timeout=90)
            time.sleep(0.5)
            r["state_after"] = state(proc.pid)
            r["paused_s"] = round(longest_gap(beat, r["start"], r["end"]), 3)
            r["gpu_after"] = gpu_util()
            rec[name] = r
        if case == "gemm":
            r = cuda_gdb(proc.pid, runs["plain"], timeout=90)
            r["state_after"] = state(proc.pid)
            r["paused_s"] = round(longest_gap(beat, r["start"], r["end"]), 3)
            rec["plain_again"] = r
        if case == "torch-spin":
            r = cuda_gdb(proc.pid, runs["plain"], timeout=2.0)
            states = []
            for _ in range(6):
                states.append(state(proc.pid))
                time.sleep(0.5)
            r["states_after"] = states
            if states[-1] in ("T", "t"):
                os.kill(proc.pid, signal.SIGCONT)  # our own child: undo what the killed debugger left
                time.sleep(0.3)
                r["after_sigcont"] = state(proc.pid)
            rec["killed"] = r
            nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
            r = cuda_gdb(proc.pid, runs["plain"], timeout=60, prefix=nobody)
            r["state_after"] = state(proc.pid)
            rec["refused"] = r
        rec["state_end"] = state(proc.pid)
        rec["gpu_end"] = gpu_util()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        results["cases"][case] = rec
        (args.out / "probe.json").write_text(json.dumps(results, indent=1))
        print(
            case,
            {
                k: (v.get("elapsed_s"), v.get("rc"), v.get("state_after"), v.get("paused_s"))
                for k, v in rec.items()
                if isinstance(v, dict)
            },
            flush=True,
        )
    for case, rec in results["cases"].items():
        print(
            f"===== {case} plain stdout\n{rec['plain']['stdout']}\n"
            f"--- stderr\n{rec['plain']['stderr'][-1500:]}"
        )


CUDA_GDB = shutil.which("cuda-gdb") or next(
    iter(sorted(Path("/usr/local").glob("cuda*/bin/cuda-gdb"))), "cuda-gdb"
)

if __name__ == "__main__":
    main()
