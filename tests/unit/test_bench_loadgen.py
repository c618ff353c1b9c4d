"""The load generator on fake HTTP (httpx.MockTransport): SSE framing, timing, error kinds, run bounds."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import AsyncIterator
from collections.abc import Callable

import httpx
import pytest

from hangwatch.bench.loadgen import abort_after
from hangwatch.bench.loadgen import poisson_offsets
from hangwatch.bench.loadgen import prompt_order
from hangwatch.bench.loadgen import run_load
from hangwatch.bench.openai_stream import NotEventStreamError
from hangwatch.bench.openai_stream import SseData
from hangwatch.bench.openai_stream import Target
from hangwatch.bench.openai_stream import build_payload
from hangwatch.bench.openai_stream import list_models
from hangwatch.bench.openai_stream import request_once
from hangwatch.model.bench import Endpoint
from hangwatch.model.bench import ErrorKind
from hangwatch.model.bench import Prompt
from hangwatch.model.bench import Workload

TARGET = Target("http://127.0.0.1:9", "m", Endpoint.COMPLETIONS)
PROMPTS = tuple(Prompt(f"prompt {i}") for i in range(10))


def workload(**changes: object) -> Workload:
    base = {
        "endpoint": Endpoint.COMPLETIONS, "model": None, "requests": 8, "duration_s": None, "concurrency": 2,
        "rate": None, "max_tokens": 4, "temperature": 0.0, "ignore_eos": False, "seed": 0, "rounds": 1,
        "warmup": 0, "prompts": "bundled", "prompt_count": 10, "request_timeout_s": 5.0, "idle_timeout_s": 2.0,
    }  # fmt: skip
    base.update(changes)
    return Workload(**base)  # type: ignore[arg-type]


def chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}], "usage": None}).encode() + b"\n\n"


USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}\n\n'
DONE = b"data: [DONE]\n\n"
GOOD = [chunk("a"), chunk("b"), chunk("c"), chunk("d"), USAGE, DONE]


def sse(
    parts: list[bytes], gap: float = 0.0, ctype: str = "text/event-stream"
) -> Callable[[httpx.Request], object]:
    """A handler streaming ``parts`` ``gap`` seconds apart."""

    async def body() -> AsyncIterator[bytes]:
        for part in parts:
            if gap:
                await asyncio.sleep(gap)
            yield part

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": ctype}, content=body())

    return handler


async def once(handler: Callable[[httpx.Request], object], **changes: object):  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:  # type: ignore[arg-type]
        return await request_once(client, TARGET, Prompt("hi"), workload(**changes))


def test_sse_data_reassembles_lines_split_anywhere_and_skips_comments():
    sse_data = SseData()
    stream = b": ping\r\n\r\n" + chunk("a").replace(b"\n", b"\r\n") + b"event: x\nid: 3\n" + DONE
    out: list[bytes] = []
    for i in range(0, len(stream), 7):
        out += sse_data.feed(stream[i : i + 7])
    assert [json.loads(p)["choices"][0]["text"] if p != b"[DONE]" else "DONE" for p in out] == ["a", "DONE"]
    with pytest.raises(NotEventStreamError):
        SseData().feed(b"<html>\n")


def test_payload_asks_for_usage_and_streams():
    p = build_payload(TARGET, Prompt("hi"), workload(ignore_eos=True, temperature=1.0))
    assert p == {
        "model": "m", "prompt": "hi", "max_tokens": 4, "temperature": 1.0, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True,
    }  # fmt: skip
    chat = build_payload(Target("http://x", "m", Endpoint.CHAT), Prompt("hi"), workload())
    assert chat["messages"] == [{"role": "user", "content": "hi"}]


def test_a_good_stream_records_ttft_gaps_and_tokens_from_usage():
    rec = asyncio.run(once(sse(GOOD, gap=0.01)))
    assert rec.ok, rec.detail
    assert rec.output_tokens == 4 and rec.prompt_tokens == 3 and rec.chunks == 4
    assert rec.ttft_s is not None and 0.005 < rec.ttft_s < 0.5
    assert len(rec.itl_s) == 3 and all(0.005 < g < 0.5 for g in rec.itl_s)
    assert rec.e2e_s >= rec.ttft_s + sum(rec.itl_s)


def test_several_events_in_one_read_share_a_timestamp():
    rec = asyncio.run(once(sse([b"".join(GOOD)])))
    assert rec.ok and rec.itl_s == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("parts", "kind", "words"),
    [
        ([chunk("a"), b'data: {"choices": [{"text": "x"\n\n', DONE], ErrorKind.MALFORMED, "not JSON"),
        ([chunk("a"), b"data: [1, 2]\n\n"], ErrorKind.MALFORMED, "not a JSON object"),
        ([chunk("a"), b'data: {"foo": 1}\n\n'], ErrorKind.MALFORMED, "neither choices nor usage"),
        (
            [chunk("a"), b'data: {"error": {"message": "engine dead"}}\n\n'],
            ErrorKind.SERVER_ERROR,
            "engine dead",
        ),
        ([chunk("a"), chunk("b"), DONE], ErrorKind.NO_USAGE, "without a usage chunk"),
        ([chunk("a"), chunk("b")], ErrorKind.DISCONNECTED, "before [DONE]"),
        ([USAGE, DONE], ErrorKind.EMPTY, "no choice chunk"),
        ([b"hello\n"], ErrorKind.NOT_OPENAI, "not an event stream"),
    ],
)
def test_bad_streams_are_classified(parts, kind, words):
    rec = asyncio.run(once(sse(parts)))
    assert rec.error is kind, rec.detail
    assert words in (rec.detail or "")


def test_a_200_that_is_not_a_stream_is_not_openai():
    html = asyncio.run(once(sse([b"<html>It works!</html>"], ctype="text/html")))
    assert html.error is ErrorKind.NOT_OPENAI and "text/html" in (html.detail or "")
    body = asyncio.run(once(sse([b'{"choices": []}'], ctype="application/json")))
    assert body.error is ErrorKind.NOT_OPENAI and "one JSON body" in (body.detail or "")


def test_http_errors_carry_the_servers_message():
    msg = {"object": "error", "message": "This model's maximum context length is 512 tokens.", "code": 400}
    rec = asyncio.run(once(lambda r: httpx.Response(400, json=msg)))
    assert (rec.error, rec.status) == (ErrorKind.HTTP_STATUS, 400)
    assert "maximum context length is 512" in (rec.detail or "")
    missing = asyncio.run(once(lambda r: httpx.Response(404, text="Not Found")))
    assert "is this an OpenAI-compatible server?" in (missing.detail or "")


def test_timeouts_and_connection_failures_by_phase():
    def no_answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)

    assert asyncio.run(once(no_answer)).error is ErrorKind.NO_ANSWER
    assert asyncio.run(once(refused)).error is ErrorKind.REFUSED
    assert asyncio.run(once(reset)).error is ErrorKind.DISCONNECTED


def test_a_stream_that_stops_hits_the_request_timeout():
    started = time.monotonic()
    rec = asyncio.run(once(sse([chunk("a"), chunk("b")], gap=1.0), request_timeout_s=0.3))
    assert rec.error is ErrorKind.TIMEOUT
    assert time.monotonic() - started < 2.0


def test_poisson_offsets_are_seeded_with_the_right_mean():
    a = [t for _, t in zip(range(2000), poisson_offsets(10.0, 7), strict=False)]
    b = [t for _, t in zip(range(2000), poisson_offsets(10.0, 7), strict=False)]
    assert a == b and a[0] == 0.0
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.1)


def test_prompt_order_is_seeded_and_uses_every_prompt_before_repeating():
    order = prompt_order(PROMPTS, 3, 25)
    assert order == prompt_order(PROMPTS, 3, 25)
    assert order != prompt_order(PROMPTS, 4, 25)
    assert set(order[:10]) == set(PROMPTS) and set(order[10:20]) == set(PROMPTS)


class Counting:
    """A server that answers GOOD after ``delay`` and records how many requests were in flight at once;
    it refuses every request with ``fail``, or every one after the first ``dies_after``."""

    def __init__(self, delay: float = 0.02, fail: bool = False, dies_after: int | None = None) -> None:
        self.delay, self.fail, self.dies_after = delay, fail, dies_after
        self.now = self.peak = self.calls = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.fail or (self.dies_after is not None and self.calls > self.dies_after):
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.now -= 1
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(GOOD))


async def load(handler: Counting, **changes: object):  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        return await run_load(client, TARGET, workload(**changes), PROMPTS, seed=1)


def test_run_sends_the_count_with_bounded_concurrency():
    server = Counting()
    run = asyncio.run(load(server, requests=12, concurrency=3))
    assert [r.index for r in run.records] == list(range(12))
    assert all(r.ok for r in run.records)
    assert server.peak == 3
    assert run.aborted is None and run.duration_s > 0


def test_run_with_a_duration_stops_sending_at_the_deadline():
    server = Counting(delay=0.05)
    started = time.monotonic()
    run = asyncio.run(load(server, requests=None, duration_s=0.5, concurrency=2))
    assert 0.4 < time.monotonic() - started < 1.5
    assert 10 <= len(run.records) <= 30
    assert max(r.sent_s for r in run.records) < 0.5


def test_run_at_a_rate_spaces_the_arrivals():
    server = Counting(delay=0.0)
    run = asyncio.run(load(server, requests=10, rate=20.0, concurrency=10))
    sent = [r.sent_s for r in run.records]
    assert sent == sorted(sent)
    expected = [t for _, t in zip(range(10), poisson_offsets(20.0, 1), strict=False)]
    assert sent == pytest.approx(expected, abs=0.05)


def test_a_run_where_nothing_succeeds_stops_after_one_wave():
    server = Counting(fail=True)
    run = asyncio.run(load(server, requests=500, concurrency=4))
    assert run.aborted is not None and "no success" in run.aborted and "refused" in run.aborted
    assert server.calls <= abort_after(4) + 4
    assert {r.error for r in run.records} <= {ErrorKind.REFUSED, ErrorKind.CANCELLED}


def test_a_server_that_goes_away_mid_run_stops_the_run():
    server = Counting(delay=0.0, dies_after=5)
    run = asyncio.run(load(server, requests=1000, concurrency=2))
    assert run.aborted is not None and "found nothing listening" in run.aborted
    assert sum(r.ok for r in run.records) == 5
    assert len(run.records) <= 5 + abort_after(2) + 2


def test_a_run_is_stopped_by_should_stop():
    server = Counting()

    async def go():  # type: ignore[no-untyped-def]
        async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
            calls = iter(range(100))
            return await run_load(
                client, TARGET, workload(requests=50), PROMPTS, seed=1,
                should_stop=lambda: "server A crashed" if next(calls) >= 5 else None,
            )  # fmt: skip

    run = asyncio.run(go())
    assert run.aborted == "server A crashed"
    assert len(run.records) == 5


def test_list_models_and_its_failures():
    def models(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"object": "list", "data": [{"id": "tiny"}, {"id": "other"}]})

    async def ask(handler):  # type: ignore[no-untyped-def]
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await list_models(client, "http://127.0.0.1:9", 1.0)

    assert asyncio.run(ask(models)) == ("tiny", "other")
    html = asyncio.run(ask(lambda r: httpx.Response(200, text="<html>It works!</html>")))
    assert html.kind is ErrorKind.NOT_OPENAI and "without an OpenAI model list" in html.detail
    missing = asyncio.run(ask(lambda r: httpx.Response(404)))
    assert missing.kind is ErrorKind.NOT_OPENAI and "404" in missing.detail
