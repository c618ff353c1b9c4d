"""Issue 28's scale table in one run: every row, the figure beside its goal.

Rows measured here, from synthetic data built out of the real captured fixtures (no engine, no network):

* parse 10,000 ranks' py-spy JSON: the ``missing_collective`` fixture's ``--native`` dumps (two ranks in
  the all_reduce, one rank in 100 elsewhere), two capture rounds of 10,000 ranks each through
  ``parse_dump`` with a cached source-line lookup, as ``StackDumper`` gives it (the JSON text is made
  before the clock starts);
* merge + classify those 10,000 ranks (``stack_context``, ``classify``, ``build_tree``);
* decode 1,000 node bundles of 10 ranks (``codec.decode`` of each bundle's text, as the controller does);
  each bundle's two rounds as ``stacks --hosts`` takes them by default: native frames in the first, the
  Python frames only in the second (whose threads the analysis gives the first round's native frames);
  every process with the kernel's waits of its threads, as the collector reads them before each dump
  (a real gloo rank's: five threads, ten sockets, four pipes; since 2026-12-06, sixth session);
* each node's part of the merge as its answer arrives (``analyse.nodes.NodeParts.add``, the fan-out's last
  step for a node: its copies under merge keys, its views and kernel waits);
* merge + rules + tree over those 10,000 ranks across nodes (``analyse.nodes.analyse``) after the last
  answer, with the parts made on arrival, and with every part made at the end (as before 2026-12-07);
* 1,000 nodes through one Slurm step end to end at the controller: ``gather_slurm`` and ``report_of`` over a
  stand-in srun (``srun_replay.py``) that replays the bundles as srun delivers a step's output (labelled
  messages of 1,024 bytes), all at once or one node a millisecond: from its last line to the report, with
  each node's part made as its answer arrives and without;
* the collector alone on this machine (``nodes.collector.collect``, full mode, one round) over a torch
  job's two ranks (one in a gloo ``all_reduce``; four plain Python processes without torch), with native
  frames from our unwinder, from py-spy's own, and without: the part of ``stacks --hosts`` on each node.

Rows that need real nodes (``stacks --hosts`` end to end, the fan-out to 1,000 nodes) print what is
measured here and say that the rest is ``benchmarks/bench_nodes.py``'s (root, emulated nodes); the
1,000-node row states its model with the parts measured here.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_scale.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.stacks import loader  # noqa: E402
from hangwatch.analyse.nodes import analyse  # noqa: E402
from hangwatch.analyse.stackcontext import stack_context  # noqa: E402
from hangwatch.analyse.stackrules import classify  # noqa: E402
from hangwatch.analyse.stacktree import build_tree  # noqa: E402
from hangwatch.collect.stacks import parse_dump  # noqa: E402
from hangwatch.model.kernelwaits import ProcessWaits  # noqa: E402
from hangwatch.model.kernelwaits import ThreadWait  # noqa: E402
from hangwatch.model.kernelwaits import Waker  # noqa: E402
from hangwatch.model.nodes import BUNDLE_SCHEMA  # noqa: E402
from hangwatch.model.nodes import ClockReading  # noqa: E402
from hangwatch.model.nodes import CollectMode  # noqa: E402
from hangwatch.model.nodes import NodeAnswer  # noqa: E402
from hangwatch.model.nodes import NodeBundle  # noqa: E402
from hangwatch.model.nodes import NodeIdentity  # noqa: E402
from hangwatch.model.nodes import NodeOutcome  # noqa: E402
from hangwatch.model.nodes import NodeProcess  # noqa: E402
from hangwatch.model.nodes import NodeResult  # noqa: E402
from hangwatch.model.nodes import ThreadState  # noqa: E402
from hangwatch.model.samples import ProcessSample  # noqa: E402
from hangwatch.model.samples import ProcState  # noqa: E402
from hangwatch.model.samples import Tick  # noqa: E402
from hangwatch.model.stacks import DumpOutcome  # noqa: E402
from hangwatch.model.stacks import ProcessStacks  # noqa: E402
from hangwatch.model.stacks import StackSample  # noqa: E402
from hangwatch.model.stacks import ThreadStack  # noqa: E402
from hangwatch.model.stacks import intern_frames  # noqa: E402
from hangwatch.nodes import codec  # noqa: E402
from hangwatch.nodes.gather import result_of  # noqa: E402

try:
    from hangwatch.analyse.nodes import NodeParts
except ImportError:  # a tree from before the parts were made on arrival: its rows say so
    NodeParts = None  # type: ignore[assignment,misc]
try:
    from hangwatch.model.stacks import paused_gc
except ImportError:  # a tree from before the collector was paused: the same script measures it as it was
    paused_gc = contextlib.nullcontext()  # type: ignore[assignment]

NOT_HERE = "not measured by this script: see bench_nodes.py"
FANOUT_CONCURRENCY = 32  # ssh's default concurrency (transports/ssh.py)


@dataclasses.dataclass
class Figure:
    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def text(self) -> str:
        return f"{self.median:.3f} s (min {min(self.values):.3f}, max {max(self.values):.3f})"


def timed(fn: Callable[[], Any], rounds: int, *, collector_off: bool = False) -> tuple[Figure, Any]:
    """``collector_off``: the cyclic collector paused around each run, as ``stacks --hosts`` keeps it off
    from its first answer to its output (nodes/session.py); otherwise the first allocation after a run
    would walk everything the run made, a collection that command never makes."""
    values, result = [], None
    for _ in range(rounds):
        result = None
        gc.collect()  # the previous run's garbage is not this run's cost
        started = time.perf_counter()
        with paused_gc if collector_off else contextlib.nullcontext():
            result = fn()
        values.append(time.perf_counter() - started)
    return Figure(values), result


# -- one node: py-spy JSON of 10,000 ranks ------------------------------------------------------------
def rank_texts() -> list[str]:
    """Per capture round, the py-spy JSON of the two ranks in the all_reduce and of the odd one out."""
    raw = loader.load("missing_collective")
    texts: list[str] = []
    for si in range(2):
        by_name = {p["name"]: p for p in raw["samples"][si]["processes"]}
        texts += [json.dumps(by_name[f"gloo_rank{r}"]["dumps"]["native"]["json"]) for r in range(3)]
    return texts


def cached_source_line() -> Callable[[str, int], str | None]:
    """The fixture's source lines, each file read once (``StackDumper._source_line`` caches per file)."""
    cache: dict[tuple[str, int], str | None] = {}

    def line_of(path: str, line: int) -> str | None:
        key = (path, line)
        if key not in cache:
            cache[key] = loader.source_line(path, line)
        return cache[key]

    return line_of


