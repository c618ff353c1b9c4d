"""A real SGLang 0.5.23 (CPU engine) across two emulated nodes: ``--tp 2 --nnodes 2 --node-rank 0/1``.

Node 0 (hwnode1) runs the launcher, TP0, the detokenizer and the real HTTP server; node 1 (hwnode2) runs
TP1 and SGLang's dummy health server (``launch_dummy_health_check_server``: 200 to ``/health``, no other
route). Through real ssh to each node's sshd (tests/nodes_emulation.py), ``stacks --hosts`` must see both
schedulers as ranks on their own node, node 0's real ``/health`` and node 1's dummy one marked as such;
``attach --hosts`` must take node 0's ``/health`` as readiness and never node 1's. A fault: the test
stops TP1 with SIGSTOP and sends one request to node 0; the merged stacks must name TP1 on hwnode2.

What the emulated nodes need for SGLang (docs/multinode.md 5b): a /dev/shm of their own (else SGLang's
same-node test passes and the ranks wait forever on each other's loopback), and ``SGLANG_HOST_IP`` (no
default route in a node: SGLang's address discovery would fall back to 0.0.0.0). One SGLang at a time
on this machine: the two nodes' processes are one server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sglang_env

from hwrun import Outcome
from hwrun import run_hangwatch
from nodes_emulation import EmulatedNodes
from nodes_emulation import descendants
from nodes_emulation import skip_reason
from proc_helpers import kill_tree
from proc_helpers import proc_state
from proc_helpers import wait_until

pytestmark = [pytest.mark.sglang, pytest.mark.nodes, pytest.mark.timeout(600)]

PORT = 30000  # each node has its own loopback: the same port on both is no conflict
DIST_PORT = 29600
BOOT_S = 300.0  # 60-100 s measured on the 2 loaded cores; imports dominate
READY_LINE = "The server is fired up and ready to roll!"


@dataclass
class TwoNodeServer:
    cluster: EmulatedNodes
    launchers: list[subprocess.Popen[bytes]]
    logs: list[Path]
    boot_s: float

    def scheduler(self, node_rank: int) -> int:
        """The host pid of the scheduler of TP``node_rank`` (one TP rank per node)."""
        title = f"sglang::scheduler_TP{node_rank}"
        for pid in descendants(self.launchers[node_rank].pid):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() == title:
                    return pid
            except OSError:
                continue
        raise AssertionError(f"no {title} under the launcher of node rank {node_rank}")

    def ssh_args(self) -> list[str]:
        return [
            "--ssh-config", str(self.cluster.ssh_config), "--remote-hangwatch", str(self.cluster.hangwatch),
        ]  # fmt: skip


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, sglang_python: Path, sglang_tiny_model: Path
) -> Iterator[TwoNodeServer]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("sglang-nodes")
    cluster = EmulatedNodes(work, count=2).start()
    try:
        master = cluster.nodes[0].address
        launchers, logs = [], []
        started = time.monotonic()
        for rank, node in enumerate(cluster.nodes):
            env = sglang_env.sglang_server_env(os.environ)
            # One TP rank per node, each bound to its own core of the two.
            env["SGLANG_CPU_OMP_THREADS_BIND"] = str(rank)
            env["SGLANG_HOST_IP"] = node.address
            env["GLOO_SOCKET_IFNAME"] = "eth0"
            cmd = sglang_env.sglang_server_cmd(
                sglang_python, sglang_tiny_model, PORT,
                extra=("--tp", "2", "--nnodes", "2", "--node-rank", str(rank),
                       "--dist-init-addr", f"{master}:{DIST_PORT}"),
            )  # fmt: skip
            log = work / f"node{rank}.log"
            logs.append(log)
            with log.open("wb") as out:
                launchers.append(cluster.run_on(node, cmd, env=env, stdout=out, stderr=subprocess.STDOUT))

        def ready() -> bool:
            for rank, p in enumerate(launchers):
                if p.poll() is not None:
                    tail = logs[rank].read_text(errors="replace").splitlines()[-30:]
                    raise AssertionError(f"node rank {rank} exited {p.returncode}:\n" + "\n".join(tail))
            return READY_LINE in logs[0].read_text(errors="replace")

        wait_until(ready, BOOT_S, interval=1.0, what="SGLang across two nodes to serve")
        yield TwoNodeServer(cluster, launchers, logs, round(time.monotonic() - started, 1))
    finally:
        # Every process was started through run_on: close() kills them descendants first, then each
        # node's pid 1 (whatever is left in its PID namespace, the tmpfs /dev/shm with the namespace).
        for p in cluster.started:
            for pid in descendants(p.pid):
                if proc_state(pid) == "T":
                    os.kill(pid, signal.SIGCONT)  # a stopped scheduler cannot act on its SIGTERM
        cluster.close()
    assert cluster.leftovers() == []


def _stacks(server: TwoNodeServer, tmp_path: Path, hosts: str = "hwnode[1-2]", *extra: str) -> Outcome:
    return run_hangwatch(
        ["stacks", "--hosts", hosts, "--match", "sglang", *server.ssh_args(), "--samples", "1", "--no-native",
         "--node-timeout", "60", *extra],
        tmp_path,
        timeout=120,
    )  # fmt: skip


def _node(report: dict, label: str) -> dict:
    return next(n for n in report["nodes"] if n["label"] == label)


def test_both_schedulers_are_ranks_on_their_node_and_the_dummy_health_is_not_readiness(
    server: TwoNodeServer, tmp_path: Path
) -> None:
    idle = {("hwnode1", 0): "Poller.poll", ("hwnode2", 1): "broadcast"}
    # Idle: TP0 sleeps in its idle poll, TP1 waits in the broadcast of TP0's next requests. A sample can
    # land while the schedulers still run a request (the /health probe of the same command makes SGLang
    # run a one-token generate: TP1 was seen in ReqToTokenPool.write in CI), so up to three samples.
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        started = time.monotonic()
        out = _stacks(server, tmp_path / str(attempt))
        took = time.monotonic() - started
        print(f"boot across two nodes {server.boot_s} s; stacks --hosts {took:.2f} s")
        assert out.rc == 0, out.stderr
        report = out.report
        assert report is not None, out.stderr
        assert [n["outcome"] for n in report["nodes"]] == ["ok", "ok"], report["nodes"]
        ranks = {(r["node"], r["rank"]) for r in report["ranks"]["found"]}
        assert ranks == {("hwnode1", 0), ("hwnode2", 1)}, report["ranks"]
        n1, n2 = _node(report, "hwnode1"), _node(report, "hwnode2")
        assert n1["ranks"] and n2["ranks"] and n1["pid_ns"] != n2["pid_ns"], (n1, n2)
        assert n1["probe"].endswith("HTTP 200"), n1["probe"]
        # Node 1's /health is SGLang's dummy server: it answers 200, and is marked so that it never counts.
        assert "HTTP 200 (SGLang's dummy health server" in n2["probe"], n2["probe"]
        where = {(r["node"], r["rank"]): r["where"] for r in report["ranks"]["found"]}
        if where == idle:
            break
        time.sleep(2)
    assert where == idle, where
    assert "hwnode2:TP1" in out.stdout and "hwnode1:TP0" in out.stdout, out.stdout


def test_attach_is_ready_from_node_0_and_never_from_node_1s_dummy_health(
    server: TwoNodeServer, tmp_path: Path
) -> None:
    (tmp_path / "both").mkdir()
    (tmp_path / "alone").mkdir()
    both = run_hangwatch(
        ["attach", "--hosts", "hwnode[1-2]", "--match", "sglang", *server.ssh_args(), "--window", "12",
         "--stall-after", "30", "--quiet"],
        tmp_path / "both", timeout=120,
    )  # fmt: skip
    assert both.report is not None, both.stderr
    assert both.report["verdict"]["state"] == "ready", both.stdout
    # Node 1 alone answers only the dummy /health: no readiness, the watch runs out its window.
    alone = run_hangwatch(
        ["attach", "--hosts", "hwnode2", "--match", "sglang", *server.ssh_args(), "--window", "6",
         "--stall-after", "30", "--quiet"],
        tmp_path / "alone", timeout=120,
    )  # fmt: skip
    assert alone.report is not None, alone.stderr
    assert alone.report["verdict"]["state"] != "ready", alone.stdout
    events = " ".join(alone.report["nodes"][0]["events"])
    assert "left out" in events and "dummy" in events.lower(), alone.report["nodes"]


def test_a_stopped_scheduler_on_node_1_is_found_with_its_node_and_rank(
    server: TwoNodeServer, tmp_path: Path
) -> None:
    tp1 = server.scheduler(1)
    os.kill(tp1, signal.SIGSTOP)
    request = None
    try:
        # One request to node 0: TP0 runs the forward and waits for TP1 in the step's collective.
        body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4}})
        send = (
            "import sys, urllib.request as u; u.urlopen(u.Request(sys.argv[2], data=sys.argv[1].encode(), "
            "headers={'Content-Type': 'application/json'}), timeout=120).read()"
        )
        request = server.cluster.run_on(
            server.cluster.nodes[0],
            [sys.executable, "-c", send, body, f"http://127.0.0.1:{PORT}/generate"],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(3)  # the request reaches TP0's forward
        out = _stacks(server, tmp_path)
        assert out.rc == 0, out.stderr
        report = out.report
        assert report is not None, out.stderr
        diagnosis = report["diagnosis"]
        assert diagnosis["cause"] == "stopped", (diagnosis, out.stdout)
        (culprit,) = diagnosis["culprits"]
        where = report["processes"][str(culprit)]
        assert where["node"] == "hwnode2" and where["pid_ns"] == _node(report, "hwnode2")["pid_ns"], where
        assert "hwnode2:TP1 stopped" in diagnosis["explanation"], diagnosis
        assert "hwnode1:TP0 waiting in broadcast" in diagnosis["explanation"], diagnosis
    finally:
        os.kill(tp1, signal.SIGCONT)
        if request is not None:
            kill_tree(request)  # nsenter and the client it forked into the node
            server.cluster.started.remove(request)
