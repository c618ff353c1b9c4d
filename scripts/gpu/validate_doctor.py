"""Validate doctor's NVML path and cleanup's GPU-memory verification on a machine with an NVIDIA GPU.

    PYTHONPATH=src python3 scripts/gpu/validate_doctor.py [--out DIR]

Needs: an NVIDIA driver, nvidia-ml-py, psutil, torch with CUDA (the interpreter running this),
nvcc for the module verdicts (skipped without), cuobjdump for the cross-check (skipped without).
Prints one line per figure; exits non-zero if a check that must hold does not.
Steps:
  1. full doctor against this interpreter, no --capability (capabilities from NVML): timings,
     module count, verdicts, cuobjdump agreement on torch's real libraries;
  2. the fast preflight: its time (budget 2 s);
  3. nvcc-built modules scanned with the capability NVML reports: verdicts as the test table says;
  4. a process tree holding GPU memory: doctor's gpu-processes check must see it; then
     hangwatch cleanup --pid: memory released per GPU, and how long it took.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import cuda_artefacts as ca  # noqa: E402
from hangwatch.collect.nvml import read_inventory  # noqa: E402
from hwrun import hangwatch_argv  # noqa: E402

failures: list[str] = []


def figure(name: str, value: object) -> None:
    print(f"FIGURE {name}: {value}", flush=True)


def must(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def run_doctor(out: Path, tag: str, *args: str) -> tuple[int, dict, float]:
    report = out / f"doctor-{tag}.json"
    started = time.monotonic()
    proc = subprocess.run(
        hangwatch_argv("doctor", "--report-json", str(report), *args),
        capture_output=True,
        text=True,
        timeout=560,
        check=False,
    )
    elapsed = time.monotonic() - started
    (out / f"doctor-{tag}.txt").write_text(proc.stdout + proc.stderr)
    print(proc.stdout[-6000:], proc.stderr[-2000:], flush=True)
    return proc.returncode, (json.loads(report.read_text()) if report.exists() else {}), elapsed


HOLDER = r"""
import mmap, os, sys, time, torch
fd = os.open("/dev/shm/hw-gpu-validate", os.O_CREAT | os.O_RDWR, 0o600); os.ftruncate(fd, 1 << 24)
mm = mmap.mmap(fd, 1 << 24); mm.write(b"x" * (1 << 24))
pid = os.fork()
if pid == 0:
    x = torch.empty(int(sys.argv[2]) << 30, dtype=torch.uint8, device="cuda")
    x.fill_(1); torch.cuda.synchronize()
    open(sys.argv[1], "w").write(str(os.getpid()))
    while True: time.sleep(3600)
while True: time.sleep(3600)
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/hw-validate")))
    ap.add_argument("--gib", type=int, default=8, help="GPU memory the test tree allocates")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    inv = read_inventory()
    figure(
        "nvml",
        "unavailable: " + inv.unavailable
        if inv.unavailable
        else f"driver {inv.driver_version}, CUDA {inv.cuda_driver_version}, "
        + ", ".join(f"GPU {g.index} {g.name} cc {g.capability} nvlinks {g.nvlinks}" for g in inv.gpus),
    )
    must(
        inv.unavailable is None and bool(inv.gpus) and all(g.capability for g in inv.gpus),
        "NVML inventory with capabilities",
    )
    cap = inv.gpus[0].capability if inv.gpus else None

    _rc, data, elapsed = run_doctor(a.out, "full", "--python", sys.executable)
    figure("doctor_full_wall_s", f"{elapsed:.2f}")
    figure("doctor_full_timings", data.get("timings"))
    figure("doctor_capabilities", data.get("capabilities"))
    mods = data.get("modules", [])
    figure(
        "doctor_modules",
        f"{len(mods)} with GPU code; verdicts "
        + json.dumps({v: sum(m["verdict"] == v for m in mods) for v in ("native", "jit", "none")}),
    )
    for m in mods[:12]:
        print(f"   {m['verdict']:<6} {' '.join(m['sass'] + m['ptx'])[:60]:<60} {m['path']}")
    statuses = {c["name"]: c["status"] for c in data.get("checks", [])}
    figure("doctor_checks", statuses)
    must(data.get("capabilities") == [f"{cap[0]}.{cap[1]}"] if cap else False, "capability taken from NVML")
    must(statuses.get("torch-architectures") == "pass", "torch has SASS for this GPU")
    must(statuses.get("versions") == "pass", "driver vs torch CUDA")
    cross = next((c for c in data.get("checks", []) if c["name"] == "fatbin-crosscheck"), None)
    figure("cuobjdump_crosscheck", cross)
    if cross is not None:
        must(cross["status"] == "pass", "cuobjdump agrees with the fatbin reader on real libraries")

    started = time.monotonic()
    _rc, fast, elapsed = run_doctor(
        a.out, "fast", "--fast", "--", sys.executable, "-m", "vllm.entrypoints.openai.api_server"
    )
    figure("doctor_fast_wall_s", f"{elapsed:.2f} (in-process {fast.get('timings')})")
    must(fast.get("timings", {}).get("total_s", 99) < 2.0, "fast preflight under 2 s")

    nvcc = ca.find_nvcc()
    if nvcc and cap:
        built = ca.build_all(nvcc)
        _rc, data, _elapsed = run_doctor(
            a.out, "modules", "--python", sys.executable, "--scan", str(built), "--no-cross-check"
        )
        got = {
            Path(m["path"]).stem: m["verdict"]
            for m in data.get("modules", [])
            if Path(m["path"]).parent == built
        }
        column = {(9, 0): 0, (10, 0): 1, (12, 0): 2}.get(cap)
        if column is not None:
            want = {n: v[column] for n, v in ca.VERDICTS.items()}
            must(got == want, f"nvcc-built module verdicts for the real GPU ({cap}): {got}")
        figure("module_verdicts_on_real_gpu", got)

    ready = a.out / "holder.ready"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ready), str(a.gib)], start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline and holder.poll() is None:
            time.sleep(0.2)
        must(ready.exists(), "test tree allocated GPU memory")
        _rc, data, _ = run_doctor(a.out, "busy", "--fast")
        gp = next((c for c in data.get("checks", []) if c["name"] == "gpu-processes"), {})
        figure("gpu_processes_while_busy", gp)
        must(gp.get("status") in ("warn", "fail"), "doctor sees the process holding GPU memory")
        started = time.monotonic()
        proc = subprocess.run(
            hangwatch_argv("cleanup", "--pid", str(holder.pid), "--grace", "5"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        figure("cleanup_wall_s", f"{time.monotonic() - started:.2f}")
        print(proc.stdout, proc.stderr)
        (a.out / "cleanup.txt").write_text(proc.stdout + proc.stderr)
        must(proc.returncode == 0, f"cleanup exit code 0 (got {proc.returncode})")
        must(
            "tree memory" in proc.stdout and "-> 0 MiB" in proc.stdout,
            "GPU memory of the tree released (NVML)",
        )
        must("hw-gpu-validate: removed" in proc.stdout, "shm segment of the tree removed")
    finally:
        holder.kill()
        holder.wait()
        Path("/dev/shm/hw-gpu-validate").unlink(missing_ok=True)
    print("RESULT:", "all held" if not failures else f"{len(failures)} failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