def parse_ranks(texts: list[str], ranks: int) -> list[list[tuple[ThreadStack, ...]]]:
    """Every rank's dump of both rounds through the parser: the timed part."""
    source = cached_source_line()
    return [
        [parse_dump(texts[si * 3 + (2 if i % 100 == 42 else i % 2)], source) for i in range(ranks)]
        for si in range(2)
    ]


def rank_samples(parsed: list[list[tuple[ThreadStack, ...]]]) -> list[StackSample]:
    """The parsed dumps as two capture rounds, each rank its own pid and thread ids."""
    samples = []
    for si, dumps in enumerate(parsed):
        out = []
        for i, dump in enumerate(dumps):
            threads = tuple(
                dataclasses.replace(t, tid=1_000_000 + i if t.name == "MainThread" else 2_000_000 + i)
                for t in dump
            )
            out.append(
                ProcessStacks(
                    1_000_000 + i, f"worker_rank{i}", "rank", str(i), DumpOutcome.OK, threads, "S", 1.0
                )
            )
        samples.append(StackSample(float(si * 2), tuple(out), 0.0))
    return samples


def with_kernel_waits(samples: list[StackSample]) -> list[StackSample]:
    """The same rounds with every process's kernel waits, as the collector reads them (``_kernel_waits``);
    ranks of one node, so no socket of theirs is another's peer in the sample."""
    return [
        dataclasses.replace(
            sample,
            processes=tuple(
                dataclasses.replace(p, kernel=_kernel_waits(p.pid, rank, si, helper_tid=2_000_000 + rank))
                for rank, p in enumerate(sample.processes)
            ),
        )
        for si, sample in enumerate(samples)
    ]


def merge_classify_with_waits(samples: list[StackSample], rounds: int) -> Figure:
    """``merge_classify`` of the rounds with every process's kernel waits; the data made here and freed on
    return: kept alive under the rows after it, it slowed the across-nodes row by 0.15-0.3 s."""
    waited = with_kernel_waits(samples)
    figure, _ = timed(lambda: merge_classify(waited), rounds)
    return figure


