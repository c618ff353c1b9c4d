"""``attach --ray URL`` without a Ray cluster: a fake dashboard over real HTTP, a stand-in ``ssh``.

The dashboard is a loopback HTTP server answering the state API's two reads (``/api/v0/nodes``,
``/api/v0/actors``) in the shapes Ray 2.60 gives, with profiling off (``/worker/traceback`` 403). Its
actors are real sleeping processes this test starts, so the collector that the stand-in ``ssh`` runs on
this machine (``sh -c`` of the remote command, as sshd would) reads real /proc and real stacks. What must
hold: each live Ray node is read through one ``collect --stream`` session for exactly its actor pids, the
ranks and roles are Ray's, a node Ray calls DEAD is that node's evidence with the ranks it hides, and when
no node can be read over ssh (Ray needs no sshd) the watch says so at once instead of waiting out --window.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import hangwatch
from hangwatch.model.nodes import NodeOutcome
from hangwatch.nodes.ray import SilentSession
from hangwatch.nodes.ray import ray_watch_targets
from hangwatch.nodes.watch import NodesAttachOptions
from hangwatch.nodes.watch import open_fanout
from hangwatch.transports.ray import RayOptions
from hangwatch.transports.ssh import SshOptions
from loopback_http import QuietHandler
from loopback_http import serving
from proc_helpers import kill_tree

SRC = str(Path(hangwatch.__file__).resolve().parents[1])
LIVE_NODE, DEAD_NODE = "a" * 56, "b" * 56
LIVE_IP, DEAD_IP = "10.77.0.1", "10.77.0.2"

# Runs the remote command here, as sshd on the node would; HW_FAKE_SSH_REFUSE=all says what a node
# without sshd says (a Ray cluster needs none).
FAKE_SSH = """#!/bin/sh
for last; do :; done
if [ "$HW_FAKE_SSH_REFUSE" = all ]; then
  echo "ssh: connect to host $(printf '%s\\n' "$@" | tail -n 2 | head -n 1) port 22: Connection refused" >&2
  exit 255
