"""One streamed OpenAI request over httpx, timed chunk by chunk, ending in exactly one RequestRecord.

Timing follows vLLM's benchmark client so that figures agree with ``vllm bench serve``: TTFT is the time
to the first chunk that carries a choice, inter-token latencies are the gaps between such chunks (with
speculative decoding one chunk can carry several tokens), output tokens come from the server's ``usage``
chunk, asked for with ``stream_options.include_usage``, never from splitting text.

Failures are classified by kind (:class:`ErrorKind`) and returned, never raised. Each request is bounded
by an idle timeout (no byte for that long) and a total timeout.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from hangwatch.collect.prometheus import refused
from hangwatch.model.bench import Endpoint
from hangwatch.model.bench import ErrorKind
from hangwatch.model.bench import Prompt
from hangwatch.model.bench import RequestRecord
from hangwatch.model.bench import Workload
from hangwatch.redact import redact_text

CONNECT_TIMEOUT_S = 10.0
DETAIL_CHARS = 300


@dataclass(frozen=True)
class Target:
    base_url: str  # scheme://host:port[/prefix], without /v1
    model: str
    endpoint: Endpoint

    @property
    def url(self) -> str:
        return self.base_url + self.endpoint.path


def build_payload(target: Target, prompt: Prompt, workload: Workload) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": target.model}
    if target.endpoint is Endpoint.CHAT:
        payload["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        payload["prompt"] = prompt.text
    payload.update(
        max_tokens=workload.max_tokens,
        temperature=workload.temperature,
        stream=True,
        stream_options={"include_usage": True},
    )
    if workload.ignore_eos:
        payload["ignore_eos"] = True  # vLLM and SGLang extension: every request yields max_tokens
    return payload


class NotEventStreamError(Exception):
    """A line that no Server-Sent Events stream contains."""


class SseData:
    """Bytes in, the payloads of ``data:`` lines out.

    OpenAI-compatible servers send one ``data: {json}`` line per event, so each data line is taken as one
    event; comments (``:``) and the other SSE fields are skipped.
    """

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data:
            self._buf += data
            return []
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        out = []
        for line in lines:
            if line.startswith(b"data:"):
                out.append(line[5:].strip())
            elif line.strip() and not line.startswith((b":", b"event:", b"id:", b"retry:")):
                raise NotEventStreamError(line[:80])
        return out

    def rest(self) -> bytes:
        return self._buf.strip()


class _RequestError(Exception):
    def __init__(self, kind: ErrorKind, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status = status


@dataclass
class _Stream:
    """What one request has seen so far (mutable: updated per chunk on the hot path)."""

    start: float
    first: float | None = None
    last: float | None = None
    chunks: int = 0
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    done: bool = False
    phase: str = "connect"  # connect -> headers -> stream

    def __post_init__(self) -> None:
        self.itl: list[float] = []

    def on_event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            raise _RequestError(
                ErrorKind.MALFORMED, f"chunk {self.chunks + 1} is not JSON: {_show(payload)}"
            ) from None
        if not isinstance(obj, dict):
            raise _RequestError(
                ErrorKind.MALFORMED, f"chunk {self.chunks + 1} is not a JSON object: {_show(payload)}"
            )
        choices = obj.get("choices")
        if choices:
            if not isinstance(choices, list) or not isinstance(choices[0], dict):
                raise _RequestError(
                    ErrorKind.MALFORMED, f"chunk {self.chunks + 1}: 'choices' is not a list of objects"
                )
            if self.first is None:
                self.first = now
            elif self.last is not None:
                self.itl.append(now - self.last)
            self.last = now
            self.chunks += 1
        usage = obj.get("usage")
        if usage:
            tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
            if not isinstance(tokens, int):
                raise _RequestError(
                    ErrorKind.MALFORMED, f"usage without an integer completion_tokens: {_show(payload)}"
                )
            self.output_tokens = tokens
            prompt = usage.get("prompt_tokens")
            self.prompt_tokens = prompt if isinstance(prompt, int) else None
        if "error" in obj and not choices:
            raise _RequestError(ErrorKind.SERVER_ERROR, f"the stream carried an error: {_error_message(obj)}")
        if "choices" not in obj and "usage" not in obj:
            raise _RequestError(
                ErrorKind.MALFORMED,
                f"chunk {self.chunks + 1} has neither choices nor usage: {_show(payload)}",
            )


def _show(data: bytes | str, limit: int = 120) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return repr(redact_text(text[:limit]) + ("..." if len(text) > limit else ""))


def _error_message(obj: Any) -> str:
    """The message of an OpenAI-style error body: {"error": {"message": ...}} or {"message": ...}."""
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return redact_text(err["message"][:DETAIL_CHARS])
        if isinstance(err, str):
            return redact_text(err[:DETAIL_CHARS])
    return _show(json.dumps(obj))


async def _body_once(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _raw(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body as it arrives; a body httpx already holds (a fixed one, as mock transports give) at once."""
    return _body_once(response.content) if response.is_stream_consumed else response.aiter_raw()


