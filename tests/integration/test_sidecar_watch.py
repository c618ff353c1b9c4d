"""``hangwatch watch``, the sidecar, over real processes on loopback: a program that hangs, one whose stall
ends, a server that wedges while serving, and a server the sidecar waits for. Its probes are asked over
HTTP and through ``hangwatch probe``; its metrics parsed as Prometheus text. The watched processes are
never signalled by the sidecar: each is checked alive after it; every tree is stopped by the test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hwrun import hangwatch_argv
from hwrun import program
from proc_helpers import free_port
from proc_helpers import spawn
from proc_helpers import wait_for_file
from proc_helpers import wait_until

pytestmark = pytest.mark.timeout(150)


def get(base: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(base + path, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def metrics(base: str) -> dict[str, float]:
    """Each sample as ``name{k=v,...}`` -> value."""
    out = {}
    for family in text_string_to_metric_families(get(base, "/metrics")[1]):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


@contextmanager
def sidecar(tmp_path: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``hangwatch watch`` on a free loopback port; yields its base URL. Stopped with SIGTERM after."""
    port = free_port()
    argv = hangwatch_argv("watch", "--quiet", "--listen", f"127.0.0.1:{port}",
                          "--evidence-dir", str(tmp_path / "evidence"), *args)  # fmt: skip
    with spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as popen:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(base) or popen.poll() is not None, 30, what="the sidecar to listen")
        assert popen.poll() is None, popen.stdout.read() if popen.stdout else ""
        yield base, popen
        popen.send_signal(signal.SIGTERM)
        assert popen.wait(timeout=20) == 0


def _answers(base: str) -> bool:
    try:
        return get(base, "/")[0] == 200
    except OSError:
        return False


def reading(base: str) -> str:
    health = json.loads(get(base, "/verdict")[1])["health"]
    return health["reading"] if health else "none"


def test_a_hang_fails_startup_keeps_liveness_and_leaves_its_evidence(tmp_path):
    log = tmp_path / "server.log"
    ready = tmp_path / "ready"
    with (
        log.open("w") as out,
        spawn(
            program("progress_then_hang", "--seconds", "3", "--ready-file", str(ready)),
            stdout=out,
            stderr=out,
        ) as server,
    ):
        with sidecar(tmp_path, "--pid", str(server.pid), "--log", str(log), "--stall-after", "6") as (
            base,
            _,
        ):
            assert get(base, "/startup")[0] == 200  # still progressing
            assert get(base, "/ready")[0] == 503  # never ready yet
            wait_until(lambda: reading(base) == "stalled", 40, interval=0.5, what="the stall")
            code, said = get(base, "/startup")
            assert code == 503 and "stalled" in said and "time_sleep" in said, said
            # Before ready, a stall is the startup probe's to judge: liveness must not restart a boot.
            code, said = get(base, "/live")
            assert code == 200 and "startup probe" in said, said
            m = metrics(base)
            assert m["hangwatch_state{state=stalled}"] == 1.0 and m["hangwatch_stalls_total"] == 1.0
            assert m["hangwatch_up"] == 1.0 and m["hangwatch_quiet_seconds"] >= 6
            probe = subprocess.run(
                hangwatch_argv("probe", "--kind", "startup", "--url", base), capture_output=True, text=True
            )
            assert probe.returncode == 1 and probe.stdout.startswith("startup: stalled"), probe.stdout
            assert len(probe.stdout) < 1024
            evidence = wait_until(lambda: list((tmp_path / "evidence").glob("stall-1-*.json")), 10)
            report = json.loads(evidence[0].read_text())
            assert report["verdict"]["state"] == "stalled" and report["stacks"], report["verdict"]
            # A preStop hook's dump: the whole report again, now, its path said.
            dumped = subprocess.run(hangwatch_argv("dump", "--url", base), capture_output=True, text=True)
            assert dumped.returncode == 0, dumped.stdout + dumped.stderr
            path = Path(dumped.stdout.strip())
            assert path.parent == tmp_path / "evidence" and path.name.startswith("dump-"), path
            assert json.loads(path.read_text())["verdict"]["state"] == "stalled"
        assert server.poll() is None  # never signalled: still there after the sidecar stopped


