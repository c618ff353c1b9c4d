"""The lean HTTP/1.1 transport against a scripted asyncio server on 127.0.0.1: framing, reuse, failures."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable
from collections.abc import Callable

import httpx
import pytest

from hangwatch.bench.lean_transport import LeanTransport
from hangwatch.bench.lean_transport import make_client
from hangwatch.bench.openai_stream import Target
from hangwatch.bench.openai_stream import request_once
from hangwatch.model.bench import Endpoint
from hangwatch.model.bench import ErrorKind
from hangwatch.model.bench import Prompt
from hangwatch.model.bench import Workload

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    return head + (await reader.readexactly(length) if length else b"")


async def serve(script: Script, body: Callable[[str], Awaitable[None]]) -> list[int]:
    """Run ``script`` per connection on a free port, call ``body(base_url)``; the peer ports seen, in order."""
    peers: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[1])
        try:
            await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await body(f"http://127.0.0.1:{port}")
    finally:
        server.close()
    return peers


def chunked(*parts: bytes) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


async def pieces(client: httpx.AsyncClient, url: str, **kw: object) -> tuple[int, list[bytes]]:
    async with client.stream("GET", url, **kw) as r:  # type: ignore[arg-type]
        return r.status_code, [p async for p in r.aiter_raw()]


def lean() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=LeanTransport())


def test_content_length_and_chunked_bodies_reuse_one_connection():
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        await read_request(reader)
        body = chunked(b"data: 1\n\n", b"data: 22\n\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body[:7])
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(body[7:])  # a chunk split across reads
        await writer.drain()
        await reader.read()

    async def body(url: str) -> None:
        async with lean() as client:
            assert await pieces(client, url) == (200, [b"hello"])
            status, got = await pieces(client, url)
            assert status == 200 and b"".join(got) == b"data: 1\n\ndata: 22\n\n"

    peers = asyncio.run(serve(script, body))
    assert len(peers) == 1  # kept alive and reused


def test_close_delimited_body_and_connection_close_are_not_reused():
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
        await writer.drain()

    async def body(url: str) -> None:
        async with lean() as client:
            for _ in range(2):
                status, got = await pieces(client, url)
                assert (status, b"".join(got)) == (200, b"until the end")

    assert len(asyncio.run(serve(script, body))) == 2


def test_a_kept_alive_connection_the_server_closed_is_retried_on_a_fresh_one():
    async def script(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # then close without a word, as a keep-alive timeout does (uvicorn: 5 s)

    async def body(url: str) -> None:
        async with lean() as client:
            assert await pieces(client, url) == (200, [b"ok"])
            await asyncio.sleep(0.05)
            assert await pieces(client, url) == (200, [b"ok"])

    assert len(asyncio.run(serve(script, body))) == 2


def test_no_answer_and_a_stalled_body_are_read_timeouts():
    async def silent(reader, writer):
        await read_request(reader)
        await asyncio.sleep(5)

    async def stalls(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def expect_timeout(url: str) -> None:
        async with lean() as client:
            with pytest.raises(httpx.ReadTimeout):
                await pieces(client, url, timeout=httpx.Timeout(0.3))

    asyncio.run(serve(silent, expect_timeout))
    asyncio.run(serve(stalls, expect_timeout))


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "illegal status line"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            "without sending complete message body",
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"", "Server disconnected without sending a response"),
    ],
)
def test_broken_answers_are_protocol_errors(reply, message):
    async def script(reader, writer):
        await read_request(reader)
        writer.write(reply)
        await writer.drain()

    async def body(url: str) -> None:
        async with lean() as client:
            with pytest.raises(httpx.RemoteProtocolError, match=message):
                await pieces(client, url)

    asyncio.run(serve(script, body))


def test_refused_is_a_connect_error_that_says_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

        async def go() -> None:
            async with lean() as client:
                with pytest.raises(httpx.ConnectError) as info:
                    await client.get(f"http://127.0.0.1:{port}/")
                assert isinstance(info.value.__cause__, ConnectionRefusedError)

        asyncio.run(go())


def test_request_once_through_make_client_on_a_real_socket():
    events = [
        b'data: {"choices":[{"text":"a"}],"usage":null}\n\n',
        b'data: {"choices":[{"text":"b"}],"usage":null}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2}}\n\n',
        b"data: [DONE]\n\n",
    ]

    async def script(reader, writer):
        request = await read_request(reader)
        assert b"Accept-Encoding: identity" in request and b'"include_usage": true' in request
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for e in events:
            writer.write(f"{len(e):x}\r\n".encode() + e + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def body(url: str) -> None:
        w = Workload(Endpoint.COMPLETIONS, None, 1, None, 1, None, 2, 0.0, False, 0, 1, 0, "x", 1, 5.0, 2.0)
        async with make_client(2) as client:
            rec = await request_once(client, Target(url, "m", Endpoint.COMPLETIONS), Prompt("hi"), w)
        assert rec.ok, rec.detail
        assert (rec.output_tokens, rec.chunks, len(rec.itl_s)) == (2, 2, 1)
        assert rec.itl_s[0] > 0.005

    asyncio.run(serve(script, body))


def test_make_client_sends_https_elsewhere():
    client = make_client(2)
    try:
        assert isinstance(client._transport_for_url(httpx.URL("http://127.0.0.1:1/")), LeanTransport)
        assert not isinstance(client._transport_for_url(httpx.URL("https://example.invalid/")), LeanTransport)
    finally:
        asyncio.run(client.aclose())
    assert ErrorKind.REFUSED.value == "refused"
