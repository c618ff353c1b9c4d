"""End-to-end: llama-cpp-python 0.3.36's OpenAI server on a tiny random GGUF, under `hangwatch run`.

The third engine profile (engines/llamacpp.py) on its real process: one Python process, no ranks, whose
model load runs in its main thread and whose requests run llama.cpp in an AnyIO worker thread. Measured on
the 2-core CI machine (docs/engine-facts.md, "llama.cpp"): launch to "Uvicorn running on" in about 1 s, so
each test here is its stall window plus a few seconds.

Faults come from tests/faults/sitecustomize.py (HANGWATCH_FAULT, the fault matrix's injector) on the
server's PYTHONPATH: a call in llama-cpp-python's path blocks forever, the way a wedged backend does.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hangwatch_run import HangwatchRun
from hangwatch_run import describe
from hangwatch_run import load_report
from hangwatch_run import report_pids

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

FAULTS = Path(__file__).resolve().parents[1] / "faults"
# Far above a measured boot (about 1 s) so only a real regression reaches it.
BOOT_TIMEOUT_S = 120
# The window a stall waits out; the boot has no silent import long enough to reach it (about 0.5 s).
STALL_AFTER_S = 10
READY_LINE = "Uvicorn running on"
FIRED = "hangwatch-fault: fired"
# Where llama-cpp-python calls into llama.cpp: model load (context creation) and each forward pass.
CONTEXT_INIT = "llama_cpp._internals:LlamaContext.__init__"
DECODE = "llama_cpp._internals:LlamaContext.decode"


def server_cmd(python: Path, model: Path, port: int) -> list[str]:
    return [
        str(python), "-m", "llama_cpp.server",
        "--model", str(model),
        "--host", "127.0.0.1",  # loopback only
        "--port", str(port),
    ]  # fmt: skip


def fault_env(base: dict[str, str], fault: str | None) -> dict[str, str]:
    env = dict(base)
    if fault is not None:
        env["HANGWATCH_FAULT"] = fault
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAULTS), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def hangwatch_run(
    python: Path, model: Path, port: int, env: dict[str, str], tmp_path: Path, *extra: str
) -> Iterator[HangwatchRun]:
    """`hangwatch run` on the server (no --engine: detected from the command line); every process it
    started is killed on the way out, whatever failed."""
    args = [
        "--stall-after", str(STALL_AFTER_S),
        "--timeout", str(BOOT_TIMEOUT_S),
        "--grace", "2",  # uvicorn waits for a wedged request forever on SIGTERM: SIGKILL follows
        "--report-json", str(tmp_path / "report.json"),
        "--run-dir", str(tmp_path / "run"),
        *extra,
        "--",
        *server_cmd(python, model, port),
    ]  # fmt: skip
    run = HangwatchRun(args, env, tmp_path / "hangwatch.log")
    try:
        yield run
    finally:
        run.kill_all()


def finish(run: HangwatchRun, tmp_path: Path, timeout: float) -> tuple[int, dict[str, Any], str]:
    rc = run.wait(timeout)
    assert rc is not None, f"hangwatch still running after {timeout:.0f} s\n{run.tail()}"
    report = load_report(tmp_path / "report.json", run)
    context = describe(report, run)
    survivors = run.survivors(report_pids(report))
    assert not survivors, "processes outlived hangwatch:\n" + "\n".join(survivors) + f"\n{context}"
    return rc, report, context


def stalled_on_the_server(report: dict[str, Any], context: str) -> dict[str, Any]:
    verdict: dict[str, Any] = report["verdict"]
    assert report["engine"] == "llamacpp", context
    assert verdict["state"] == "stalled", context
    servers = [p["pid"] for p in report["processes"] if p.get("role") == "server"]
    assert len(servers) == 1, f"one server process expected: {report['processes']}\n{context}"
    assert verdict["culprits"] == servers, context
    return verdict


@pytest.mark.timeout(600, func_only=True)  # func_only: the first session's venv build is not a boot
def test_boot_reaches_ready_through_llamacpp_phases(
    llamacpp_python: Path,
    llamacpp_tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    with hangwatch_run(
        llamacpp_python, llamacpp_tiny_model, free_port, hangwatch_env, tmp_path, "--until-ready"
    ) as run:
        rc, report, context = finish(run, tmp_path, BOOT_TIMEOUT_S + 60)
        assert rc == 0, f"exit {rc}, expected 0 (ready)\n{context}"
        assert report["engine"] == "llamacpp", context
        assert report["verdict"]["state"] == "ready", context
        # All of it within a second or two; each line opens its phase, in this order.
        names = [p["name"] for p in report["phases"]]
        assert names == ["process_start", "metadata", "weights", "context", "http_starting", "ready"], context
        # One process, the server: its threads (event loop, AnyIO workers, OpenMP) are no ranks.
        assert [(p.get("role"), p.get("rank")) for p in report["processes"]] == [("server", None)], context
        # No /health: the probe asks /v1/models, refused until uvicorn binds the port after the load.
        urls = {p.get("url") for p in report["probes"]}
        assert urls <= {f"http://127.0.0.1:{free_port}/v1/models"}, context


@pytest.mark.timeout(300, func_only=True)
def test_a_model_load_wedged_in_context_creation_is_stalled_in_its_phase(
    llamacpp_python: Path,
    llamacpp_tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """llama.cpp mapped the tensors, then creating the context (KV cache, compute buffers) never returns:
    the port never opens, and the single process waits where only its own threads could wake it."""
    env = fault_env(hangwatch_env, f"kind=block;target={CONTEXT_INIT};who=any")
    with hangwatch_run(llamacpp_python, llamacpp_tiny_model, free_port, env, tmp_path) as run:
        rc, report, context = finish(run, tmp_path, BOOT_TIMEOUT_S + 60)
        assert rc != 0, context
        assert any(FIRED in line for line in run.lines), f"the fault never fired\n{context}"
        verdict = stalled_on_the_server(report, context)
        # The last phase line was the tensors' (the context's own first line never came).
        assert verdict["phase"].startswith("weights"), context
        assert "before creating the context" in verdict["phase"], context
        # Decided from the stacks before the window ran out: the main thread waits untimed, unchanged,
        # on something only the process's own threads could end. (The cause is not pinned: hangwatch
        # calls one thread's wait on itself a wait-cycle, worded for processes waiting on each other.)
        assert "stacks:" in " ".join(verdict["decided_by"]), context
        assert f"server[{verdict['culprits'][0]}]: a wait of its own threads" in verdict["summary"], context
        # Where: llama-cpp-python's model load, inside the (wrapped) context creation.
        assert chain_in(report["stack_tree"], ("Llama.__init__", "Event.wait")), context


def chain_in(tree: dict[str, Any], names: tuple[str, ...]) -> bool:
    """Whether a path of the report's merged stack tree passes through ``names`` in order (not adjacent)."""

    def walk(node: dict[str, Any], left: tuple[str, ...]) -> bool:
        if left and node.get("name") == left[0]:
            left = left[1:]
        return not left or any(walk(child, left) for child in node.get("children", []))

    return any(walk(root, names) for root in tree.get("roots", []))


