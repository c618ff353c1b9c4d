"""``hangwatch stacks --ray URL`` against a real local Ray head (the Ray venv of scripts/setup-ray.sh).

Three vLLM-like ``RayWorkerWrapper`` actors in one gloo group; rank 2 never joins the all_reduce the
others wait in. With profiling enabled on the head the stacks come through the dashboard's traceback
endpoint and the merged verdict names rank 2; with profiling off (Ray 2.60's default) the endpoint's
403 is said, with the variable that would lift it, and the ssh fallback's failure (no sshd at the
head's address here) is that node's evidence, not a crash.

The head is ours alone: its own ports and temp dir, ``ray start --block`` in a session of its own,
stopped with its whole tree (never ``ray stop``, which would stop every Ray on the machine), and
checked gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hwrun import run_hangwatch
from proc_helpers import kill_tree
from proc_helpers import wait_until
from ray_env import ray_python

pytestmark = [pytest.mark.timeout(300), pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs"


def start_head(tmp: Path, py: Path, profiling: bool, gcs: int, dash: int) -> subprocess.Popen:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{py.parent}:{os.environ['PATH']}"}
    env.pop("RAY_DASHBOARD_ENABLE_PROFILING", None)
    if profiling:
        env["RAY_DASHBOARD_ENABLE_PROFILING"] = "1"
    argv = [
        str(py.parent / "ray"),
        "start",
        "--head",
        "--block",
        "--num-cpus",
        "1",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(gcs),
        "--dashboard-port",
        str(dash),
        "--dashboard-host",
        "127.0.0.1",
        "--temp-dir",
        str(tmp / "ray"),
        "--disable-usage-stats",
        "--include-dashboard",
        "true",
    ]
    return subprocess.Popen(
        argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def ours_left(tmp: Path) -> list[int]:
    """Processes whose command line names our head's temp dir."""
    left = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(tmp / "ray").encode() in (d / "cmdline").read_bytes():
                    left.append(int(d.name))
            except OSError:
                pass
    return left


def head(
    tmp_path_factory: pytest.TempPathFactory, profiling: bool, gcs: int, dash: int
) -> Iterator[tuple[str, float]]:
    py = ray_python()
    tmp = Path(
        f"/tmp/hwray{os.getpid()}{'p' if profiling else 'n'}"
    )  # short: Ray's socket paths have a limit
    tmp.mkdir(exist_ok=True)
    proc = start_head(tmp, py, profiling, gcs, dash)
    url = f"http://127.0.0.1:{dash}"
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{url}/api/v0/nodes", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 90, interval=0.5, what="the Ray dashboard")
        ready = tmp / "ready"
        ready.mkdir(exist_ok=True)
        start = time.monotonic()
        subprocess.run(
            [
                str(py),
                str(PROGRAMS / "ray_workers.py"),
                "--address",
                f"127.0.0.1:{gcs}",
                "--port",
                str(gcs + 7),
                "--ready-dir",
                str(ready),
            ],
            check=True,
            timeout=150,
            capture_output=True,
        )
        wait_until(lambda: len(list(ready.glob("rank*"))) == 3, 30, what="three actors in the group")
        time.sleep(1.0)  # the two waiting ranks are inside all_reduce
        yield url, time.monotonic() - start
    finally:
        kill_tree(proc)
        wait_until(lambda: not ours_left(tmp), 30, interval=0.5, what="our Ray processes gone")
        shutil.rmtree(tmp, ignore_errors=True)  # the head's sessions and logs: ours, so gone too


@pytest.fixture(scope="module")
def head_profiling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    yield from head(tmp_path_factory, True, 6411, 8311)


@pytest.fixture(scope="module")
def head_default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    yield from head(tmp_path_factory, False, 6421, 8321)


def test_traceback_endpoint_names_the_actor_that_skips_the_collective(head_profiling, tmp_path: Path) -> None:
    url, _ = head_profiling
    out = run_hangwatch(["stacks", "--ray", url, "--samples", "2", "--every", "0.5", "--no-native"], tmp_path)
    assert out.rc == 0, out.stderr
    report = out.report
    assert report is not None, out.stderr
    assert any("/worker/traceback" in n for n in report["notes"]), report["notes"]
    assert [n["outcome"] for n in report["nodes"]] == ["ok"]
    assert sorted(r["rank"] for r in report["ranks"]["found"]) == [0, 1, 2]
    assert report["ranks"]["missing"] == []
    culprits = {report["processes"][str(k)]["pid"] for k in report["diagnosis"]["culprits"]}
    rank2 = next(r for r in report["ranks"]["found"] if r["rank"] == 2)
    assert culprits == {rank2["pid"]}, (report["diagnosis"], out.stdout)
    waiting = [r["where"] for r in report["ranks"]["found"] if r["rank"] != 2]
    assert all("all_reduce" in w for w in waiting), waiting


def test_profiling_off_says_403_and_what_enables_it_then_falls_back(head_default, tmp_path: Path) -> None:
    url, _ = head_default
    out = run_hangwatch(
        ["stacks", "--ray", url, "--no-native", "--node-timeout", "8", "--ssh-option", "ConnectTimeout=2"],
        tmp_path,
    )
    report = out.report
    assert report is not None, out.stderr
    notes = " ".join(report["notes"])
    assert "403" in notes and "RAY_DASHBOARD_ENABLE_PROFILING=1" in notes, notes
    assert "ssh" in notes
    # No sshd answers at the head's address here: the fallback ran and its failure is that node's evidence.
    [node] = report["nodes"]
    rows = httpx.get(f"{url}/api/v0/nodes", timeout=5).json()["data"]["result"]["result"]
    assert node["host"] == rows[0]["node_ip"]  # the address the state API gave, not the dashboard's
    assert node["outcome"] != "ok", node
    assert "RAY_DASHBOARD_ENABLE_PROFILING" in out.stdout


def test_dashboard_that_does_not_answer_is_said(tmp_path: Path) -> None:
    out = run_hangwatch(["stacks", "--ray", "http://127.0.0.1:9", "--node-timeout", "3"], tmp_path)
    assert out.rc != 0
    assert "did not answer" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


def test_attach_ray_reads_the_nodes_over_ssh_and_says_why_it_could_not(head_default, tmp_path: Path) -> None:
    """The real head's state API gives the node and the actors' pids; no sshd answers at its address here,
    so the watch has nothing to judge progress by and must say so as that node's evidence."""
    url, _ = head_default
    out = run_hangwatch(
        ["attach", "--ray", url, "--window", "20", "--node-timeout", "8", "--ssh-option", "ConnectTimeout=2",
         "--quiet"],
        tmp_path,
        timeout=120,
    )  # fmt: skip
    report = out.report
    assert report is not None, out.stderr
    assert report["selector"].startswith(f"--ray {url}"), report["selector"]
    rows = httpx.get(f"{url}/api/v0/nodes", timeout=5).json()["data"]["result"]["result"]
    [node] = report["nodes"]
    assert node["host"] == rows[0]["node_ip"]  # the address the state API gave
    assert node["rounds_answered"] == 0 and node["last_outcome"] != "ok", node
    evidence = " ".join(report["verdict"]["evidence"])
    assert f"{node['host']}" in evidence and node["last_outcome"] in evidence, report["verdict"]
    if node["last_outcome"] in ("refused", "auth", "host-key", "no-collector", "unreachable"):
        assert "over ssh" in report["verdict"]["summary"], report["verdict"]
