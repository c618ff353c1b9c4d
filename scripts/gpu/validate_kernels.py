"""Validate issue 25's kernel naming on a real GPU and record the figures (CI has no GPU, nor cuda-gdb).

Checks, each with hangwatch as a user runs it:
  run torch-spin / cupy-spin / triton-spin (scripts/gpu/kernel_program.py), --stall-after 20:
      stalled, gpu-spin, the kernel named in the summary (``spin_kernel(long)<<<(1,1,1),(1,1,1)>>>``,
      ``wait_for_flag<<<...>>>``, ``wait_for_flag_kernel<<<(1,1,1),(128,1,1)>>>`` with Triton and its
      source), ``kernels:named`` in decided_by, the target running after cuda-gdb (state R/S), the pause
      said in the notes;
  run ipc-sync (gpu_waits.py, two ranks, rank 1 never arrives): gpu-spin, culprit rank 1, rank 0's
      ``flag_barrier`` named, rank 1's GPU running none;
  run gemm (60 s of bf16 GEMMs, silent): ready, never stalled, no kernels read;
  attach --kernel-names to a torch-spin process hangwatch did not start: the kernel named, the process
      still running after hangwatch has gone;
  stacks --kernel-names on the same: a ``kernels:`` block naming it;
  the reader's deadline cut short mid-attach (6 s, the attach takes 10-13 s): timeout said, the target not
      left stopped.
Writes $OUT/kernels_validation.json.

    HANGWATCH_PY_SPY=$PWD/.gpu-tools/py-spy PYTHONPATH=src python3 scripts/gpu/validate_kernels.py --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))

from validate_stacks import ENV  # noqa: E402

from hangwatch.collect.cudagdb import KernelReader  # noqa: E402

KERNELS = HERE / "kernel_program.py"
WAITS = HERE / "gpu_waits.py"
SPIN_NAMES = {
    "torch-spin": "spin_kernel(long)<<<(1,1,1),(1,1,1)>>>",
    "cupy-spin": "wait_for_flag<<<(1,1,1),(1,1,1)>>>",
    "triton-spin": "wait_for_flag_kernel<<<(1,1,1),(128,1,1)>>>",
}


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def hangwatch(args: list[str], timeout: float = 200) -> tuple[dict[str, Any], str, float]:
    report = Path(tempfile.mkdtemp()) / "report.json"
    argv = [sys.executable, "-m", "hangwatch", *args[:1], "--report-json", str(report), *args[1:]]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=ENV, check=False)
    wall = time.monotonic() - started
    out = proc.stdout + proc.stderr
    print(f"--- {' '.join(args[:3])}: rc {proc.returncode} in {wall:.1f} s\n{out[-3000:]}", flush=True)
    data: dict[str, Any] = json.loads(report.read_text()) if report.exists() else {}
    data["_rc"] = proc.returncode
    return data, out, round(wall, 1)


def start(argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, start_new_session=True
    )
    assert proc.stdout is not None
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if "LAUNCHED" in line or not line:
            break
    time.sleep(3)
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def check(results: dict[str, Any], name: str, ok: bool, detail: Any) -> None:
    results["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
    print(("PASS " if ok else "FAIL ") + name + f": {detail}", flush=True)


def verdict_facts(data: dict[str, Any]) -> dict[str, Any]:
    v = data.get("verdict") or {}
    kernels = data.get("kernels") or {}
    return {
        "state": v.get("state"),
        "cause": v.get("cause"),
        "summary": v.get("summary"),
        "culprits": v.get("culprits"),
        "decided_by": v.get("decided_by"),
        "evidence": [e for e in v.get("evidence", []) if "GPU runs" in e or "odd one" in e],
        "notes": [n for n in data.get("notes", []) if n.startswith("kernels") or "cuda-gdb" in n],
        "captures": [
            {k: c.get(k) for k in ("pid", "outcome", "paused_s", "state_after", "resumed", "detail")}
            | {
                "kernels": [
                    f"{x['name']} grid {x['grid']} block {x['block']} sms {x['sms']}" for x in c["kernels"]
                ]
            }
            for c in kernels.get("captures", [])
        ],
        "rc": data.get("_rc"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    results: dict[str, Any] = {"checks": [], "cases": {}}
    out_file = args.out / "kernels_validation.json"

    def want(name: str) -> bool:
        return not args.only or name in args.only

    run = ["run", "--no-doctor", "--stall-after", "20", "--timeout", "150", "--"]
    for case, launch in SPIN_NAMES.items():
        if not want(case):
            continue
        data, text, wall = hangwatch([*run, sys.executable, str(KERNELS), case])
        f = verdict_facts(data) | {"wall_s": wall}
        results["cases"][case] = f
        check(
            results,
            f"{case}: stalled gpu-spin",
            (f["state"], f["cause"]) == ("stalled", "gpu-spin"),
            f["summary"],
        )
        check(results, f"{case}: kernel named", launch in (f["summary"] or ""), f["evidence"])
        check(results, f"{case}: kernels:named", "kernels:named" in (f["decided_by"] or []), f["decided_by"])
        check(
            results,
            f"{case}: left running after cuda-gdb",
            any(c["outcome"] == "ok" and c["state_after"] in ("R", "S") for c in f["captures"]),
            f["captures"],
        )
        check(results, f"{case}: pause said", any("paused up to" in n for n in f["notes"]), f["notes"])
        if case == "triton-spin":
            check(
                results,
                "triton-spin: library and source",
                any("Triton, kernel_program.py" in e for e in f["evidence"]),
                f["evidence"],
            )
        out_file.write_text(json.dumps(results, indent=1))

    if want("ipc-sync"):
        data, text, wall = hangwatch(
            [*run, sys.executable, str(WAITS), "ipc", "--host-wait", "sync", "--absent", "wait"]
        )
        f = verdict_facts(data) | {"wall_s": wall}
        results["cases"]["ipc-sync"] = f
        ranks = {p["pid"]: p.get("rank") for p in data.get("processes", [])}
        check(
            results,
            "ipc-sync: gpu-spin, culprit rank 1",
            f["cause"] == "gpu-spin" and [ranks.get(c) for c in f["culprits"] or []] == ["1"],
            f["culprits"],
        )
        check(results, "ipc-sync: flag_barrier named", "flag_barrier" in (f["summary"] or ""), f["evidence"])
        out_file.write_text(json.dumps(results, indent=1))

    if want("gemm"):
        ready = ["--until-ready", "--ready-pattern", "GEMM DONE"]
        data, text, wall = hangwatch([run[0], *ready, *run[1:], sys.executable, str(KERNELS), "gemm", "60"])
        f = verdict_facts(data) | {"wall_s": wall}
        results["cases"]["gemm"] = f
        check(
            results,
            "gemm: ready, never stalled",
            f["state"] == "ready" and "] stalled" not in text,
            f["summary"],
        )
        check(
            results,
            "gemm: no kernels read",
            not f["captures"] and "cuda-gdb attaches" not in text,
            f["captures"],
        )
        out_file.write_text(json.dumps(results, indent=1))

    if want("attach"):
        proc = start([sys.executable, str(KERNELS), "torch-spin"])
        data, text, wall = hangwatch(
            ["attach", "--pid", str(proc.pid), "--window", "60", "--stall-after", "20", "--kernel-names"]
        )
        after = state(proc.pid)
        f = verdict_facts(data) | {"wall_s": wall, "state_after_hangwatch": after}
        results["cases"]["attach"] = f
        check(
            results,
            "attach --kernel-names: named",
            SPIN_NAMES["torch-spin"] in (f["summary"] or ""),
            f["summary"],
        )
        check(results, "attach: target still running", after in ("R", "S"), after)
        _sdata, stext, swall = hangwatch(["stacks", "--pid", str(proc.pid), "--kernel-names"])
        results["cases"]["stacks"] = {"text": stext[-2500:], "wall_s": swall, "state_after": state(proc.pid)}
        check(
            results,
            "stacks --kernel-names: kernels block",
            "kernels:" in stext and "spin_kernel(long)" in stext,
            stext[-600:],
        )
        check(results, "stacks: target still running", state(proc.pid) in ("R", "S"), state(proc.pid))
        reader = KernelReader(deadline_s=6.0)
        sample = reader.capture([proc.pid], 0.0)
        time.sleep(1.0)
        c = sample.captures[0]
        results["cases"]["deadline"] = {
            "outcome": c.outcome.value,
            "detail": c.detail,
            "state_after": c.state_after,
            "resumed": c.resumed,
            "state_1s_later": state(proc.pid),
        }
        check(
            results,
            "deadline: timeout said, target not stopped",
            c.outcome.value == "timeout" and state(proc.pid) in ("R", "S"),
            results["cases"]["deadline"],
        )
        stop(proc)
        out_file.write_text(json.dumps(results, indent=1))

    if want("concurrent"):
        # Two debuggers at once, on two processes of one GPU: the reader attaches to ranks in parallel.
        procs = [start([sys.executable, str(KERNELS), case]) for case in ("torch-spin", "cupy-spin")]
        sample = KernelReader().capture([p.pid for p in procs], 0.0)
        got = [(c.outcome.value, [k.launch for k in c.kernels], c.paused_s) for c in sample.captures]
        results["cases"]["concurrent"] = {"captures": got, "elapsed_s": sample.elapsed_s}
        check(results, "concurrent: both read", all(o == "ok" and ks for o, ks, _ in got), got)
        for p in procs:
            stop(p)
        out_file.write_text(json.dumps(results, indent=1))

    passed = sum(c["ok"] for c in results["checks"])
    print(f"{passed} of {len(results['checks'])} checks passed", flush=True)
    out_file.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
