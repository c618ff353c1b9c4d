"""A server wedged while serving (failure mode F6): /health stays 200, requests wait, no token comes."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from hwrun import program
from proc_helpers import free_port

pytestmark = pytest.mark.timeout(120)


def _hold_a_stream(port: int, stop: threading.Event) -> None:
    """One streaming request that the stub answers with two tokens, then never finishes."""
    body = {"model": "stub", "prompt": "hello", "max_tokens": 64, "stream": True}
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(5, read=60)) as client,
                client.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as response,
            ):
                for _ in response.iter_lines():
                    if stop.is_set():
                        return
        except httpx.HTTPError:
            time.sleep(0.2)  # not listening yet


def test_wedged_while_serving_is_stalled_with_the_servers_own_counters(hw):
    port = free_port()
    stop = threading.Event()
    client = threading.Thread(target=_hold_a_stream, args=(port, stop), daemon=True)
    client.start()
    try:
        out = hw(
            "run",
            "--quiet",
            "--engine",
            "vllm",
            "--stall-after",
            "6",
            "--no-stacks",
            # The engine's counters are the witness here: hangwatch's own one-token request would be
            # answered (this stub hangs streams after two tokens), proving generation still works.
            "--no-own-request",
            "--",
            *program("stub_openai", "--port", str(port), "--mode", "hang-stream", "--token-interval", "0.05"),
        )
    finally:
        stop.set()
        client.join(timeout=10)
    v = out.verdict
    assert out.rc == 3, json.dumps(v, indent=1)
    assert v["state"] == "stalled"
    assert "while serving" in v["summary"] and "HTTP 200" in v["summary"]
    assert any("1 requests running" in e and "generation tokens frozen" in e for e in v["evidence"])
    assert any(p["status"] == 200 for p in out.report["probes"])  # ready first, wedged after