async def _read_some(response: httpx.Response, limit: int = 2048) -> bytes:
    body = b""
    async for part in _raw(response):
        body += part
        if len(body) >= limit:
            break
    return body[:limit]


async def _http_status_failure(response: httpx.Response) -> _RequestError:
    status = response.status_code
    body = await _read_some(response)
    try:
        message = _error_message(json.loads(body))
    except ValueError:
        message = _show(body) if body else "no body"
    hint = " (no such endpoint: is this an OpenAI-compatible server?)" if status in (404, 405) else ""
    return _RequestError(ErrorKind.HTTP_STATUS, f"HTTP {status}{hint}: {message}", status)


async def _consume(client: httpx.AsyncClient, target: Target, body: bytes, s: _Stream, idle_s: float) -> None:
    timeout = httpx.Timeout(connect=min(CONNECT_TIMEOUT_S, idle_s), read=idle_s, write=idle_s, pool=None)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    async with client.stream("POST", target.url, content=body, headers=headers, timeout=timeout) as response:
        s.phase = "stream"
        if response.status_code != 200:
            raise await _http_status_failure(response)
        ctype = response.headers.get("content-type", "")
        if ctype and "text/event-stream" not in ctype:
            what = (
                "one JSON body instead of a stream (is stream: true supported?)"
                if "json" in ctype
                else "no event stream"
            )
            first = await _read_some(response, 120)
            raise _RequestError(
                ErrorKind.NOT_OPENAI,
                f"HTTP 200 with Content-Type {ctype!r}: {what}; it starts {_show(first)}",
                200,
            )
        sse = SseData()
        clock = time.perf_counter
        async for data in _raw(response):
            now = clock()
            try:
                events = sse.feed(data)
            except NotEventStreamError as exc:
                raise _RequestError(
                    ErrorKind.NOT_OPENAI, f"not an event stream: a line {_show(exc.args[0])}", 200
                ) from None
            for payload in events:
                s.on_event(payload, now)
        rest = sse.rest()
        if rest.startswith(b"data:"):  # a last event without its newline
            s.on_event(rest[5:].strip(), clock())


def _classify(exc: BaseException, s: _Stream, idle_s: float) -> _RequestError:
    """An exception of httpx (or ours) as the kind of failure it means, given how far the request got."""
    if isinstance(exc, _RequestError):
        return exc
    if isinstance(exc, httpx.ConnectTimeout):
        return _RequestError(ErrorKind.CONNECT, "no TCP connection within the connect timeout")
    if isinstance(exc, httpx.ConnectError):
        if refused(exc):
            return _RequestError(ErrorKind.REFUSED, "connection refused: nothing listens on the port")
        return _RequestError(ErrorKind.CONNECT, f"cannot connect: {exc}")
    if isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
        if s.phase != "stream":
            return _RequestError(ErrorKind.NO_ANSWER, f"connected, but no HTTP answer within {idle_s:g} s")
        where = f"after {s.chunks} chunks" if s.chunks else "before the first chunk"
        return _RequestError(
            ErrorKind.STALLED_STREAM, f"the stream stopped {where}: nothing for {idle_s:g} s"
        )
    if isinstance(exc, httpx.RemoteProtocolError):
        if s.phase != "stream":
            text = str(exc)
            if "without sending" in text or "disconnected" in text.lower():
                return _RequestError(
                    ErrorKind.DISCONNECTED, f"the server closed the connection without an answer ({text})"
                )
            return _RequestError(ErrorKind.NOT_OPENAI, f"not an HTTP answer: {text}")
        return _RequestError(
            ErrorKind.DISCONNECTED, f"the connection closed mid-stream after {s.chunks} chunks: {exc}"
        )
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
        return _RequestError(
            ErrorKind.DISCONNECTED,
            f"the connection broke after {s.chunks} chunks: {type(exc).__name__} {exc}",
        )
    if isinstance(exc, httpx.HTTPError | OSError):
        return _RequestError(ErrorKind.ERROR, f"{type(exc).__name__}: {exc}")
    return _RequestError(ErrorKind.ERROR, f"unexpected {type(exc).__name__}: {exc}")


