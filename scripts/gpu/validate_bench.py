"""Validate ``hangwatch bench --launch-a/--launch-b`` on a real GPU and print the figures (CI has no GPU).

1. Two launched "servers" that each hold 4 GiB of GPU memory (gpu_program.py serve: the OpenAI stub in a
   process that allocated with torch), plain and speculative: the benchmark runs, both are stopped, and
   each server's own report says its GPU memory was released, with the memory attributed to its tree
   while it ran; nothing of either tree is left.
2. A launched server that allocates 2 GiB and then hangs before listening: a stall verdict (exit 3) with
   GPU evidence, and its memory released.
Writes $OUT/bench_validation.json (or ./bench_validation.json) and prints a summary.

    PYTHONPATH=src python scripts/gpu/validate_bench.py
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench(run_dir: Path, *args: str, timeout: float = 300) -> tuple[int, str, dict | None, float]:
    report = run_dir / "bench.json"
    argv = [sys.executable, "-m", "hangwatch", "bench", "--quiet", "--run-dir", str(run_dir)]
    argv += ["--report-json", str(report), *args]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    print(proc.stdout[-2500:], proc.stderr[-2500:], sep="\n")
    data = json.loads(report.read_text()) if report.exists() else None
    return proc.returncode, proc.stderr, data, time.monotonic() - started


def server_report(run_dir: Path, label: str) -> dict:
    data: dict = json.loads((run_dir / f"server-{label}" / "report.json").read_text())
    return data


def tree_gpu_bytes(report: dict) -> int:
    """The most GPU memory the server's tree held at once, from its own timeline."""
    tree = {p["pid"] for p in report["processes"]}
    best = 0
    for tick in report["timeline"]:
        procs = (tick.get("gpu") or {}).get("processes", [])
        best = max(best, sum(p["used_bytes"] or 0 for p in procs if p["pid"] in tree))
    return best


def leftovers(report: dict) -> list[int]:
    alive = []
    for p in report["processes"]:
        try:
            os.kill(p["pid"], 0)
        except ProcessLookupError:
            continue
        cmdline = Path(f"/proc/{p['pid']}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        if "gpu_program.py" in cmdline:
            alive.append(p["pid"])
    return alive


def main() -> int:
    out = Path(os.environ.get("OUT", "."))
    results: dict[str, object] = {}
    ok = True

    run_dir = Path(tempfile.mkdtemp())
    pa, pb = free_port(), free_port()
    serve = [sys.executable, str(HERE / "gpu_program.py"), "serve"]
    launch_a = shlex.join([*serve, "--port", str(pa), "--ttft", "0.02", "--token-interval", "0.002"])
    launch_b = shlex.join(
        [*serve, "--port", str(pb), "--ttft", "0.02", "--token-interval", "0.002", "--spec-tokens", "3"]
    )
    rc, err, data, seconds = bench(
        run_dir, "--url", f"http://127.0.0.1:{pa}", "--compare", f"http://127.0.0.1:{pb}",
        "--launch-a", launch_a, "--launch-b", launch_b, "--rounds", "2", "--requests", "16",
        "--max-tokens", "32", "--boot-timeout", "240",
    )  # fmt: skip
    servers = {}
    for label in "AB":
        r = server_report(run_dir, label)
        servers[label] = {
            "verdict": r["verdict"]["state"],
            "max_gpu_bytes_of_tree": tree_gpu_bytes(r),
            "notes": [n for n in r["notes"] if "GPU" in n or "cleanup" in n],
            "left": leftovers(r),
            "run_json": (run_dir / f"server-{label}" / "run.json").exists(),
        }
        ok &= servers[label]["max_gpu_bytes_of_tree"] >= 4 * 2**30
        ok &= "GPU memory of the tree released" in r["notes"]
        ok &= not servers[label]["left"] and bool(servers[label]["run_json"])
    results["benchmark"] = {
        "rc": rc,
        "seconds": round(seconds, 1),
        "verdict": (data or {}).get("comparison", {}).get("verdict"),
        "tok_s": [s["output_tokens_per_s"] for s in (data or {}).get("servers", [])],
        "spec": [s["spec"] for s in (data or {}).get("servers", [])],
        "servers": servers,
    }
    ok &= rc == 0

    run_dir = Path(tempfile.mkdtemp())
    port = free_port()
    hang = shlex.join([sys.executable, str(HERE / "gpu_program.py"), "alloc-then-hang"])
    rc, err, _, seconds = bench(
        run_dir, "--url", f"http://127.0.0.1:{port}", "--launch-a", hang, "--stall-after", "10",
        "--boot-timeout", "240",
    )  # fmt: skip
    r = server_report(run_dir, "A")
    results["boot_hang"] = {
        "rc": rc,
        "seconds": round(seconds, 1),
        "verdict": r["verdict"]["state"],
        "cause": r["verdict"]["cause"],
        "evidence": r["verdict"]["evidence"],
        "max_gpu_bytes_of_tree": tree_gpu_bytes(r),
        "notes": [n for n in r["notes"] if "GPU" in n or "cleanup" in n],
        "left": leftovers(r),
        "stderr_tail": err[-400:],
    }
    ok &= rc == 3 and r["verdict"]["state"] == "stalled"
    ok &= "GPU memory of the tree released" in r["notes"] and not results["boot_hang"]["left"]  # type: ignore[index]

    (out / "bench_validation.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