def complete_in_background(port: int, timeout: float) -> threading.Thread:
    """A client's completion, sent to loopback from a thread: it is expected never to be answered."""

    def ask() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        body = json.dumps({"prompt": "Hello the server", "max_tokens": 4, "temperature": 0})
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            conn.getresponse().read()
        conn.close()

    thread = threading.Thread(target=ask, name="llamacpp-client", daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(300, func_only=True)
# Both a Python wait and a native one name the worker: a read of a pipe only the server itself writes is a
# wait of its own threads (analyse/waitgraph.py self_waits), not a receive (an xfail until 2026-12-06).
@pytest.mark.parametrize("kind", ["block", "pause"])
def test_a_completion_wedged_in_the_forward_pass_is_stalled_while_serving(
    kind: str,
    llamacpp_python: Path,
    llamacpp_tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """A client's completion enters llama.cpp's forward pass (``LlamaContext.decode``) and never leaves it:
    the request waits, /v1/models waits behind the model's lock, the event loop still takes input.

    ``block``: the wait is Python's (``threading.Event().wait()``); ``pause``: it is in the kernel with no
    Python wait around it (``read`` of a pipe the process holds both ends of), as a wedged native backend is.
    hangwatch's own completion is off, so the only request in flight is the client's."""
    env = fault_env(hangwatch_env, f"kind={kind};target={DECODE};who=any")
    with hangwatch_run(
        llamacpp_python, llamacpp_tiny_model, free_port, env, tmp_path, "--no-own-request"
    ) as run:
        assert run.wait_for_line(READY_LINE, timeout=BOOT_TIMEOUT_S) is not None, run.tail()
        complete_in_background(free_port, timeout=BOOT_TIMEOUT_S)
        rc, report, context = finish(run, tmp_path, BOOT_TIMEOUT_S)
        assert rc != 0, context
        assert any(FIRED in line for line in run.lines), f"the fault never fired\n{context}"
        verdict = stalled_on_the_server(report, context)
        assert verdict["phase"].startswith("ready"), context
        assert verdict["summary"].startswith("stalled while serving"), context
        assert any("sent a request and got no answer" in e for e in verdict["evidence"]), context
        assert verdict["decided_by"] == ["serving:requests-unanswered", "stacks:stuck-handler"], context
        # The stuck thread and where: the worker that runs llama.cpp, not the event loop that still listens.
        assert "thread AnyIO worker thread is stuck in" in verdict["summary"], context
        assert "Fault.fire" in verdict["summary"], context
