"""``hangwatch stacks --slurm-job`` on a real Slurm (Debian's 22.05, munge) over N emulated nodes: one srun
per node (``--slurm-fanout per-node``, 32 at once) against one step over all of them (``step``, slurmd's
own launch tree), and a model for 1,000 nodes fitted from the figures.

Needs root and Slurm's packages (``make slurm-deps``): the nodes are tests/nodes_emulation.py's (network,
PID, UTS and mount namespaces on a bridge), the cluster tests/slurm_cluster.py's (slurmctld on hwnode1,
one slurmd per node). For each N the job is one Python per node sleeping (``srun python -c 'sleep'``, one
task per node), and hangwatch collects its stacks with one round (``--samples 1 --no-native``). Prints,
per N and per mode, the end-to-end wall time of the command as a user runs it and its CPU (hangwatch and
its srun clients; the collectors run under slurmstepd, not here), the launch alone (``srun ... true``),
the collectors' own run time (from their bundles), and the controller's decoding and merge of the N
bundles; then wall(N) = a + b*N fitted by least squares for each mode, and the extrapolation to 1,000.

Every emulated node shares this machine's cores: what one node's collector costs in CPU adds up here,
where on a cluster each node pays its own in parallel. The model separates the two.

    sudo .venv/bin/python benchmarks/bench_slurm_fanout.py [--nodes 3,8,16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from hangwatch.analyse.nodes import report_of  # noqa: E402
from hangwatch.model.nodes import NodeAnswer  # noqa: E402
from hangwatch.nodes.gather import result_of  # noqa: E402
from hangwatch.transports import slurm  # noqa: E402
from nodes_emulation import EmulatedNodes  # noqa: E402
from nodes_emulation import skip_reason  # noqa: E402
from proc_helpers import wait_until  # noqa: E402
from slurm_cluster import SlurmCluster  # noqa: E402
from slurm_cluster import slurm_skip_reason  # noqa: E402

MODES = ("per-node", "step")
TOKEN = "hwfanoutjob"
TARGET_NODES = 1000
TREE_WIDTH = 50  # slurm.conf's TreeWidth default: each slurmd forwards to at most this many


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares a + b*n."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def cpu_of_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def the_job(cluster: SlurmCluster, n: int) -> str:
    """One Python per node, sleeping; returns when every task runs."""
    ready = cluster.dir / "ready"
    ready.mkdir(exist_ok=True)
    code = f"import os, time; open('{ready}/' + os.environ['SLURMD_NODENAME'], 'w').close(); time.sleep(3600)"
    script = f"#!/bin/sh\nsrun {shlex.join([sys.executable, '-c', code, TOKEN])}\n"
    names = ",".join(node.name for node in cluster.nodes.nodes)
    job = cluster.submit(script, f"-N{n}", "--ntasks-per-node=1", "-w", names)
    cluster.wait_running(job)
    wait_until(lambda: len(list(ready.iterdir())) == n, 60, interval=0.2, what=f"{n} tasks of job {job}")
    return job


def stacks(cluster: SlurmCluster, job: str, mode: str, out: Path) -> tuple[float, float]:
    """``hangwatch stacks --slurm-job`` end to end: its wall time and CPU (with its srun clients)."""
    argv = [
        sys.executable, "-m", "hangwatch", "stacks", "--slurm-job", job, "--match", TOKEN,
        "--remote-hangwatch", str(cluster.nodes.hangwatch), "--no-native", "--samples", "1",
        "--slurm-fanout", mode, "--report-json", str(out),
    ]  # fmt: skip
    cpu0, t0 = cpu_of_children(), time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=cluster.client_env(), check=False)
    wall, cpu = time.monotonic() - t0, cpu_of_children() - cpu0
    assert done.returncode == 0, done.stdout + done.stderr
    return wall, cpu


def launch_only(cluster: SlurmCluster, job: str, nodes: list[str], mode: str) -> float:
    """Starting ``true`` on every node: one step over them all, or one srun each (32 at once)."""
    base = ["srun", "--jobid", job, "--overlap", "--quiet"]
    t0 = time.monotonic()
    if mode == "step":
        n = len(nodes)
        argv = [*base, f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--label", "true"]
        assert cluster.run(argv, timeout=120).returncode == 0
    else:
        with ThreadPoolExecutor(max_workers=slurm.DEFAULT_CONCURRENCY) as pool:
            codes = pool.map(
                lambda node: cluster.run([*base, "-N1", "-n1", "-w", node, "true"], timeout=120).returncode,
                nodes,
            )
            assert all(c == 0 for c in codes)
    return time.monotonic() - t0


def controller_part(cluster: SlurmCluster, job: str, nodes: list[str]) -> dict[str, float]:
    """The N answers of one step, then their decoding and the merge timed alone (the controller's serial
    part), and the collectors' own run time from their bundles."""
    os.environ.update(cluster.env)
    options = slurm.SlurmOptions(job, remote=(str(cluster.nodes.hangwatch),))
    args = ["--match", TOKEN, "--mode", "full", "--samples", "1", "--no-native", "--deadline", "25"]

    def keep(answer: NodeAnswer) -> NodeAnswer:
        return answer

    answers = slurm.collect_step(nodes, args, options, finish=keep)
    t0 = time.process_time()
    results = [result_of(a) for a in answers]
    decode = time.process_time() - t0
    assert all(r.bundle is not None for r in results), [r.detail for r in results]
    t0 = time.process_time()
    report_of(results, f"--match {TOKEN}")
    merge = time.process_time() - t0
    durations = [r.bundle.clock.duration_s + r.bundle.clock.since_exec_s for r in results if r.bundle]
    return {
        "decode": decode,
        "merge": merge,
        "bytes": statistics.median(r.output_bytes for r in results),
        "collector": statistics.median(durations),
        "collector_max": max(durations),
    }


