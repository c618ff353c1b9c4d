"""A two-node Ray cluster: a head on this machine and a worker node inside an emulated node.

The head binds the bridge's address (so the node reaches its GCS, and its dashboard answers there); the
worker node runs ``ray start --address HEAD --block`` inside hwnode1 (its own network, PID, UTS and mount
namespaces, its own /dev/shm: tests/nodes_emulation.py), so the state API gives each node its own
address and each actor's pid as its own node sees it. Three vLLM-like ``RayWorkerWrapper`` actors in one
gloo group: TP0 on the head, TP1 and TP2 on hwnode1, TP2 never joining the all_reduce. Then, through the
real CLI:

* profiling on (``RAY_DASHBOARD_ENABLE_PROFILING=1`` on the head): ``stacks --ray`` takes every stack
  through the dashboard, each node's agent running py-spy, and names TP2 on the worker node;
* profiling off (Ray 2.60's default): the 403 is said; ``stacks --ray`` falls back to ssh to the
  addresses the state API gave (an sshd at the bridge address for the head, the node's own sshd), and,
  with ``--ray-task``, to a node-pinned Ray task running the collector where ssh does not reach;
  ``attach --ray`` watches both nodes over ssh and ends ``stalled`` with the culprit on hwnode1.

Skipped, with the reason, without root, namespaces, sshd or the Ray venv. Each head, node, sshd and
actor is stopped afterwards (descendants first; never ``ray stop``, which would stop every Ray here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from hwrun import run_hangwatch
from nodes_emulation import EmulatedNodes
from nodes_emulation import Node
from nodes_emulation import skip_reason
from proc_helpers import kill_tree
from proc_helpers import wait_until
from ray_env import ray_python

pytestmark = [pytest.mark.timeout(400), pytest.mark.ray, pytest.mark.nodes]

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs"
WORLD, CULPRIT = 3, 2


@dataclass
class RayCluster:
    url: str
    head_ip: str
    node: Node  # the emulated node the worker node runs in
    node_ids: dict[str, str]  # node_ip -> Ray node id
    up_s: float  # head start to every actor in its call


def _ray_env(py: Path, profiling: bool) -> dict[str, str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_DASHBOARD_ENABLE_PROFILING", None)
    env.pop("RAY_ADDRESS", None)
    if profiling:
        env["RAY_DASHBOARD_ENABLE_PROFILING"] = "1"
        # The agents run py-spy from their PATH (shutil.which): the venv's, as an activated venv gives.
        env["PATH"] = f"{py.parent}:{os.environ['PATH']}"
    # Without it (profiling off), `ray start` runs from its full path with the venv *not* on PATH, as
    # from a shell that never activated it: the Ray job's `python` is then not the cluster's, so the
    # --ray-task test must say which one is (--ray-python).
    return env


def _nodes(url: str) -> list[dict[str, Any]]:
    try:
        r = httpx.get(f"{url}/api/v0/nodes", timeout=3)
    except httpx.HTTPError:
        return []
    if r.status_code != 200:
        return []
    return list(r.json()["data"]["result"]["result"])


def _ours_left(tag: str) -> list[int]:
    left = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if tag.encode() in (d / "cmdline").read_bytes():
                    left.append(int(d.name))
            except OSError:
                pass
    return left


def ray_cluster(
    nodes: EmulatedNodes, node: Node, profiling: bool, gcs: int, dash: int
) -> Iterator[RayCluster]:
    py = ray_python()
    head_ip = nodes.bridge_address
    # Short: Ray's socket paths have a length limit. One temp dir per Ray node: the worker node shares
    # this file system, and its sockets and logs must not meet the head's.
    tag = f"/tmp/hwrc{os.getpid()}{'p' if profiling else 'n'}"
    env = _ray_env(py, profiling)
    ray_bin = str(py.parent / "ray")
    common = ["--num-cpus", "1", "--disable-usage-stats", "--block", "--object-store-memory", str(80 << 20)]
    start = time.monotonic()
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--node-ip-address", head_ip, "--port", str(gcs),
         "--dashboard-host", head_ip, "--dashboard-port", str(dash), "--include-dashboard", "true",
         "--dashboard-agent-listen-port", str(dash + 1), "--dashboard-agent-grpc-port", str(dash + 2),
         "--runtime-env-agent-port", str(dash + 3), "--metrics-export-port", str(dash + 4),
         "--temp-dir", f"{tag}h", *common],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    nodes.started.append(head)
    url = f"http://{head_ip}:{dash}"
    worker = None
    try:
        wait_until(lambda: len(_nodes(url)) == 1, 120, interval=0.5, what="the Ray head's dashboard")
        log = (nodes.work / f"ray-worker-{'p' if profiling else 'n'}.log").open("w")
        worker = nodes.run_on(
            node,
            [ray_bin, "start", "--address", f"{head_ip}:{gcs}", "--node-ip-address", node.address,
             "--temp-dir", f"{tag}w", *common],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

        def both_alive() -> bool:
            return sum(n["state"] == "ALIVE" for n in _nodes(url)) == 2

        wait_until(both_alive, 120, interval=0.5, what="the worker node joined")
        ids = {n["node_ip"]: n["node_id"] for n in _nodes(url)}
        ready = nodes.work / f"ready-ray-{'p' if profiling else 'n'}"
        ready.mkdir()
        places = {
            0: (ids[head_ip], nodes.bridge),
            1: (ids[node.address], "eth0"),
            2: (ids[node.address], "eth0"),
        }
        driver = [
            str(py), str(PROGRAMS / "ray_workers.py"), "--address", f"{head_ip}:{gcs}", "--world", str(WORLD),
            "--culprit", str(CULPRIT), "--master-addr", head_ip, "--port", str(gcs + 7),
            "--ready-dir", str(ready),
            *[f"--place={r}={nid}:{ifname}" for r, (nid, ifname) in places.items()],
        ]  # fmt: skip
        subprocess.run(driver, env=env, check=True, timeout=180, capture_output=True)
        wait_until(lambda: len(list(ready.glob("rank*"))) == WORLD, 60, what="three actors in the group")
        time.sleep(1.0)  # the waiting ranks are inside all_reduce
        yield RayCluster(url, head_ip, node, ids, time.monotonic() - start)
    finally:
        if worker is not None:
            kill_tree(worker)
            nodes.started.remove(worker)
        kill_tree(head)
        nodes.started.remove(head)
        wait_until(lambda: not _ours_left(tag), 30, interval=0.5, what="our Ray processes gone")
        for temp in (f"{tag}h", f"{tag}w"):
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedNodes]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    ray_python()  # skip before building nodes when there is no Ray venv
    emulated = EmulatedNodes(tmp_path_factory.mktemp("raynodes"), count=2).start()
    try:
        yield emulated
    finally:
        emulated.close()
    assert emulated.leftovers() == []


@pytest.fixture
def profiling_on(nodes: EmulatedNodes) -> Iterator[RayCluster]:
    """One test uses it: gone before the profiling-off cluster starts (the 2 cores hold one at a time)."""
    yield from ray_cluster(nodes, nodes.nodes[1], True, 6441, 8341)


@pytest.fixture(scope="module")
def profiling_off(nodes: EmulatedNodes) -> Iterator[RayCluster]:
    yield from ray_cluster(nodes, nodes.nodes[0], False, 6451, 8351)


def culprit_of(report: dict[str, Any], culprits: list[int] | None = None) -> tuple[str, int]:
    """The one culprit as (the address of its node, its pid there)."""
    (key,) = report["diagnosis"]["culprits"] if culprits is None else culprits
    where = report["processes"][str(key)]
    # A node's label is its hostname where the collector ran there, its address for the dashboard's.
    [host] = [n["host"] for n in report["nodes"] if where["node"] in (n["label"], n["host"])]
    return host, where["pid"]


def actor_pids(url: str) -> dict[int, tuple[str, int]]:
    """rank -> (node id, pid) from the state API."""
    rows = httpx.get(f"{url}/api/v0/actors", params={"limit": 1000}, timeout=5).json()["data"]["result"][
        "result"
    ]
    return {
        int(a["name"].rsplit("TP", 1)[1]): (a["node_id"], a["pid"])
        for a in rows
        if a["class_name"] == "RayWorkerWrapper" and a["state"] == "ALIVE"
    }


def test_dashboard_stacks_name_the_culprit_on_the_worker_node(
    profiling_on: RayCluster, tmp_path: Path
) -> None:
    c = profiling_on
    started = time.monotonic()
    out = run_hangwatch(
        ["stacks", "--ray", c.url, "--samples", "2", "--every", "0.5", "--no-native"], tmp_path
    )
    took = time.monotonic() - started
    assert out.rc == 0, out.stderr
    report = out.report
    assert report is not None, out.stderr
    print(out.stdout, f"\n(cluster up in {c.up_s:.1f} s; stacks --ray {took:.2f} s)")
    assert any("/worker/traceback" in n for n in report["notes"]), report["notes"]
    assert sorted(n["host"] for n in report["nodes"]) == sorted([c.head_ip, c.node.address])
    assert all(n["outcome"] == "ok" for n in report["nodes"]), report["nodes"]
    pids = actor_pids(c.url)
    node, pid = culprit_of(report)
    assert (node, pid) == (c.node.address, pids[CULPRIT][1]), (report["diagnosis"], out.stdout)
    assert report["diagnosis"]["cause"] == "collective-wait", report["diagnosis"]


@pytest.fixture
def head_sshd(nodes: EmulatedNodes) -> Iterator[None]:
    """An sshd at the head's address (the bridge's) for the test's duration: the head is this machine."""
    proc = nodes.start_host_sshd()
    try:
        yield
    finally:
        nodes.stop_host_sshd(proc)


