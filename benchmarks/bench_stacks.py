"""Stack capture and merge figures (issue 3, "Speed"): prints them, and writes JSON with ``--json FILE``.

1. Capture wall time of 2, 8 and 16 processes against the slowest single dump in the same round
   (target: at most the slowest + 0.5 s), Python-only and ``--native``.
2. Target pause: each target runs a ticker thread that sleeps 0.5 ms in a loop and records every gap
   longer than 2 ms with its monotonic time; a gap that overlaps a dump is the pause that dump caused
   (target: under 50 ms in blocking mode). The same targets' gaps outside dumps are the noise floor.
3. Merge and classify 10,000 rank stacks built from the real captured fixtures (each rank's py-spy JSON
   goes through the real parser; 1 % of ranks are elsewhere): target under 1 s.
4. The watch's per-tick cost of data flow (the spin veto's) with 10,000 processes in every tick and a
   spell of samples spanning 4 ticks: ``StackHistory.observe_tick``, which computes each interval's
   movers once, against recomputing ``data_flowing`` over the span on every tick.

    /tmp/probe-venv/bin/python benchmarks/bench_stacks.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.stacks import loader  # noqa: E402
from hangwatch.analyse.progress import data_flowing  # noqa: E402
from hangwatch.analyse.stackcontext import stack_context  # noqa: E402
from hangwatch.analyse.stackrules import classify  # noqa: E402
from hangwatch.analyse.stacktree import build_tree  # noqa: E402
from hangwatch.analyse.stackwatch import StackHistory  # noqa: E402
from hangwatch.collect import procfs  # noqa: E402
from hangwatch.collect.stacks import DumpRun  # noqa: E402
from hangwatch.collect.stacks import StackDumper  # noqa: E402
from hangwatch.collect.stacks import parse_dump  # noqa: E402
from hangwatch.collect.stacks import run_dumper  # noqa: E402
from hangwatch.engines import registry  # noqa: E402
from hangwatch.model.samples import ProcessSample  # noqa: E402
from hangwatch.model.samples import ProcState  # noqa: E402
from hangwatch.model.samples import Tick  # noqa: E402
from hangwatch.model.stacks import ProcessStacks  # noqa: E402
from hangwatch.model.stacks import StackSample  # noqa: E402

TARGET = r"""
import json, sys, threading, time

def ticker(gaps):
    last = time.monotonic()
    while True:
        time.sleep(0.0005)
        now = time.monotonic()
        if now - last > 0.002:
            gaps.append((last, now - last))
        last = now

def wait_here(event):
    event.wait()

gaps = []
threading.Thread(target=ticker, args=(gaps,), daemon=True, name="ticker").start()
threading.Thread(target=wait_here, args=(threading.Event(),), daemon=True, name="idle").start()
print("ready", flush=True)
for line in sys.stdin:
    print(json.dumps(gaps), flush=True)
"""


def start_targets(n: int) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return procs


def sample_of(pid: int) -> ProcessSample:
    stat = procfs.read_stat(pid)
    assert stat is not None
    return ProcessSample(
        pid, stat.ppid, "target", (), stat.state, stat.cpu_s, 0.0, 0, 0, 0, 3, 0, (), None, None
    )


class TimedRunner:
    """run_dumper, recording each dump's [start, end] in monotonic time (the clock the targets use)."""

    def __init__(self) -> None:
        self.windows: list[tuple[int, float, float]] = []
        self._lock = threading.Lock()

    def __call__(self, argv: list[str], deadline: float) -> DumpRun:
        pid = int(argv[argv.index("--pid") + 1])
        start = time.monotonic()
        run = run_dumper(argv, deadline)
        with self._lock:
            self.windows.append((pid, start, time.monotonic()))
        return run


