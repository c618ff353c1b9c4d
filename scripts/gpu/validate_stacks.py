"""Validate hangwatch's stacks and GPU-spin rules on a real GPU and record the figures (CI has no GPU).

Runs ``hangwatch run`` (stacks on, NVML and GPM on) over stack_program.py in four shapes and checks:
  1. spin:          a kernel spinning on a flag never set -> stalled, cause gpu-spin, the culprit's
                    native frames inside a CUDA synchronize, the GPU judged "spinning";
  2. stream-wait:   a stream waiting on a value never written (GPU idle) -> stalled, gpu-spin, "idle";
  3. graph-capture: a real CUDA graph capture that keeps progressing, silently -> ready, never stalled;
  4. matmul:        a silent compute-bound loop, host in synchronize -> ready, never stalled.
It also records NVML readings of the tree (utilisation, memory utilisation, power, per-process memory),
the GPM metrics hangwatch measured between its stack captures, the dump timings, and raw py-spy JSON of
the two hang shapes (fixtures for tests/fixtures/stacks/). Everything goes to $OUT (or ./):
stacks_validation.json, fixture_gpu_spin.json, fixture_stream_wait.json.

    # py-spy is not in the GPU image: carry the binary (py-spy's wheel ships it) and point at it
    HANGWATCH_PY_SPY=$PWD/.gpu-tools/py-spy PYTHONPATH=src python3 scripts/gpu/validate_stacks.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "src"))

from hangwatch.collect.stacks import find_py_spy  # noqa: E402

CASES = ("spin", "stream-wait", "graph-capture", "matmul")
CUDA_SYNC = re.compile(r"cudaDeviceSynchronize|cuCtxSynchronize|cudaStreamSynchronize|cuStreamSynchronize")
ENV = {
    **os.environ,
    "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
    "PYTHONUNBUFFERED": "1",
    # This workplace's rule for its GPU hosts (KINDS.md): no NVLink multicast, even if unused here.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def hangwatch(
    mode: str,
    options: list[str],
    program_args: list[str],
    timeout: float = 240,
    program: Path = HERE / "stack_program.py",
) -> dict[str, Any]:
    report = Path(tempfile.mkdtemp()) / "report.json"
    argv = [sys.executable, "-m", "hangwatch", "run", "--quiet", "--report-json", str(report), *options, "--"]
    argv += [sys.executable, str(program), mode, *program_args]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=ENV, check=False)
    wall = time.monotonic() - started
    print(f"--- {mode}: rc {proc.returncode} in {wall:.1f} s")
    print(proc.stdout[-4000:])
    if proc.returncode not in (0, 3, 4, 5):
        print(proc.stderr[-3000:])
    data: dict[str, Any] = json.loads(report.read_text()) if report.exists() else {}
    data["_rc"] = proc.returncode
    data["_wall_s"] = round(wall, 1)
    return data


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """What the report says about the GPU, the stacks and the verdict."""
    if not report.get("verdict"):
        return {"error": "no report", "rc": report.get("_rc")}
    v = report["verdict"]
    tree = {p["pid"] for p in report["processes"]}
    readings = [g for t in report["timeline"] if t.get("gpu") for g in t["gpu"].get("gpus", [])]
    mem_by_pid: dict[int, int] = {}
    for t in report["timeline"]:
        for p in (t.get("gpu") or {}).get("processes", []):
            mem_by_pid[p["pid"]] = max(mem_by_pid.get(p["pid"], 0), p["used_bytes"] or 0)

    def span(key: str) -> list[float | None]:
        values = [g[key] for g in readings if g.get(key) is not None]
        return [min(values), max(values)] if values else [None, None]

    captures = []
    for s in report.get("stacks", []):
        captures.append(
            {
                "t": s["t"],
                "elapsed_s": s["elapsed_s"],
                "dumps": [
                    {
                        "pid": p["pid"],
                        "outcome": p["outcome"],
                        "native": p["native"],
                        "elapsed_s": p["elapsed_s"],
                    }
                    for p in s["processes"]
                ],
                "gpm": s.get("gpus", []),
                "gpm_unavailable": s.get("gpm_unavailable"),
            }
        )
    culprit_natives: list[str] = []
    for s in reversed(report.get("stacks", [])):
        for p in s["processes"]:
            if p["pid"] in v["culprits"] and p["native"]:
                for thread in p["threads"]:
                    culprit_natives += [f["name"] for f in thread["frames"] if f["native"]]
        if culprit_natives:
            break
    return {
        "state": v["state"],
        "cause": v["cause"],
        "confidence": v.get("confidence"),
        "summary": v["summary"][:400],
        "culprits": v["culprits"],
        "duration_s": report["duration_s"],
        "wall_s": report["_wall_s"],
        "gpu_name": readings[-1]["name"] if readings else None,
        "util_pct": span("util_pct"),
        "mem_util_pct": span("mem_util_pct"),
        "power_w": span("power_w"),
        "sm_clock_mhz": span("sm_clock_mhz"),
        "tree_gpu_memory_bytes_max": sum(v for k, v in mem_by_pid.items() if k in tree),
        "captures": captures,
        "culprit_native_frames": culprit_natives[-12:],
        "native_sync_frame": next((n for n in culprit_natives if CUDA_SYNC.search(n)), None),
        "stack_summary": (report.get("stack_tree") or {}).get("summary"),
        "notes": report.get("notes", []),
    }


def idle_baseline(seconds: float = 3.0) -> dict[str, Any]:
    """GPU 0 with nothing of ours on it: idle power differs between machines (docs/gpu-signals.md)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        powers = []
        for _ in range(int(seconds / 0.2)):
            powers.append(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000)
            time.sleep(0.2)
        gpm = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
        return {
            "gpu": name if isinstance(name, str) else name.decode(),
            "driver": driver if isinstance(driver, str) else driver.decode(),
            "power_limit_w": limit,
            "idle_power_w_median": sorted(powers)[len(powers) // 2],
            "gpm_supported": gpm,
        }
    except Exception as exc:
        return {"error": str(exc)}


def raw_fixture(mode: str, py_spy: str, out: Path) -> dict[str, Any]:
    """Run the shape alone and store raw py-spy JSON in tests/fixtures/stacks/capture.py's format."""
    ready = Path(tempfile.mkdtemp()) / "ready"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "stack_program.py"), mode, "--ready-file", str(ready)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3)  # inside the synchronize by now
        samples = []
        for i in range(2):
            if i:
                time.sleep(2)
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            dumps = {}
            for native in (True, False):
                argv = [py_spy, "dump", "--pid", str(proc.pid), "--json"] + (["--native"] if native else [])
                started = time.monotonic()
                run = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                    env={**ENV, "RUST_BACKTRACE": "0"},
                )
                entry: dict[str, Any] = {
                    "rc": run.returncode,
                    "elapsed_s": round(time.monotonic() - started, 3),
                }
                if run.returncode == 0:
                    entry["json"] = json.loads(run.stdout)
                else:
                    entry["stderr"] = run.stderr.strip()
                dumps["native" if native else "python"] = entry
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            samples.append(
                {
                    "t": round(3.0 + 2.0 * i, 2),
                    "processes": [
                        {
                            "pid": proc.pid,
                            "ppid": os.getpid(),
                            "name": "python",
                            "state": fields[0],
                            "cpu_s": round(cpu, 2),
                            "cmdline": ["python", "stack_program.py", mode],
                            "env": {},
                            "dumps": dumps,
                        }
                    ],
                }
            )
        write_fixture(
            out,
            mode,
            f"scripts/gpu/stack_program.py {mode}",
            [mode],
            proc.pid,
            "GPU validation machine",
            py_spy,
            samples,
        )
        return {"written": out.name, "state": samples[-1]["processes"][0]["state"]}
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def write_fixture(
    out: Path,
    shape: str,
    program: str,
    args: list[str],
    root_pid: int | None,
    machine: str,
    py_spy: str,
    samples: list[dict[str, Any]],
) -> None:
    """A raw capture in the format of tests/fixtures/stacks/capture.py, which the unit tests load."""
    fixture = {
        "scenario": f"gpu_{shape.replace('-', '_')}",
        "program": program,
        "args": args,
        "root_pid": root_pid,
        "captured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "py_spy": subprocess.run(
            [py_spy, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "samples": samples,
    }
    out.write_text(json.dumps(fixture, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--py-spy", help="path to the py-spy binary (default: $HANGWATCH_PY_SPY, then PATH)")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the progressing shapes run")
    parser.add_argument("--only", nargs="*", choices=CASES, help="run only these shapes (default: all)")
    args = parser.parse_args()
    if args.py_spy:
        ENV["HANGWATCH_PY_SPY"] = os.environ["HANGWATCH_PY_SPY"] = args.py_spy
    py_spy = find_py_spy()
    if py_spy is None:
        print(
            "py-spy not found: carry its binary and give --py-spy PATH (or HANGWATCH_PY_SPY)", file=sys.stderr
        )
        return 2
    ENV["HANGWATCH_PY_SPY"] = py_spy
    out_dir = Path(os.environ.get("OUT", "."))
    results: dict[str, Any] = {"baseline": idle_baseline(), "py_spy": py_spy}
    wanted = set(args.only or CASES)
    seconds = ["--seconds", str(args.seconds)]
    progress = ["--until-ready", "--ready-pattern", "^DONE$", "--stall-after", "10"]
    options = {
        "spin": (["--stall-after", "20"], []),
        "stream-wait": (["--stall-after", "20"], []),
        "graph-capture": (progress, seconds),
        "matmul": (progress, seconds),
    }
    for mode in CASES:
        if mode in wanted:
            results[mode.replace("-", "_")] = figures(hangwatch(mode, *options[mode]))
    results["fixtures"] = {
        name: raw_fixture(
            name, py_spy, out_dir / f"fixture_{'gpu_spin' if name == 'spin' else 'stream_wait'}.json"
        )
        for name in ("spin", "stream-wait")
        if name in wanted
    }
    spin, wait, graph, matmul = (
        results.get(k, {}) for k in ("spin", "stream_wait", "graph_capture", "matmul")
    )
    listed = [
        ("spin", "stalled, gpu-spin", (spin.get("state"), spin.get("cause")) == ("stalled", "gpu-spin")),
        ("spin", "native frames in a CUDA synchronize", spin.get("native_sync_frame") is not None),
        (
            "spin",
            "GPU judged spinning ('busy doing nothing')",
            "busy doing nothing" in spin.get("summary", ""),
        ),
        (
            "stream-wait",
            "stalled, gpu-spin",
            (wait.get("state"), wait.get("cause")) == ("stalled", "gpu-spin"),
        ),
        ("stream-wait", "GPU judged idle", "GPU is idle" in wait.get("summary", "")),
        ("graph-capture", "a capture that progresses: ready, never stalled", graph.get("state") == "ready"),
        ("matmul", "a silent compute-bound loop: ready, never stalled", matmul.get("state") == "ready"),
    ]
    checks = {f"{case}: {name}": ok for case, name, ok in listed if case in wanted}
    results["checks"] = checks
    results["thresholds"] = derive_thresholds(results)
    path = out_dir / "stacks_validation.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(
        json.dumps(
            {k: v for k, v in results.items() if k not in ("spin", "stream_wait", "graph_capture", "matmul")},
            indent=1,
        )
    )
    for name in ("spin", "stream_wait", "graph_capture", "matmul"):
        r = results.get(name, {})
        gpm = [g for c in r.get("captures", []) for g in c["gpm"]]
        print(
            f"{name:14} {r.get('state')}/{r.get('cause')} ({r.get('confidence')}) "
            f"after {r.get('duration_s')} s; "
            f"util {r.get('util_pct')} %, mem util {r.get('mem_util_pct')} %, power {r.get('power_w')} W; "
            f"GPM {gpm[-1] if gpm else 'none'}; sync frame {r.get('native_sync_frame')}"
        )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(f"wrote {path}")
    return 0 if all(checks.values()) else 1


def derive_thresholds(results: dict[str, Any]) -> dict[str, Any]:
    """The measured separation the rule's thresholds rely on (GPM pipes, memory utilisation, power)."""

    def gpm_of(name: str) -> list[dict[str, Any]]:
        return [g for c in results.get(name, {}).get("captures", []) for g in c["gpm"]]

    def pipes(g: dict[str, Any]) -> float:
        keys = ("tensor_util", "dram_bw_util", "integer_util", "fp32_util", "fp16_util")
        return max((g.get(k) or 0.0) for k in keys)

    spin, work = gpm_of("spin"), gpm_of("matmul")
    return {
        "spin_gpm_max_pipe_pct": max((pipes(g) for g in spin), default=None),
        "spin_gpm_graphics_pct": [g.get("graphics_util") for g in spin],
        "matmul_gpm_max_pipe_pct": min((pipes(g) for g in work), default=None),
        "spin_power_w": results.get("spin", {}).get("power_w"),
        "matmul_power_w": results.get("matmul", {}).get("power_w"),
        "spin_mem_util_pct": results.get("spin", {}).get("mem_util_pct"),
        "matmul_mem_util_pct": results.get("matmul", {}).get("mem_util_pct"),
        "rule": "GPM: graphics >= 90 % with every pipe < 5 % = spinning; else util >= 90 % with memory util "
        "< 10 % and power < 300 W = spinning (hangwatch.analyse.gpustate.gpu_state)",
    }


if __name__ == "__main__":
    sys.exit(main())