fi
exec sh -c "$last"
"""


@dataclass
class Dashboard:
    url: str
    nodes: list[dict[str, Any]]
    actors: list[dict[str, Any]]
    paths: list[str]


def _state_api(rows: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {"result": True, "msg": "", "data": {"result": {"total": len(rows), "result": rows}}}
    ).encode()


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two processes standing in for vLLM's worker actors on the live node (started here, killed here)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        for _ in range(2)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            kill_tree(p)


@pytest.fixture
def dashboard(sleepers: list[subprocess.Popen[bytes]]) -> Iterator[Dashboard]:
    nodes = [
        {
            "node_id": LIVE_NODE,
            "node_ip": LIVE_IP,
            "node_name": LIVE_IP,
            "state": "ALIVE",
            "is_head_node": True,
        },
        {
            "node_id": DEAD_NODE,
            "node_ip": DEAD_IP,
            "node_name": DEAD_IP,
            "state": "DEAD",
            "is_head_node": False,
        },
    ]
    actors = [
        {"actor_id": f"act{i}", "class_name": "RayWorkerWrapper", "name": f"vllm_Worker_x_TP{i}",
         "pid": p.pid, "node_id": LIVE_NODE, "state": "ALIVE"}
        for i, p in enumerate(sleepers)
    ] + [
        {"actor_id": "act2", "class_name": "RayWorkerWrapper", "name": "vllm_Worker_x_TP2",
         "pid": 4242, "node_id": DEAD_NODE, "state": "DEAD"},
        {"actor_id": "drv", "class_name": "SomethingElse", "name": "", "pid": 1, "node_id": LIVE_NODE,
         "state": "ALIVE"},
    ]  # fmt: skip
    paths: list[str] = []

    class Handler(QuietHandler):
        def do_GET(self) -> None:  # http.server calls it by this name
            paths.append(self.path)
            if self.path.startswith("/api/v0/nodes"):
                self.answer(200, _state_api(nodes))
            elif self.path.startswith("/api/v0/actors"):
                self.answer(200, _state_api(actors))
            elif self.path.startswith("/worker/traceback"):
                self.answer(403, b"Profiling is disabled by default for security reasons.")
            else:
                self.answer(404, b"not found")

    with serving(Handler) as url:
        yield Dashboard(url, nodes, actors, paths)


@pytest.fixture
def fake_ssh_dir(tmp_path: Path) -> Path:
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    return tmp_path


def _env(fake_ssh_dir: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{fake_ssh_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": SRC,
        **extra,
    }


def test_each_live_node_gets_one_session_for_its_actor_pids_and_a_dead_node_is_evidence(
    dashboard: Dashboard,
    sleepers: list[subprocess.Popen[bytes]],
    fake_ssh_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", SRC)
    ssh = SshOptions(
        ssh=str(fake_ssh_dir / "ssh"), remote=(sys.executable, "-m", "hangwatch"), connect_timeout_s=2
    )
    base = NodesAttachOptions(
        hosts=(), match="", engine=None, window_s=30.0, stall_after_s=10.0, ready_url=None, interval_s=1.0,
        stacks=True, quiet=True, ssh=ssh, report_json=None, ray=RayOptions(dashboard.url),
    )  # fmt: skip
    o, fanout = open_fanout(base)
    try:
        assert o.hosts == (LIVE_IP, DEAD_IP)  # the nodes as the state API addressed them
        census, full = fanout.census(), fanout.stacks(native=False)
        census2 = fanout.census()
    finally:
        fanout.close()
    live, dead = census
    assert live.outcome is NodeOutcome.OK, live.detail
    assert live.bundle is not None
    ranks = {p.pid: (p.rank, p.rank_source, p.role, p.world_size) for p in live.bundle.processes}
    # Exactly the actors' pids (not the driver's, not anything matched by a pattern), with Ray's ranks.
    assert ranks == {
        sleepers[0].pid: ("0", "ray_actor_name", "ray_actor:RayWorkerWrapper", 3),
        sleepers[1].pid: ("1", "ray_actor_name", "ray_actor:RayWorkerWrapper", 3),
    }
    assert dead.outcome is NodeOutcome.UNREACHABLE and dead.bundle is None
    assert "DEAD in the state API" in dead.detail and "rank2" in dead.detail, dead.detail
    # The stack round through the same session: real stacks of the sleeping actors, with Ray's ranks.
    assert full[0].bundle is not None and full[0].bundle.stacks
    dumped = {p.pid: p for p in full[0].bundle.stacks[0].processes}
    assert set(dumped) == {s.pid for s in sleepers}
    assert {p.rank for p in dumped.values()} == {"0", "1"}
    leaves = [t.frames[-1].name for p in dumped.values() for t in p.threads if t.frames]
    assert leaves and all("sleep" in f or f == "<module>" for f in leaves), leaves
    assert census2[0].outcome is NodeOutcome.OK
    # One remote collector for the whole watch; the dead node never opened one.
    sessions = fanout.sessions.sessions
    assert sessions[0].started == 1 and isinstance(sessions[1], SilentSession)


def test_attach_ray_through_the_cli_reports_rays_ranks_and_the_dead_node(
    dashboard: Dashboard, sleepers: list[subprocess.Popen[bytes]], fake_ssh_dir: Path, tmp_path: Path
) -> None:
    report = tmp_path / "r.json"
    cmd = [
        sys.executable, "-m", "hangwatch", "attach", "--ray", dashboard.url, "--window", "3600",
        "--stall-after", "4", "--interval", "1", "--remote-hangwatch", f"{sys.executable} -m hangwatch",
        "--report-json", str(report), "--quiet",
    ]  # fmt: skip
    # The stall ends the watch: waiting out the hour's window would raise TimeoutExpired.
    out = subprocess.run(
        cmd, env=_env(fake_ssh_dir), capture_output=True, text=True, timeout=300, check=False
    )
    data = json.loads(report.read_text())
    assert data["selector"].startswith(f"--ray {dashboard.url}"), data["selector"]
    # Two sleeping actors do nothing: a stall, judged over the live node's readings.
    assert data["verdict"]["state"] == "stalled", out.stdout + out.stderr
    nodes = {n["host"]: n for n in data["nodes"]}
    assert nodes[LIVE_IP]["rounds_failed"] == 0 and nodes[LIVE_IP]["processes"] == 2
    assert nodes[DEAD_IP]["rounds_answered"] == 0 and nodes[DEAD_IP]["last_outcome"] == "unreachable"
    assert any(e.startswith(f"{DEAD_IP} stopped answering") for e in data["verdict"]["evidence"])
    pids = {(k["node"], k["pid"]) for k in data["processes"].values()}
    assert pids == {(LIVE_IP, s.pid) for s in sleepers}
    # Profiling is off on this head, and the watch never needed the traceback endpoint.
    assert not any(p.startswith("/worker/traceback") for p in dashboard.paths)


def test_when_no_node_has_sshd_the_watch_says_so_at_once(
    dashboard: Dashboard, fake_ssh_dir: Path, tmp_path: Path
) -> None:
    report = tmp_path / "r.json"
    cmd = [
        sys.executable, "-m", "hangwatch", "attach", "--ray", dashboard.url, "--window", "3600",
        "--remote-hangwatch", f"{sys.executable} -m hangwatch", "--report-json", str(report), "--quiet",
    ]  # fmt: skip
    # The watch ends by itself once no node can be read: waiting out the hour's window would raise
    # TimeoutExpired. No bound on how fast, which a loaded machine would break.
    out = subprocess.run(
        cmd, env=_env(fake_ssh_dir, HW_FAKE_SSH_REFUSE="all"), capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert out.returncode == 130, out.stdout + out.stderr
    verdict = json.loads(report.read_text())["verdict"]
    assert (
        "over ssh" in verdict["summary"] and "no node of the Ray cluster could be read" in verdict["summary"]
    )
    assert f"{LIVE_IP}: refused: nothing listens for ssh there" in " ".join(verdict["evidence"]), verdict
    assert any("DEAD in the state API" in e for e in verdict["evidence"])
    assert "no node of the Ray cluster could be read" in out.stdout


def test_a_dashboard_that_does_not_answer_is_one_line(fake_ssh_dir: Path) -> None:
    cmd = [sys.executable, "-m", "hangwatch", "attach", "--ray", "http://127.0.0.1:9", "--window", "5"]
    out = subprocess.run(cmd, env=_env(fake_ssh_dir), capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ray: the Ray dashboard at http://127.0.0.1:9 did not answer" in out.stderr, out.stderr


def test_ray_targets_need_no_match_and_refuse_one(dashboard: Dashboard, fake_ssh_dir: Path) -> None:
    targets = ray_watch_targets(
        RayOptions(dashboard.url), ("RayWorkerWrapper",), SshOptions(), ["--every", "0.1"]
    )
    argv = targets.sessions[0].argv
    assert "--match" not in argv[-1] and "--pid" in argv[-1] and argv[-1].endswith("--stream")
    cmd = [sys.executable, "-m", "hangwatch", "attach", "--ray", dashboard.url, "--match", "x"]
    out = subprocess.run(cmd, env=_env(fake_ssh_dir), capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "drop --match" in out.stderr, out.stderr