def ssh_args(nodes: EmulatedNodes) -> list[str]:
    return ["--ssh-config", str(nodes.ssh_config), "--remote-hangwatch", str(nodes.hangwatch)]


def assert_culprit_on_the_worker_node(c: RayCluster, report: dict[str, Any], stdout: str) -> None:
    pids = actor_pids(c.url)
    assert culprit_of(report) == (c.node.address, pids[CULPRIT][1]), (report.get("diagnosis"), stdout)
    assert pids[CULPRIT][0] == c.node_ids[c.node.address]  # the state API put it on the worker node


def test_profiling_off_says_403_and_reads_both_nodes_over_ssh(
    profiling_off: RayCluster, nodes: EmulatedNodes, head_sshd: None, tmp_path: Path
) -> None:
    c = profiling_off
    started = time.monotonic()
    out = run_hangwatch(["stacks", "--ray", c.url, "--no-native", *ssh_args(nodes)], tmp_path)
    took = time.monotonic() - started
    print(out.stdout, f"\n(cluster up in {c.up_s:.1f} s; stacks --ray over ssh {took:.2f} s)")
    report = out.report
    assert report is not None, out.stderr
    notes = " ".join(report["notes"])
    assert "403" in notes and "RAY_DASHBOARD_ENABLE_PROFILING=1" in notes, notes
    # Each node at the address the state API gave it, read by the collector there (so with /proc).
    assert {n["host"]: n["outcome"] for n in report["nodes"]} == {c.head_ip: "ok", c.node.address: "ok"}
    assert report["diagnosis"]["cause"] == "collective-wait", report["diagnosis"]
    assert_culprit_on_the_worker_node(c, report, out.stdout)
    # The worker node's pids are its own PID namespace's, not this machine's.
    [worker] = [n for n in report["nodes"] if n["host"] == c.node.address]
    [head] = [n for n in report["nodes"] if n["host"] == c.head_ip]
    assert worker["pid_ns"] != head["pid_ns"]