async def request_once(
    client: httpx.AsyncClient,
    target: Target,
    prompt: Prompt,
    workload: Workload,
    *,
    index: int = 0,
    sent_s: float = 0.0,
) -> RequestRecord:
    """One streamed request, start to end, as a record. Raises only CancelledError."""
    body = json.dumps(build_payload(target, prompt, workload)).encode()
    s = _Stream(start=time.perf_counter())
    failure: _RequestError | None = None
    try:
        async with asyncio.timeout(workload.request_timeout_s):
            s.phase = "headers"
            await _consume(client, target, body, s, workload.idle_timeout_s)
    except TimeoutError:
        failure = _RequestError(
            ErrorKind.TIMEOUT, f"not finished within the request timeout of {workload.request_timeout_s:g} s"
        )
    except Exception as exc:  # the boundary: every failure becomes a record
        failure = _classify(exc, s, workload.idle_timeout_s)
    end = time.perf_counter()
    if failure is None:
        if s.output_tokens is None:
            kind = ErrorKind.NO_USAGE if s.done else ErrorKind.DISCONNECTED
            what = (
                "without a usage chunk (stream_options.include_usage ignored?)" if s.done else "before [DONE]"
            )
            failure = _RequestError(kind, f"the stream ended {what} after {s.chunks} chunks", 200)
        elif s.first is None:
            failure = _RequestError(ErrorKind.EMPTY, "the stream carried no choice chunk", 200)
    return RequestRecord(
        index=index,
        sent_s=sent_s,
        ttft_s=None if s.first is None else s.first - s.start,
        itl_s=tuple(s.itl),
        e2e_s=end - s.start,
        output_tokens=s.output_tokens,
        prompt_tokens=s.prompt_tokens,
        chunks=s.chunks,
        error=failure.kind if failure else None,
        detail=failure.detail if failure else None,
        status=failure.status if failure else 200,
    )


@dataclass(frozen=True)
class ServerProblem:
    """Why a URL cannot be benchmarked, found before the run starts."""

    kind: ErrorKind
    detail: str


async def list_models(
    client: httpx.AsyncClient, base_url: str, timeout_s: float
) -> tuple[str, ...] | ServerProblem:
    """GET /v1/models: the served model names, or why the URL is not a usable OpenAI-compatible server."""
    url = base_url + "/v1/models"
    try:
        response = await client.get(url, timeout=httpx.Timeout(timeout_s))
    except Exception as exc:  # the boundary
        f = _classify(exc, _Stream(start=0.0, phase="headers"), timeout_s)
        return ServerProblem(f.kind, f.detail)
    if response.status_code != 200:
        hint = (
            "no /v1/models: not an OpenAI-compatible server?"
            if response.status_code in (404, 405)
            else "an error"
        )
        return ServerProblem(
            ErrorKind.NOT_OPENAI, f"GET /v1/models answered HTTP {response.status_code} ({hint})"
        )
    try:
        data = response.json()
        names = tuple(str(m["id"]) for m in data["data"])
    except (ValueError, KeyError, TypeError):
        start = _show(response.content)
        return ServerProblem(
            ErrorKind.NOT_OPENAI,
            f"GET /v1/models answered 200 without an OpenAI model list: it starts {start}",
        )
    if not names:
        return ServerProblem(ErrorKind.NOT_OPENAI, "GET /v1/models lists no model")
    return names
