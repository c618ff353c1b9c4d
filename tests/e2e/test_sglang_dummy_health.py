"""SGLang's own dummy health server (what its node ranks >= 1 serve, 0.5.23's
``sglang.srt.utils.common.launch_dummy_health_check_server``) recognised by the node collector.

Not a whole engine across two nodes: the function the engine calls on a non-zero node rank, from the
cached SGLang venv, in a process whose command line is a worker node's (``--nnodes 2 --node-rank 1``).
The collector on the "node" must find /health 200 and /v1/models 404 from SGLang's real app, mark the
probe as the dummy server's and keep it out of the watch's ticks.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import sglang_env

from hangwatch.analyse.nodewatch import NodeRounds
from hangwatch.model.nodes import CollectMode
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeResult
from hangwatch.nodes.collector import CollectOptions
from hangwatch.nodes.collector import collect

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

# The engine's main thread blocks while the server runs in a daemon thread (0.5.23): so does this one.
SERVE = """
import sys, time
from sglang.srt.utils.common import launch_dummy_health_check_server
launch_dummy_health_check_server("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1]), False)
time.sleep(600)
"""


def _status(port: int, path: str) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def test_sglangs_real_dummy_health_server_is_never_readiness(sglang_python: Path, free_port: int) -> None:
    token = f"hw-sglang-dummy-{free_port}"
    argv = [str(sglang_python), "-c", SERVE, "-m", "sglang.launch_server", "--nnodes", "2", "--node-rank", "1",
            "--port", str(free_port), token]  # fmt: skip
    # Started through a shell that exits at once: the collector never selects its own children.
    shell = subprocess.run(
        ["sh", "-c", 'exec "$@" >/dev/null 2>&1 </dev/null & echo $!', "sh", *argv],
        env=sglang_env.sglang_server_env({"PATH": "/usr/bin:/bin"}), capture_output=True, text=True, check=True,
    )  # fmt: skip
    pid = int(shell.stdout.split()[0])
    try:
        deadline = time.monotonic() + 180  # importing sglang takes 10-60 s on 2 loaded cores
        while _status(free_port, "/health") != 200:
            assert Path(f"/proc/{pid}").exists(), "the dummy server's process ended"
            assert time.monotonic() < deadline, "the dummy server never answered"
            time.sleep(0.5)
        # Its behaviour, as the collector relies on it: the health routes only.
        assert _status(free_port, "/health_generate") == 200 and _status(free_port, "/v1/models") == 404
        bundle = collect(CollectOptions(match=token, mode=CollectMode.CENSUS, every_s=0.0, engine="sglang"))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # the one process this test started, by its pid
    (probe,) = bundle.probes
    assert probe.probe.status == 200 and probe.node_rank == 1
    assert probe.dummy is not None and "dummy health server" in probe.dummy
    tick = NodeRounds(["node1"]).tick(1.0, [NodeResult("node1", NodeOutcome.OK, "", bundle, 0, 0)])
    assert tick.probes == ()