def capture_figures(counts: list[int], rounds: int) -> dict[str, object]:
    out: dict[str, object] = {}
    all_pauses: list[float] = []
    noise: list[float] = []
    for n in counts:
        targets = start_targets(n)
        try:
            samples = [sample_of(p.pid) for p in targets]
            for native in (False, True):
                runner = TimedRunner()
                dumper = StackDumper(runner=runner, native=native, engine_caches=registry.cache_folders())
                walls, slowest = [], []
                for _ in range(rounds):
                    sample = dumper.capture(samples, 0.0, native=native)
                    assert all(p.outcome.value == "ok" for p in sample.processes), sample.processes
                    walls.append(sample.elapsed_s)
                    slowest.append(max(p.elapsed_s for p in sample.processes))
                    time.sleep(0.3)
                key = f"{n}_{'native' if native else 'python'}"
                out[key] = {
                    "processes": n,
                    "native": native,
                    "wall_s_median": round(statistics.median(walls), 3),
                    "wall_s_max": round(max(walls), 3),
                    "slowest_dump_s_median": round(statistics.median(slowest), 3),
                    "overhead_s_max": round(max(w - s for w, s in zip(walls, slowest, strict=True)), 3),
                }
                pauses, floor = pauses_of(targets, runner.windows)
                all_pauses += pauses
                noise += floor
                out[key]["pause_ms_median"] = round(statistics.median(pauses) * 1000, 1) if pauses else 0.0  # type: ignore[index]
                out[key]["pause_ms_max"] = round(max(pauses, default=0.0) * 1000, 1)  # type: ignore[index]
        finally:
            for p in targets:
                p.kill()
                p.wait()
    out["pause_ms_all_max"] = round(max(all_pauses, default=0.0) * 1000, 1)
    out["noise_gap_ms_p99_outside_dumps"] = (
        round(sorted(noise)[int(0.99 * (len(noise) - 1))] * 1000, 1) if noise else 0.0
    )
    return out


def pauses_of(
    targets: list[subprocess.Popen[str]], windows: list[tuple[int, float, float]]
) -> tuple[list[float], list[float]]:
    """Per dump: the longest ticker gap that overlaps its window (0 when none passed 2 ms)."""
    gaps: dict[int, list[tuple[float, float]]] = {}
    for p in targets:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write("report\n")
        p.stdin.flush()
        gaps[p.pid] = [tuple(g) for g in json.loads(p.stdout.readline())]  # type: ignore[misc]
    pauses = []
    used: set[tuple[int, float]] = set()
    for pid, start, end in windows:
        inside = [(s, g) for s, g in gaps.get(pid, []) if s < end and s + g > start]
        used.update((pid, s) for s, _ in inside)
        pauses.append(max((g for _, g in inside), default=0.0))
    floor = [g for pid, lst in gaps.items() for s, g in lst if (pid, s) not in used]
    return pauses, floor


def merge_figures(ranks: int, rounds: int) -> dict[str, object]:
    raw = loader.load("missing_collective")
    per_sample = []
    parse_s = 0.0
    for si in range(2):
        procs = raw["samples"][si]["processes"]
        in_reduce = [p for p in procs if p["name"] in ("gloo_rank0", "gloo_rank1")]
        elsewhere = next(p for p in procs if p["name"] == "gloo_rank2")
        started = time.perf_counter()
        out: list[ProcessStacks] = []
        for i in range(ranks):
            src = elsewhere if i % 100 == 42 else in_reduce[i % 2]
            text = json.dumps(src["dumps"]["native"]["json"])
            threads = parse_dump(text, loader.source_line)
            threads = tuple(
                replace(t, tid=1_000_000 + i if t.name == "MainThread" else 2_000_000 + i) for t in threads
            )
            out.append(
                ProcessStacks(1_000_000 + i, f"worker_rank{i}", "rank", str(i), _ok(), threads, "S", 1.0)
            )
        parse_s += time.perf_counter() - started
        per_sample.append(StackSample(float(si * 2), tuple(out), 0.0))
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        diagnosis = classify(stack_context(per_sample))
        tree = build_tree(per_sample, highlight=diagnosis.culprits)
        timings.append(time.perf_counter() - started)
    assert diagnosis.cause.value == "collective-wait" and len(diagnosis.culprits) == ranks // 100
    return {
        "ranks": ranks,
        "threads": tree.threads,
        "distinct_classes": len(tree.classes),
        "culprits": len(diagnosis.culprits),
        "summary": tree.summary[:160],
        "parse_s_both_samples": round(parse_s, 3),
        "merge_classify_s_median": round(statistics.median(timings), 3),
        "merge_classify_s_max": round(max(timings), 3),
    }