def one_size(n: int, rounds: int, work: Path) -> dict[str, object]:
    nodes = EmulatedNodes(work / f"n{n}", count=n)
    (work / f"n{n}").mkdir()
    t0 = time.monotonic()
    nodes.start()
    cluster: SlurmCluster | None = None
    try:
        cluster = SlurmCluster(nodes).start()
        up = time.monotonic() - t0
        job = the_job(cluster, n)
        names = [node.name for node in nodes.nodes]
        out = work / f"n{n}" / "report.json"
        for mode in MODES:  # once each before timing: page cache, Slurm's first step on each node
            stacks(cluster, job, mode, out)
        figures: dict[str, dict[str, list[float]]] = {m: {"wall": [], "cpu": [], "launch": []} for m in MODES}
        for _ in range(rounds):
            for mode in MODES:  # alternated, so a slow moment of the shared machine falls on both
                wall, cpu = stacks(cluster, job, mode, out)
                figures[mode]["wall"].append(wall)
                figures[mode]["cpu"].append(cpu)
                figures[mode]["launch"].append(launch_only(cluster, job, names, mode))
        controller = [controller_part(cluster, job, names) for _ in range(rounds)]
        cluster.cancel(job)
    finally:
        if cluster is not None:
            cluster.close()
        nodes.close()
    assert nodes.leftovers() == [], nodes.leftovers()
    part = {k: statistics.median(c[k] for c in controller) for k in controller[0]}
    return {"n": n, "up_s": up, "figures": figures, "controller": part}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="3,8,16", help="cluster sizes (default: 3,8,16)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for reason in (skip_reason(), slurm_skip_reason()):
        if reason is not None:
            print(f"cannot run: {reason}", file=sys.stderr)
            return 2
    sizes = [int(x) for x in args.nodes.split(",")]
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs (the emulated nodes share them), "
          f"{args.rounds} rounds per mode, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="hwfanout") as tmp:
        for n in sizes:
            row = one_size(n, args.rounds, Path(tmp))
            rows.append(row)
            c = row["controller"]
            assert isinstance(c, dict)
            print(f"\nN = {n} (cluster up in {row['up_s']:.1f} s); bundle {c['bytes']:.0f} B, collector "
                  f"{c['collector']:.3f} s median, {c['collector_max']:.3f} s slowest (interpreter start "
                  f"included); decode {c['decode'] * 1e3:.1f} ms ({c['decode'] / n * 1e3:.2f} ms a bundle), "
                  f"merge {c['merge'] * 1e3:.1f} ms")  # fmt: skip
            figures = row["figures"]
            assert isinstance(figures, dict)
            for mode in MODES:
                f = figures[mode]
                print(f"  {mode:8}  end to end {spread(f['wall'])}  cpu {spread(f['cpu'])}  "
                      f"launch only {spread(f['launch'])}")  # fmt: skip
    print("\nfit wall(N) = a + b*N over the medians:")
    models = {}
    for mode in MODES:
        for what in ("wall", "cpu", "launch"):
            points = [(int(str(r["n"])), statistics.median(r["figures"][mode][what])) for r in rows]  # type: ignore[index]
            a, b = fit(points)
            models[(mode, what)] = (a, b)
            print(f"  {mode:8} {what:6}: a = {a:.3f} s, b = {b * 1e3:.1f} ms/node -> "
                  f"{a + b * TARGET_NODES:.1f} s at {TARGET_NODES} nodes on this machine")  # fmt: skip
    decode = statistics.median(r["controller"]["decode"] / int(str(r["n"])) for r in rows)  # type: ignore[index]
    merge = statistics.median(r["controller"]["merge"] / int(str(r["n"])) for r in rows)  # type: ignore[index]
    hops = 1
    while TREE_WIDTH**hops < TARGET_NODES:
        hops += 1
    cores = os.cpu_count() or 1
    # Here every collector's CPU shares the machine's cores: the step's slope times the cores is one
    # node's collector (with its slurmstepd) as it runs alone on its own node; the controller's own CPU
    # slope is srun's per-task I/O plus the decoding, serial at the controller on any cluster.
    _, wall_b = models[("step", "wall")]
    cpu_a, cpu_b = models[("step", "cpu")]
    alone = wall_b * cores
    total = cpu_a + alone + cpu_b * TARGET_NODES + merge * TARGET_NODES
    print(
        f"\nmodel for {TARGET_NODES} nodes, one step: the controller's start and srun's "
        f"({cpu_a:.2f} s) + the launch tree ({hops} hops at TreeWidth {TREE_WIDTH}) "
        f"+ one node's collector alone ({alone:.2f} s = "
        f"{wall_b * 1e3:.0f} ms/node x {cores} cores, in parallel on a cluster) + srun's I/O and "
        f"the decoding at the controller ({cpu_b * 1e3:.2f} ms/node, decoding {decode * 1e3:.2f} ms of it: "
        f"{cpu_b * TARGET_NODES:.1f} s) + merge ({merge * 1e3:.2f} ms/node: {merge * TARGET_NODES:.1f} s) "
        f"= {total:.1f} s plus the tree's hops"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