def test_profiling_off_without_ssh_the_collector_runs_as_a_node_pinned_ray_task(
    profiling_off: RayCluster, nodes: EmulatedNodes, tmp_path: Path
) -> None:
    """No sshd at the head's address, the worker node's sshd stopped: only --ray-task reaches them."""
    c = profiling_off
    nodes.stop_sshd(c.node)
    try:
        without = run_hangwatch(
            ["stacks", "--ray", c.url, "--no-native", "--node-timeout", "8", *ssh_args(nodes)], tmp_path
        )
        task = [
            "stacks",
            "--ray",
            c.url,
            "--no-native",
            "--node-timeout",
            "20",
            "--ray-task",
            *ssh_args(nodes),
        ]
        # The head's `ray start` ran without the venv on PATH: the job's `python` has no Ray, and says so.
        wrong = run_hangwatch(task, tmp_path, timeout=180)
        started = time.monotonic()
        out = run_hangwatch(
            [*task, "--ray-python", str(ray_python())],
            tmp_path,
            timeout=180,
        )  # fmt: skip
        took = time.monotonic() - started
    finally:
        nodes.start_sshd(c.node)
    assert without.report is not None, without.stderr
    assert {n["outcome"] for n in without.report["nodes"]} == {"refused"}, without.report["nodes"]
    assert "--ray-task would run the collector there" in " ".join(without.report["notes"])
    assert wrong.report is not None, wrong.stderr
    assert {n["outcome"] for n in wrong.report["nodes"]} == {"remote-error"}, wrong.report["nodes"]
    assert all(
        "No module named 'ray'" in n["detail"] and "--ray-python" in n["detail"]
        for n in wrong.report["nodes"]
    )
    print(out.stdout, f"\n(stacks --ray --ray-task {took:.2f} s)")
    report = out.report
    assert report is not None, out.stderr
    assert out.rc == 0, out.stderr
    notes = " ".join(report["notes"])
    assert "node-pinned Ray task" in notes and "ssh: refused; task: ok" in notes, notes
    assert {n["host"]: n["outcome"] for n in report["nodes"]} == {c.head_ip: "ok", c.node.address: "ok"}
    assert report["diagnosis"]["cause"] == "collective-wait", report["diagnosis"]
    assert_culprit_on_the_worker_node(c, report, out.stdout)
    # The job is over and stays listed, visibly ours (it ran code in the cluster).
    job = notes.split("Ray job ", 1)[1].split()[0]
    info = httpx.get(f"{c.url}/api/jobs/{job}", timeout=5).json()
    assert (info["status"], info["metadata"]["hangwatch"]) == ("SUCCEEDED", "collect"), info


def test_attach_ray_over_ssh_is_stalled_naming_the_culprit_on_the_worker_node(
    profiling_off: RayCluster, nodes: EmulatedNodes, head_sshd: None, tmp_path: Path
) -> None:
    c = profiling_off
    started = time.monotonic()
    out = run_hangwatch(
        ["attach", "--ray", c.url, "--window", "60", "--stall-after", "8", "--node-timeout", "10", "--quiet",
         *ssh_args(nodes)],
        tmp_path,
        timeout=150,
    )  # fmt: skip
    took = time.monotonic() - started
    print(out.stdout, f"\n(attach --ray {took:.2f} s)")
    report = out.report
    assert report is not None, out.stderr
    verdict = report["verdict"]
    assert verdict["state"] == "stalled", verdict
    assert {n["host"] for n in report["nodes"]} == {c.head_ip, c.node.address}
    assert all(n["rounds_answered"] > 0 for n in report["nodes"]), report["nodes"]
    assert took < 60, took
    pids = actor_pids(c.url)
    assert culprit_of(report, verdict["culprits"]) == (c.node.address, pids[CULPRIT][1]), (
        verdict,
        out.stdout,
    )