def merge_classify(samples: list[StackSample]) -> int:
    diagnosis = classify(stack_context(samples))
    tree = build_tree(samples, highlight=diagnosis.culprits)
    assert diagnosis.cause.value == "collective-wait", diagnosis
    return tree.threads


# -- across nodes: bundles of 10 ranks ----------------------------------------------------------------
def node_bundle(node: int, ranks_per_node: int, samples: list[StackSample]) -> NodeBundle:
    """A node of ``ranks_per_node`` ranks built from the parsed fixture: the census, two ticks, two stack
    rounds (rank 42 of the job is elsewhere, as in the single-node rows), thread states, a log tail."""
    pids = [1000 + i for i in range(ranks_per_node)]
    ranks = [node * ranks_per_node + i for i in range(ranks_per_node)]
    processes = tuple(
        NodeProcess(
            pid=pid,
            ppid=999,
            name=f"python3 worker_rank{rank}",
            role="rank",
            rank=str(rank),
            rank_source="env:RANK",
            world_size=10_000,
            env={"RANK": str(rank), "WORLD_SIZE": "10000", "LOCAL_RANK": str(i)},
            cpu_cores=0.013,
            threads=(
                ThreadState(pid, "python3", ProcState.SLEEPING, 0.001),
                ThreadState(pid + 50_000, "gloo", ProcState.SLEEPING, 0.0),
            ),
        )
        for i, (pid, rank) in enumerate(zip(pids, ranks, strict=True))
    )
    ticks = tuple(
        Tick(
            t=t,
            processes=tuple(_sample(pid, rank, t) for pid, rank in zip(pids, ranks, strict=True)),
        )
        for t in (0.0, 1.0)
    )
    stacks = []
    for si, sample in enumerate(samples):
        by_rank = sample.processes
        # As `stacks --hosts` reads by default: native frames in the first round only, the second as a
        # Python-only dump parses it (one frames tuple for every equal stack).
        native = si == 0
        stacks.append(
            StackSample(
                t=sample.t,
                processes=tuple(
                    dataclasses.replace(
                        by_rank[rank % len(by_rank)],
                        pid=pid,
                        name=f"python3 worker_rank{rank}",
                        rank=str(rank),
                        elapsed_s=0.05,
                        native=native,
                        kernel=_kernel_waits(pid, rank, si),
                        threads=tuple(
                            dataclasses.replace(
                                t,
                                tid=pid if t.name == "MainThread" else pid + 50_000,
                                frames=t.frames if native else intern_frames(t.python_frames),
                            )
                            for t in by_rank[rank % len(by_rank)].threads
                        ),
                    )
                    for pid, rank in zip(pids, ranks, strict=True)
                ),
                elapsed_s=0.06,
            )
        )
    return NodeBundle(
        schema=BUNDLE_SCHEMA,
        collector_version="0.1.0",
        mode=CollectMode.FULL,
        selector="match 'worker_rank'",
        node=NodeIdentity(f"node{node}", f"boot-{node:04d}", 4026531836, "6.1.0", True),
        clock=ClockReading(1_765_000_000.0 + node * 0.001, 1000.0, 1.2, 0.3),
        processes=processes,
        ticks=ticks,
        stacks=tuple(stacks),
    )


def _kernel_waits(pid: int, rank: int, capture: int, helper_tid: int | None = None) -> ProcessWaits:
    """The kernel's waits of a gloo rank in an ``all_reduce`` as the collector reads them (captured from
    tests/programs/gloo_missing_collective.py, 2026-12-06): the main thread on a private futex, gloo's
    loop in ``epoll_pwait`` on its sockets, a pipe and an eventfd, three more threads parked; the pipes it
    may write, its sockets, its log file. Every process of a real bundle carries these, every round."""
    helper = pid + 50_000 if helper_tid is None else helper_tid  # gloo's thread, as the stacks number it
    inode = 3_000_000 + rank * 16
    sockets = tuple(inode + i for i in range(10))
    pipes = tuple(f"pipe:[{inode + 10 + i}]" for i in range(4))
    return ProcessWaits(
        pid=pid,
        threads=(
            ThreadWait(pid, "futex", Waker.ITSELF, wakeups=480 + capture * 2),
            ThreadWait(
                helper,
                "epoll_pwait",
                Waker.ANYONE,
                (*(f"socket:[{s}]" for s in sockets[:5]), pipes[0], "anon_inode:[eventfd]"),
                wakeups=190 + capture * 2,
            ),
            ThreadWait(helper + 1, "epoll_wait", Waker.TIMEOUT, wakeups=82 + capture * 2),
            ThreadWait(helper + 2, "futex", Waker.TIMEOUT, wakeups=6 + capture * 2),
            ThreadWait(helper + 3, "futex", Waker.ITSELF, wakeups=1 + capture * 2),
        ),
        writes=pipes,
        sockets=sockets,
        files=("fe:00:2151306 /tmp/train.log",),
        our_stops=capture,
    )