def tick_figures(processes: int, ticks: int = 40) -> dict[str, object]:
    """Ticks 1 s apart of ``processes`` members, a third of them moving 1 KB a tick; samples at 3, 5, 7 s."""

    def member(pid: int, t: int) -> ProcessSample:
        io = 1024 if pid % 3 == 0 else 0
        state = ProcState.SLEEPING
        return ProcessSample(pid, 1, "rank", (), state, float(t), 0.5, 0, io, io, 4, 1 << 20, (), None, None)

    window = [Tick(float(t), tuple(member(pid, t) for pid in range(2, processes + 2))) for t in range(ticks)]
    history = StackHistory()
    for t in (3.0, 5.0, 7.0):
        history.add(StackSample(t, (), 0.0))
    per_tick = []
    for tick in window:
        started = time.perf_counter()
        history.observe_tick(tick)
        history.spinning(2)  # caches the spin views, as the watch's veto does once per tick
        per_tick.append(time.perf_counter() - started)
    recompute = []
    for i in range(8, ticks):
        started = time.perf_counter()
        data_flowing(window[max(0, i - 64) : i + 1], 3.0, 7.0)
        recompute.append(time.perf_counter() - started)
    return {
        "processes": processes,
        "observe_tick_ms_median_after_span": round(statistics.median(per_tick[8:]) * 1000, 3),
        "observe_tick_ms_max_inside_span": round(max(per_tick[:8]) * 1000, 3),
        "recompute_span_ms_median": round(statistics.median(recompute) * 1000, 3),
    }


def _ok():  # type: ignore[no-untyped-def]
    from hangwatch.model.stacks import DumpOutcome

    return DumpOutcome.OK


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--counts", default="2,8,16")
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load = os.getloadavg()
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load {load[0]:.1f}"
    )
    print(f"bench_stacks: {time.strftime('%Y-%m-%d %H:%M')} on {machine}")
    capture = capture_figures([int(c) for c in args.counts.split(",")], args.rounds)
    for row in capture.values():
        if isinstance(row, dict):
            ok = "ok" if row["overhead_s_max"] <= 0.5 else "OVER"
            print(
                f"  capture {row['processes']:>2} processes {'native' if row['native'] else 'python':6}: "
                f"wall median {row['wall_s_median']:.3f} s (max {row['wall_s_max']:.3f}), "
                f"slowest single dump {row['slowest_dump_s_median']:.3f} s, "
                f"overhead max {row['overhead_s_max']:.3f} s [{ok}]; "
                f"pause median {row['pause_ms_median']} ms, max {row['pause_ms_max']} ms"
            )
    print(
        f"  target pause: max {capture['pause_ms_all_max']} ms over all dumps "
        f"(noise floor, gaps outside dumps p99: {capture['noise_gap_ms_p99_outside_dumps']} ms)"
    )
    merge = merge_figures(args.ranks, args.rounds)
    verdict = "ok" if merge["merge_classify_s_max"] < 1.0 else "OVER 1 s"  # type: ignore[operator]
    print(
        f"  merge+classify {merge['ranks']} ranks ({merge['threads']} threads, "
        f"{merge['distinct_classes']} classes): "
        f"median {merge['merge_classify_s_median']} s, max {merge['merge_classify_s_max']} s [{verdict}]; "
        f"parsing their py-spy JSON took {merge['parse_s_both_samples']} s"
    )
    flow = tick_figures(args.ranks)
    print(
        f"  data flow per tick, {flow['processes']} processes: observe_tick median "
        f"{flow['observe_tick_ms_median_after_span']} ms after the span "
        f"(max {flow['observe_tick_ms_max_inside_span']} ms inside it); recomputing the span every tick "
        f"{flow['recompute_span_ms_median']} ms"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"machine": machine, "capture": capture, "merge": merge, "flow": flow}, indent=1)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
