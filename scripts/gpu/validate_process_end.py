"""When does a process that holds GPU memory end? Measured on a real GPU (CI has none).

hangwatch takes a process for ended when it is a zombie with no thread left (``procfs.Stat.exited``), not
when its main thread shows state Z: after SIGKILL the main thread ends first, and the last thread then
tears the address space down (and, on a GPU, the CUDA context). Until then waitpid cannot reap it and it
still holds its memory. This script measures that window where it is widest, on processes that hold GPU
memory, and checks the tear-down against it:

1. ``observe`` (x3): SIGKILL a process holding ``--gib`` GiB of GPU memory (torch, touched), with the
   threads torch and CUDA start; sample every 2 ms: when the main thread showed Z, when the last thread
   ended (num_threads 1), when waitpid reaped it, when NVML stopped listing its memory.
2. ``teardown`` (x3): the same process stopped by ``supervise.teardown.stop_tree`` (SIGTERM, whose default
   action ends it): when stop_tree returns, the process must be reaped (gone from /proc), and NVML is read
   at once and until the memory is released.

Writes $OUT/process_end.json (or ./process_end.json) and prints a summary; exit 1 if a check failed.

    PYTHONPATH=src python scripts/gpu/validate_process_end.py --gib 40
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.collect.nvml import NvmlGpuSource
from hangwatch.model.samples import ProcState
from hangwatch.supervise.launcher import Reaper
from hangwatch.supervise.teardown import stop_tree

HOLDER = """
import sys, threading, time, torch
gib = float(sys.argv[1])
x = torch.ones(int(gib * (1 << 30)) // 4, device="cuda")  # touched: the pages are really the process's
torch.cuda.synchronize()
for _ in range(3):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"""


def spawn(gib: float) -> tuple[int, int]:
    """The holder as a child of ours (posix_spawn: no subprocess bookkeeping reaps it behind our back);
    returns its pid and the read end of its stdout."""
    read_fd, write_fd = os.pipe()
    actions = [(os.POSIX_SPAWN_DUP2, write_fd, 1), (os.POSIX_SPAWN_CLOSE, read_fd)]
    pid = os.posix_spawn(
        sys.executable, [sys.executable, "-c", HOLDER, str(gib)], dict(os.environ), file_actions=actions
    )
    os.close(write_fd)
    return pid, read_fd


def await_ready(pid: int, read_fd: int, gpu: NvmlGpuSource, timeout: float = 120.0) -> int:
    """Until it printed "ready" and NVML lists its memory; returns the bytes NVML gives it."""
    deadline = time.monotonic() + timeout
    out = b""
    while b"ready" not in out:
        assert time.monotonic() < deadline, f"holder {pid} not ready: {out!r}"
        out += os.read(read_fd, 4096)
    while True:
        held = gpu.read().memory_of(frozenset({pid}))
        if held > 0:
            return held
        assert time.monotonic() < deadline, f"NVML never listed holder {pid}"
        time.sleep(0.05)


def observe(gib: float, gpu: NvmlGpuSource) -> dict[str, object]:
    pid, read_fd = spawn(gib)
    held = await_ready(pid, read_fd, gpu)
    before = procfs.read_stat(pid)
    assert before is not None, f"holder {pid} gone before SIGKILL"
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    marks: dict[str, float] = {}
    max_threads_while_z = 0
    gpu_released = None
    next_gpu = 0.0
    status = None
    while status is None or gpu_released is None:
        now = time.monotonic() - t0
        if now > 120:
            break
        if status is None:
            stat = procfs.read_stat(pid)
            if stat is not None and stat.state == ProcState.ZOMBIE:
                marks.setdefault("main_thread_z_s", now)
                max_threads_while_z = max(max_threads_while_z, stat.num_threads)
                if stat.exited:
                    marks.setdefault("exited_s", now)
            got, raw = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                marks["reaped_s"] = now
                status = raw
        if gpu_released is None and now >= next_gpu:
            next_gpu = now + 0.02  # an NVML read takes a few ms: not every 2 ms
            if gpu.read().memory_of(frozenset({pid})) == 0:
                gpu_released = now
        time.sleep(0.002)
    os.close(read_fd)
    return {
        "held_gib": round(held / (1 << 30), 1),
        "threads_before": before.num_threads,
        **{k: round(v, 3) for k, v in marks.items()},
        "max_threads_while_z": max_threads_while_z,
        "gpu_released_s": None if gpu_released is None else round(gpu_released, 3),
        "status": status,
    }


def teardown(gib: float, gpu: NvmlGpuSource) -> dict[str, object]:
    pid, read_fd = spawn(gib)
    await_ready(pid, read_fd, gpu)
    stat = procfs.read_stat(pid)
    assert stat is not None
    reaper = Reaper()
    t0 = time.monotonic()
    result = stop_tree({stat.identity}, None, reaper, grace_s=10.0, kill_wait_s=5.0)
    returned = time.monotonic() - t0
    in_proc = procfs.read_stat(pid)
    held_at_return = gpu.read().memory_of(frozenset({pid}))
    released = None
    while released is None and time.monotonic() - t0 < 60:
        if gpu.read().memory_of(frozenset({pid})) == 0:
            released = time.monotonic() - t0
        else:
            time.sleep(0.02)
    os.close(read_fd)
    return {
        "stop_tree_s": round(returned, 3),
        "cleanup": result.describe(),
        "status": reaper.status_of(pid),
        "in_proc_at_return": None if in_proc is None else f"{in_proc.state} threads {in_proc.num_threads}",
        "gpu_mib_at_return": held_at_return >> 20,
        "gpu_released_s": None if released is None else round(released, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=40.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    gpu = NvmlGpuSource()
    if gpu.unavailable:
        print(f"no GPU: {gpu.unavailable}")
        return 2
    results: dict[str, list[dict[str, object]]] = {"observe": [], "teardown": []}
    failures: list[str] = []
    for n in range(a.rounds):
        o = observe(a.gib, gpu)
        results["observe"].append(o)
        print(f"observe {n}: {o}", flush=True)
        if "reaped_s" in o and "exited_s" in o and o["reaped_s"] < o["exited_s"]:  # type: ignore[operator]
            failures.append(f"observe {n}: reaped before its last thread ended: {o}")
    for n in range(a.rounds):
        t = teardown(a.gib, gpu)
        results["teardown"].append(t)
        print(f"teardown {n}: {t}", flush=True)
        if t["in_proc_at_return"] is not None:
            failures.append(f"teardown {n}: still in /proc when stop_tree returned: {t}")
        if t["status"] != signal.SIGTERM:
            failures.append(f"teardown {n}: its status was not collected (SIGTERM = 15): {t}")
    gpu.close()
    out = Path(os.environ.get("OUT", ".")) / "process_end.json"
    out.write_text(json.dumps({"results": results, "failures": failures}, indent=1))
    print("FAILED:\n  " + "\n  ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