def _sample(pid: int, rank: int, t: float) -> ProcessSample:
    return ProcessSample(
        pid=pid,
        ppid=999,
        name=f"python3 worker_rank{rank}",
        cmdline=("python3", "worker.py"),
        state=ProcState.SLEEPING,
        cpu_s=12.5 + t,
        cpu_delta_s=0.01,
        rchar=1_000_000,
        wchar=2_000_000,
        io_delta_bytes=0,
        threads=8,
        rss_bytes=400_000_000,
        listening_ports=(),
        role="rank",
        rank=str(rank),
    )


def decode_all(outputs: list[bytes]) -> list[NodeResult]:
    """Each node's output as the fan-out finishes it (``result_of``: ``codec.decode`` of the bytes), with
    the garbage collector paused as ``gather_ssh`` pauses it for the whole fan-out."""
    with paused_gc:
        results = [
            result_of(NodeAnswer(f"node{i}", NodeOutcome.OK, "", out, 1000.0, 1001.5))
            for i, out in enumerate(outputs)
        ]
    assert all(r.bundle is not None for r in results), results[0].detail
    return results


def node_parts(results: list[NodeResult]) -> Any:
    """Each node's part of the merge, made from its decoded answer as the fan-out's finish makes it
    (``NodeParts.add``, in the transport's worker thread, as the answer arrives)."""
    parts = NodeParts([r.host for r in results])
    with paused_gc:
        for r in results:
            parts.add(r)
    return parts


def analyse_nodes(results: list[NodeResult], parts: Any = None) -> int:
    analysis = analyse(results, parts) if parts is not None else analyse(results)
    assert analysis.diagnosis.cause.value == "collective-wait", analysis.diagnosis
    return len(analysis.merged.keys)


# -- 1,000 nodes through one srun step ------------------------------------------------------------------
REPLAY = Path(__file__).resolve().with_name("srun_replay.py")


def through_step(outputs: list[bytes], pace_s: float, streamed: bool) -> tuple[float, float]:
    """``stacks --slurm-job``'s controller over a stand-in srun replaying ``outputs`` (``srun_replay.py``),
    one node every ``pace_s``: seconds from the stand-in's last line to the report, and in all. The
    transport's decoder thread decodes each bundle as its line completes, and, ``streamed``, makes the
    node's part of the merge (``NodeParts``); the report is the command's (``report_of``)."""
    from hangwatch.analyse.nodes import report_of
    from hangwatch.nodes.gather import gather_slurm
    from hangwatch.transports.slurm import SlurmOptions

    nodes = [f"node{i}" for i in range(len(outputs))]
    with tempfile.TemporaryDirectory(prefix="hangwatch-bench-") as tmp:
        replay, done = Path(tmp) / "bundles.bin", Path(tmp) / "done"
        replay.write_bytes(b"".join(len(o).to_bytes(4, "big") + o for o in outputs))
        env = {"HANGWATCH_REPLAY": str(replay), "HANGWATCH_REPLAY_DONE": str(done)}
        os.environ.update(env, HANGWATCH_REPLAY_PACE_S=repr(pace_s))
        options = SlurmOptions(job="1", srun=str(REPLAY), fanout="step", node_timeout_s=600.0)
        try:
            started = time.time()
            parts = NodeParts(nodes) if streamed else None
            with paused_gc:  # as stacks_across_nodes keeps it, from the first answer to the output
                results = gather_slurm(nodes, [], options, parts)
                report = report_of(results, "match 'worker_rank'", parts)
            finished = time.time()
            last = float(done.read_text())
        finally:
            for key in (*env, "HANGWATCH_REPLAY_PACE_S"):
                os.environ.pop(key, None)
    assert report.diagnosis.cause.value == "collective-wait", report.diagnosis
    assert len(report.processes) == len(outputs) * 10
    return finished - last, finished - started


