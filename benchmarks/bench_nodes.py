"""Collect and merge across emulated nodes: end to end, per node (connect, collect, the rest), and at scale.

Needs root (it builds the emulated nodes of tests/nodes_emulation.py: network, PID and UTS namespaces
on a bridge, one sshd each) and torch (the job is tests/programs/gloo_node_job.py: world 4, ranks 0-1
on hwnode1, 2 on hwnode2, 3 on hwnode3, rank 3 never entering the all_reduce). Prints:

* end to end: ``hangwatch stacks --hosts hwnode[1-3]`` as a user runs it (a new process, the ssh fan-out,
  the collectors, the merge, the report), with one round (``--samples 1``) and with two one second apart;
* per node: ssh connect + session (``ssh NODE true``), the collector's own run time (from its bundle),
  and the rest of the exchange (the remote interpreter's start and the transfer), the bundle's bytes;
* the merge at scale: real bundles replicated to 64 and 1,000 nodes of 10 ranks, decoded and analysed
  (``benchmarks/bench_scale.py`` has the same from synthetic bundles, without root);
* ``attach --hosts``'s census round (``--only census`` for this part alone): one round over the three
  nodes as the watch runs it each interval, on open ``collect --stream`` sessions: wall time, the
  controller's CPU (its ssh clients included), the collectors' own run time, the bytes that come back,
  and the same round as one-shot ssh exchanges for comparison.

    sudo .venv/bin/python benchmarks/bench_nodes.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hangwatch.analyse.nodes import analyse  # noqa: E402
from hangwatch.analyse.nodes import clock_skew  # noqa: E402
from hangwatch.model.nodes import NodeOutcome  # noqa: E402
from hangwatch.model.nodes import NodeResult  # noqa: E402
from hangwatch.model.stacks import paused_gc  # noqa: E402
from hangwatch.nodes import codec  # noqa: E402
from hangwatch.nodes.gather import gather_ssh  # noqa: E402
from hangwatch.nodes.gather import result_of  # noqa: E402
from hangwatch.nodes.watch import CENSUS_WINDOW_S  # noqa: E402
from hangwatch.transports.ssh import SshOptions  # noqa: E402
from hangwatch.transports.ssh import SshSessions  # noqa: E402
from nodes_emulation import EmulatedNodes  # noqa: E402
from nodes_emulation import Job  # noqa: E402
from nodes_emulation import skip_reason  # noqa: E402

CONCURRENCY = 32


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return time.monotonic() - started, done


def end_to_end(
    cluster: EmulatedNodes,
    job: Job,
    samples: int,
    rounds: int,
    native: bool = False,
    remote: Path | None = None,
) -> list[float]:
    """``remote``: the nodes' hangwatch command (default the cluster's own)."""
    argv = [
        sys.executable, "-m", "hangwatch", "stacks", "--hosts", "hwnode[1-3]", "--match", job.match(),
        "--ssh-config", str(cluster.ssh_config), "--remote-hangwatch", str(remote or cluster.hangwatch),
        "--samples", str(samples), "--every", "1",
    ] + ([] if native else ["--no-native"])  # fmt: skip
    walls = []
    for _ in range(rounds):
        wall, done = timed(argv)
        assert done.returncode == 0 and "hwnode3:rank3 never entered it" in done.stdout, (
            done.stdout + done.stderr
        )
        walls.append(wall)
    return walls


def per_node(cluster: EmulatedNodes, job: Job, rounds: int) -> list[dict[str, float]]:
    options = SshOptions(config=cluster.ssh_config, remote=(str(cluster.hangwatch),))
    args = ["--match", job.match(), "--mode", "full", "--samples", "1", "--no-native"]
    rows = []
    for node in cluster.nodes:
        connect = [timed(["ssh", "-F", str(cluster.ssh_config), node.name, "true"])[0] for _ in range(rounds)]
        exchange, collect_s, sizes, skews, ranks = [], [], [], [], 0
        for _ in range(rounds):
            (result,) = gather_ssh([node.name], args, options)
            assert result.bundle is not None, result.detail
            exchange.append(result.received_wall_s - result.sent_wall_s)
            collect_s.append(result.bundle.clock.duration_s)
            sizes.append(result.output_bytes)
            skew = clock_skew(result)
            assert skew is not None
            skews.append(skew.bound_s)
            ranks = sum(1 for p in result.bundle.processes if p.rank is not None)
        rows.append(
            {
                "node": node.index,
                "connect": median(connect),
                "exchange": median(exchange),
                "collect": median(collect_s),
                "rest": median(exchange) - median(connect) - median(collect_s),
                "bytes": median(sizes),
                "skew": median(skews),
                "ranks": ranks,
            }
        )
    return rows


def census_cost(cluster: EmulatedNodes, job: Job, rounds: int) -> dict[str, list[float]]:
    """The round ``attach --hosts`` runs each interval: a request on each node's open ``collect --stream``
    session (nodes/watch.py), and, for comparison, the same census as a one-shot ssh exchange per node."""
    options = SshOptions(config=cluster.ssh_config, remote=(str(cluster.hangwatch),), node_timeout_s=4.0)
    args = ["--match", job.match(), "--every", f"{CENSUS_WINDOW_S:g}", "--deadline", "2"]
    out: dict[str, list[float]] = {k: [] for k in ("wall", "cpu", "collect", "bytes", "oneshot", "first")}
    hosts = [n.name for n in cluster.nodes]
    sessions = SshSessions(hosts, args, options)
    try:
        for i in range(rounds + 1):
            before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.monotonic()
            results = sessions.ask("census", 4.0, result_of)
            wall = time.monotonic() - started
            after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            assert all(r.bundle is not None for r in results), [r.detail for r in results]
            if i == 0:  # the sessions' handshake and interpreter start: once per watch
                out["first"].append(wall)
                continue
            out["wall"].append(wall)
            cpu = sum(
                a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before, strict=True)
            )
            out["cpu"].append(cpu)
            out["collect"].append(max(r.bundle.clock.duration_s for r in results if r.bundle is not None))
            out["bytes"].append(sum(r.output_bytes for r in results))
            time.sleep(0.5)
    finally:
        sessions.close()
    for _ in range(rounds):
        started = time.monotonic()
        results = gather_ssh(hosts, [*args, "--mode", "census"], options)
        out["oneshot"].append(time.monotonic() - started)
    return out


def bundles(cluster: EmulatedNodes, job: Job) -> list[NodeResult]:
    options = SshOptions(config=cluster.ssh_config, remote=(str(cluster.hangwatch),))
    args = ["--match", job.match(), "--mode", "full", "--samples", "2", "--every", "1", "--no-native"]
    return gather_ssh([n.name for n in cluster.nodes], args, options)


def at_scale(results: list[NodeResult], nodes: int, ranks_per_node: int) -> tuple[float, float, int]:
    """Decode and analyse ``nodes`` bundles of ``ranks_per_node`` ranks each, built from a real one."""
    source = next(r for r in results if r.bundle is not None and len(r.bundle.processes) >= 2)
    assert source.bundle is not None
    bundle = source.bundle
    rank_procs = [p for p in bundle.processes if p.rank is not None]
    template = rank_procs[0]

    # Widen the real node to ranks_per_node ranks: the template rank's process, stacks and ticks
    # copied under new pids (pid 1000 + i) and global ranks.
    def widen(node_index: int) -> str:
        procs, stacks, ticks = [], [], []
        for i in range(ranks_per_node):
            rank = str(node_index * ranks_per_node + i)
            procs.append(dataclasses.replace(template, pid=1000 + i, rank=rank))
        for s in bundle.stacks:
            base = next(p for p in s.processes if p.pid == template.pid)
            stacks.append(
                dataclasses.replace(
                    s,
                    processes=tuple(
                        dataclasses.replace(
                            base,
                            pid=1000 + i,
                            rank=str(node_index * ranks_per_node + i),
                            threads=tuple(dataclasses.replace(t, tid=1000 + i) for t in base.threads),
                        )
                        for i in range(ranks_per_node)
                    ),
                )
            )
        for t in bundle.ticks:
            base_p = next(p for p in t.processes if p.pid == template.pid)
            ticks.append(
                dataclasses.replace(
                    t,
                    processes=tuple(
                        dataclasses.replace(base_p, pid=1000 + i, rank=str(node_index * ranks_per_node + i))
                        for i in range(ranks_per_node)
                    ),
                )
            )
        node = dataclasses.replace(bundle.node, hostname=f"node{node_index}")
        wide = dataclasses.replace(
            bundle, node=node, processes=tuple(procs), stacks=tuple(stacks), ticks=tuple(ticks)
        )
        return codec.encode(wide)

    texts = [widen(i) for i in range(nodes)]
    started = time.process_time()
    with paused_gc:  # as the fan-out decodes its answers (nodes/gather.py)
        decoded = [codec.decode(t) for t in texts]
    results_n = [
        NodeResult(f"node{i}", NodeOutcome.OK, "", b, 1000.0, 1001.0, len(t))
        for i, (b, t) in enumerate(zip(decoded, texts, strict=True))
    ]
    decode_s = time.process_time() - started
    started = time.process_time()
    analysis = analyse(results_n)
    analyse_s = time.process_time() - started
    assert len(analysis.merged.keys) == nodes * ranks_per_node
    return decode_s, analyse_s, sum(len(t) for t in texts) // (nodes * ranks_per_node)


def print_census(c: dict[str, list[float]]) -> None:
    n = len(c["wall"])
    print(f"attach --hosts census round, 3 nodes, 4 ranks, streaming sessions (median of {n}; min-max):")
    for key, what in (
        ("wall", "s wall per round"),
        ("cpu", "s controller CPU per round (ssh clients included)"),
        ("collect", "s the slowest collector's own time (0.1 s window)"),
        ("first", "s the first round (handshakes, remote interpreters: once per watch)"),
        ("oneshot", "s per round as one-shot ssh exchanges instead"),
    ):
        v = c[key]
        print(f"  {median(v):.3f} {what} ({min(v):.3f}-{max(v):.3f})")
    print(f"  {median(c['bytes']) / 1000:.1f} kB back per round")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=["census"], help="measure only this part")
    args = parser.parse_args()
    reason = skip_reason()
    if reason is not None:
        print(f"cannot emulate nodes here: {reason}")
        return 2
    with tempfile.TemporaryDirectory(prefix="hw-bench-nodes-") as tmp:
        cluster = EmulatedNodes(Path(tmp)).start()
        try:
            job = Job(cluster, "bench", {1: [0, 1], 2: [2], 3: [3]}, world=4, port=29561, culprit="3")
            job.wait_blocked()
            census = census_cost(cluster, job, max(10, args.rounds))
            if args.only == "census":
                print_census(census)
                return 0
            one = end_to_end(cluster, job, 1, args.rounds)
            two = end_to_end(cluster, job, 2, args.rounds)
            native = end_to_end(cluster, job, 1, args.rounds, native=True)
            default = end_to_end(cluster, job, 3, args.rounds, native=True)
            # The same with py-spy's own --native unwinding on the nodes (as before our unwinder).
            py_spy = cluster.work / "hangwatch-py-spy-native"
            py_spy.write_text(f'#!/bin/sh\nHANGWATCH_NATIVE_UNWINDER=py-spy exec {cluster.hangwatch} "$@"\n')
            py_spy.chmod(0o755)
            native_py_spy = end_to_end(cluster, job, 1, args.rounds, native=True, remote=py_spy)
            rows = per_node(cluster, job, args.rounds)
            results = bundles(cluster, job)
        finally:
            cluster.close()
    print_census(census)
    print(f"end to end, 3 nodes, 4 ranks (median of {args.rounds}; min-max):")
    print(f"  stacks --hosts hwnode[1-3] --samples 1: {median(one):.2f} s ({min(one):.2f}-{max(one):.2f})")
    print(f"  stacks --hosts hwnode[1-3] --samples 2: {median(two):.2f} s ({min(two):.2f}-{max(two):.2f})")
    print(
        f"  ... --samples 1 with native frames: {median(native):.2f} s ({min(native):.2f}-{max(native):.2f})"
    )
    print(
        f"  ... the same, py-spy's own --native on the nodes: {median(native_py_spy):.2f} s"
        f" ({min(native_py_spy):.2f}-{max(native_py_spy):.2f})"
    )
    print(
        f"  ... the default (3 rounds 1 s apart, native frames): {median(default):.2f} s"
        f" ({min(default):.2f}-{max(default):.2f}), 2 s of it the rounds' spacing"
    )
    print("per node (median; --samples 1, Python frames):")
    print("  node | ssh connect | collector | rest (start, transfer) | exchange | bundle | ranks | skew ±")
    for r in rows:
        print(
            f"  hwnode{r['node']} | {r['connect']:.3f} s | {r['collect']:.3f} s | {r['rest']:.3f} s | "
            f"{r['exchange']:.3f} s | {r['bytes'] / 1000:.1f} kB | {r['ranks']} | {r['skew']:.3f} s"
        )
    exchange = median([r["exchange"] for r in rows])
    for n in (64, 1000):
        waves = -(-n // CONCURRENCY)
        total = waves * exchange
        print(
            f"  flat fan-out to {n} nodes, {CONCURRENCY} at once: {waves} waves"
            f" x {exchange:.2f} s = {total:.1f} s"
        )
    print("merge at scale (controller CPU; real bundles of 2 rounds widened to 10 ranks per node):")
    for n in (3, 64, 1000):
        decode_s, analyse_s, per_rank = at_scale(results, n, 10)
        print(
            f"  {n} nodes x 10 ranks: decode {decode_s:.2f} s, merge+analyse {analyse_s:.2f} s,"
            f" {per_rank} bytes per rank"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