def test_a_stall_that_ends_turns_back_to_progressing_and_counts_a_recovery(tmp_path):
    """Started before the server: the sidecar waits for its match (the probes pass open meanwhile), then
    reads it stall and recover (a long GC, a late peer)."""
    log = tmp_path / "server.log"
    tag = f"recovering-{os.getpid()}"
    with sidecar(tmp_path, "--match", tag, "--log", str(log), "--stall-after", "5") as (base, _):
        code, said = get(base, "/live")
        assert code == 200 and "no process matches" in said, said
        assert get(base, "/ready")[0] == 503
        argv = program("progress_then_hang", "--seconds", "2", "--resume-after", "14", "--ready-file", tag)
        with log.open("w") as out, spawn(argv, stdout=out, stderr=out, cwd=tmp_path) as server:
            wait_until(lambda: reading(base) == "stalled", 40, interval=0.5, what="the stall")
            wait_until(lambda: reading(base) == "progressing", 40, interval=0.5, what="the recovery")
            m = metrics(base)
            assert m["hangwatch_recoveries_total"] == 1.0 and m["hangwatch_stalls_total"] == 1.0
            assert get(base, "/startup")[0] == 200
            assert server.poll() is None


def test_a_wedge_while_serving_fails_liveness_and_readiness(tmp_path):
    """A server that answers /health but never a completion: ready, then a client's request waits for
    the stall window and liveness fails (the kubelet would restart it); readiness with it."""
    port = free_port()
    ready = tmp_path / "ready"
    argv = program("stub_openai", "--port", str(port), "--wedge-after", "0", "--ready-file", str(ready))
    with spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as server:
        wait_for_file(ready, 30, server)
        args = (
            "--pid",
            str(server.pid),
            "--ready-url",
            f"http://127.0.0.1:{port}/health",
            "--stall-after",
            "6",
        )
        with sidecar(tmp_path, *args) as (base, _):
            wait_until(lambda: get(base, "/ready")[0] == 200, 30, interval=0.5, what="ready")
            assert get(base, "/live")[0] == 200
            body = json.dumps({"model": "stub-model", "prompt": "hi", "max_tokens": 4, "stream": True})
            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                client.sendall(
                    f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
                )
                wait_until(lambda: get(base, "/live")[0] == 503, 40, interval=0.5, what="liveness to fail")
            said = get(base, "/live")[1]
            assert "stalled while serving" in said, said
            assert get(base, "/ready")[0] == 503
            m = metrics(base)
            assert m["hangwatch_serving"] == 1.0 and m["hangwatch_readiness_probe_green"] == 1.0
        assert server.poll() is None


def test_a_launched_tree_is_kept_through_a_stall_stopped_with_the_sidecar_and_its_status_passed_on(tmp_path):
    """`hangwatch watch -- CMD`, a container's entrypoint: a stall fails the probe but stops nothing (the
    orchestrator decides); the sidecar's stop stops the tree; a command that ends by itself ends the
    sidecar with its status."""
    command = program("progress_then_hang", "--seconds", "2")
    with sidecar(tmp_path, "--stall-after", "4", "--", *command) as (base, _):
        wait_until(lambda: reading(base) == "stalled", 40, interval=0.5, what="the stall")
        assert get(base, "/startup")[0] == 503
        health = json.loads(get(base, "/verdict")[1])["health"]
        root = int(health["target"].split()[1])
        assert psutil.pid_exists(root) and psutil.Process(root).status() != psutil.STATUS_ZOMBIE
    # The sidecar was stopped (SIGTERM, exit 0): the tree it launched is gone with it.
    wait_until(lambda: not psutil.pid_exists(root), 10, what="the launched tree to be stopped")
    assert (tmp_path / "evidence" / "output.log").is_file()
    done = subprocess.run(
        hangwatch_argv("watch", "--quiet", "--listen", "127.0.0.1:0", "--evidence-dir", str(tmp_path / "e2"),
                       "--", sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(3)"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