def step_figures(outputs: list[bytes], rounds: int) -> dict[str, tuple[Figure, Figure]]:
    """``through_step`` for a burst (every node at once) and one node a millisecond, streamed or not."""
    out = {}
    for pace in (0.0, 0.001):
        for streamed in (True, False):
            after, whole = [], []
            for _ in range(rounds):
                gc.collect()
                a, w = through_step(outputs, pace, streamed)
                after.append(a)
                whole.append(w)
            out[f"{pace * 1000:g}ms-{'parts' if streamed else 'at-end'}"] = (Figure(after), Figure(whole))
    return out


# -- the collector on this machine ---------------------------------------------------------------------
def collector_figures(rounds: int) -> dict[str, Figure] | str:
    """The collector's own time over a real torch job's ranks (tests/programs/native_waits.py: rank 0 with
    ten threads, one in a gloo all_reduce, rank 1 in the group), or over four plain Python processes where
    torch is missing: native frames from our unwinder, from py-spy's own, and none."""
    from hangwatch.collect.stacks import find_py_spy
    from hangwatch.nodes.collector import CollectOptions
    from hangwatch.nodes.collector import collect

    if find_py_spy() is None:
        return "py-spy is not installed"
    tmp = Path(tempfile.mkdtemp(prefix="hangwatch-bench-"))
    try:
        import torch  # noqa: F401

        program = REPO / "tests" / "programs" / "native_waits.py"
        argv = [str(program), "--ready", str(tmp / "ready"), "--heartbeat", str(tmp / "beat")]
        procs = [subprocess.Popen([sys.executable, *argv, "--torch-port", "29677"], start_new_session=True)]
    except ImportError:
        code = "import threading; threading.Event().wait()"
        procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(4)]
        (tmp / "ready").touch()
    try:
        deadline = time.monotonic() + 120
        while not (tmp / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        out = {}
        ways = (("native", True, ""), ("py-spy", True, "py-spy"), ("python", False, ""))
        for key, native, unwinder in ways:
            os.environ["HANGWATCH_NATIVE_UNWINDER"] = unwinder  # read as each collector's dumper is made
            options = CollectOptions(
                pids=tuple(p.pid for p in procs), mode=CollectMode.FULL, samples=1, native=native, probe=False
            )
            values = []
            for _ in range(rounds):
                bundle = collect(options)
                # The job's `sleep` child is no Python process: not a failure.
                ok = (DumpOutcome.OK, DumpOutcome.NOT_PYTHON)
                if any(p.outcome not in ok for s in bundle.stacks for p in s.processes):
                    return "py-spy could not dump the processes here (ptrace permission?)"
                values.append(bundle.clock.duration_s)
            out[key] = Figure(values)
        return out
    finally:
        os.environ.pop("HANGWATCH_NATIVE_UNWINDER", None)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def row(what: str, figure: str, goal: str) -> None:
    print(f"  {what:<60} {figure:<48}" + (f" goal {goal}" if goal else "").rstrip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each figure (median, min, max)")
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--no-collector", action="store_true", help="skip the collector rows (py-spy)")
    parser.add_argument("--no-step", action="store_true", help="skip the rows through a stand-in srun step")
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="also merge + classify at 2,500 to 20,000 ranks: the cost per rank, which stays flat if linear",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load = os.getloadavg()
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load {load[0]:.1f} at start"
    )
    print(f"bench_scale: {time.strftime('%Y-%m-%d %H:%M')} on {machine}; median of {args.rounds} (min, max)")
    texts = rank_texts()
    parse, parsed = timed(lambda: parse_ranks(texts, args.ranks), args.rounds)
    samples = rank_samples(parsed)
    merge, threads = timed(lambda: merge_classify(samples), args.rounds)
    merge_waits = merge_classify_with_waits(samples, args.rounds)
    per_node = 10
    nodes = args.nodes
    outputs = [codec.encode(node_bundle(n, per_node, samples)).encode() for n in range(nodes)]
    decode, results = timed(lambda: decode_all(outputs), args.rounds, collector_off=True)
    across, keys = timed(lambda: analyse_nodes(results), args.rounds, collector_off=True)
    assert keys == nodes * per_node
    after_last: Figure | None = None
    arrival: Figure | None = None
    if NodeParts is not None:
        arrival, parts = timed(lambda: node_parts(results), args.rounds, collector_off=True)
        after_last, _ = timed(lambda: analyse_nodes(results, parts), args.rounds, collector_off=True)
        del parts
    per_rank_ms = parse.median / args.ranks * 1000
    row(f"parse {args.ranks:,} ranks' py-spy JSON (2 rounds)", parse.text(), "< 1 s")
    row("  a rank (both rounds)", f"{per_rank_ms:.3f} ms", "")
    row(f"merge + classify {args.ranks:,} ranks ({threads:,} threads)", merge.text(), "< 0.3 s")
    row("  the same, every process with the kernel's waits", merge_waits.text(), "< 0.3 s")
    size = sum(len(t) for t in outputs) // nodes
    row(f"decode {nodes:,} node bundles of {per_node} ranks ({size:,} bytes each)", decode.text(), "< 0.5 s")
    what = f"merge + rules + tree, {keys:,} ranks across {nodes:,} nodes"
    if after_last is not None and arrival is not None:
        each = arrival.median / nodes * 1000
        row(what, "", "")
        row("  each node's part, made as its answer arrives", arrival.text(), "(in the fan-out)")
        row("    a node", f"{each:.3f} ms", "")
        row("  the rest, after the last answer", after_last.text(), "< 0.5 s")
        row("  all of it after the last answer", across.text(), "(before)")
    else:
        row(what, across.text(), "< 0.5 s")
    steps = {} if args.no_step or NodeParts is None else step_figures(outputs, args.rounds)
    for pace, what in (("0ms", "all at once"), ("1ms", "one node a millisecond")):
        if f"{pace}-parts" not in steps:
            continue
        (after, whole), (after_end, whole_end) = steps[f"{pace}-parts"], steps[f"{pace}-at-end"]
        row(f"{nodes:,} nodes through a stand-in srun step, {what}", "", "")
        row("  from its last line to the report, parts on arrival", after.text(), "< 0.5 s")
        row("    the whole command", whole.text(), "")
        row("  the same, every node's part made after the last answer", after_end.text(), "(before)")
        row("    the whole command", whole_end.text(), "")
    collector = None if args.no_collector else collector_figures(args.rounds)
    for native, goal_e2e, key in ((True, "< 3 s", "native"), (False, "< 1.5 s", "python")):
        flag = "" if native else " --no-native"
        what = f"stacks --hosts over 3 nodes{flag}"
        row(what, NOT_HERE, goal_e2e)
        if isinstance(collector, dict):
            row("  its collector here, a torch job, 1 round", collector[key].text(), "(part of the above)")
            if native:
                row("  the same with py-spy's own --native unwinding", collector["py-spy"].text(), "(before)")
        elif collector is not None:
            row("  its collector here", f"not measured: {collector}", "(part of the above)")
    if after_last is not None and arrival is not None:
        streamed = decode.median + arrival.median
        row(
            f"{nodes:,} nodes end to end: controller decode + part per answer",
            f"{streamed:.3f} s (overlapping the fan-out)",
            "< 10 s in all",
        )
        row("  + the analysis after the last answer", f"{after_last.median:.3f} s", "")
    else:
        controller = decode.median + across.median
        row(
            f"{nodes:,} nodes end to end: controller decode + analyse",
            f"{controller:.3f} s (measured: the sum of the medians)",
            "< 10 s in all",
        )
    waves = -(-nodes // FANOUT_CONCURRENCY)
    row(
        f"  + the flat fan-out: {waves} waves of {FANOUT_CONCURRENCY} x one node's exchange",
        NOT_HERE,
        "(model: waves x exchange + the above)",
    )
    scaling = {}
    if args.scaling:
        for n in (2_500, 5_000, 10_000, 20_000):
            part = rank_samples(parse_ranks(texts, n))
            figure, _ = timed(lambda part=part: merge_classify(part), args.rounds)
            scaling[n] = figure.values
            row(
                f"  merge + classify {n:,} ranks",
                f"{figure.text()}; {figure.median / n * 1e6:.1f} us a rank",
                "",
            )
    if args.json is not None:
        figures = {
            "parse": parse.values,
            "merge_classify": merge.values,
            "merge_classify_kernel_waits": merge_waits.values,
            "decode": decode.values,
            "across_nodes": across.values,
        }
        if after_last is not None and arrival is not None:
            figures |= {"node_parts_on_arrival": arrival.values, "across_nodes_after_last": after_last.values}
        for key, (after, whole) in steps.items():
            figures |= {f"step_{key}_after_last": after.values, f"step_{key}_whole": whole.values}
        if isinstance(collector, dict):
            figures |= {f"collector_{k}": v.values for k, v in collector.items()}
        out = {"machine": machine, "seconds": figures, "merge_classify_by_ranks": scaling}
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
