"""A fast stub OpenAI-compatible server: streams tokens at a set pace, with vLLM-style /metrics it controls.

Serves on 127.0.0.1 (asyncio, HTTP/1.1 keep-alive, chunked transfer encoding), standard library only:

* ``GET /v1/models``, ``GET /health``
* ``POST /v1/completions`` and ``/v1/chat/completions`` with ``stream: true``: one SSE chunk per decode step,
  ``--token-interval`` seconds apart, then the usage chunk (when ``stream_options.include_usage``) and
  ``data: [DONE]``. ``max_tokens`` tokens in all (no EOS).
* ``GET /metrics``: Prometheus text with ``vllm:generation_tokens_total``, ``vllm:prompt_tokens_total``,
  ``vllm:num_requests_running`` / ``_waiting`` and, with ``--spec-tokens K``, the four
  ``vllm:spec_decode_*`` counters. Each decode step drafts K tokens and accepts a leading run of them
  (each with probability ``--accept``, seeded), emitting accepted + 1 tokens, exactly as vLLM counts.
  ``--engines 2`` splits the counters over two ``engine`` labels, as data parallelism does.

Modes for bad input (``--mode``): ``silent`` accepts connections and never answers; ``not-openai`` answers
every request with a 200 HTML page; ``json-body`` answers completions with one JSON body, not a stream;
``malformed`` streams two chunks then a chunk that is not JSON; ``no-usage`` ignores include_usage;
``hang-stream`` streams two chunks then goes quiet, connection open; ``drop`` streams two chunks then
closes the connection; ``error-status`` answers completions with HTTP 400. ``--no-metrics`` makes
/metrics a 404. ``--boot-seconds`` prints startup lines before listening; ``--boot-hang`` never listens;
``--die-after N`` exits with status 3 after N completed requests (a crash in the middle of a benchmark).
``--wedge-after N``: completion requests after the first N get no answer at all (no header, no token),
while /health stays 200 and the /metrics gauges stay where they were: vLLM's worker blocked in its
first ``execute_model`` after it turned ready (the engine publishes its gauges only after a step).
``--block-loop-after N --block-how pipe|event|spin``: the handler of the completion request after the
first N never returns to the event loop (a read of a pipe only this process holds, an Event, a busy
loop): nothing is read on any connection again, as an API server whose handler wedged.

Prints ``listening on 127.0.0.1:PORT`` and writes the port to ``--ready-file`` once it listens.

Example::

    python tests/programs/stub_openai.py --port 8000 --token-interval 0.01 --spec-tokens 3 --accept 0.6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import selectors
import threading
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from _util import add_ready_file_arg
from _util import block_forever
from _util import log
from _util import write_ready

MODEL = "stub-model"


@dataclass
class Counters:
    engines: int
    spec_tokens: int
    generation: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    draft_tokens: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    per_pos: list[list[int]] = field(default_factory=list)
    running: int = 0
    requests: int = 0

    def __post_init__(self) -> None:
        for name in ("generation", "prompt", "drafts", "draft_tokens", "accepted"):
            setattr(self, name, [0] * self.engines)
        self.per_pos = [[0] * self.spec_tokens for _ in range(self.engines)]

    def exposition(self) -> str:
        lines: list[str] = []

        def counter(name: str, doc: str, values: list[int]) -> None:
            lines.append(f"# HELP {name} {doc}")
            lines.append(f"# TYPE {name} counter")
            for e, v in enumerate(values):
                lines.append(f'{name}{{engine="{e}",model_name="{MODEL}"}} {float(v)}')

        lines.append("# HELP vllm:num_requests_running Number of requests in model execution batches.")
        lines.append("# TYPE vllm:num_requests_running gauge")
        lines.append(f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} {float(self.running)}')
        lines.append("# HELP vllm:num_requests_waiting Number of requests waiting to be processed.")
        lines.append("# TYPE vllm:num_requests_waiting gauge")
        lines.append(f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0')
        counter("vllm:generation_tokens_total", "Number of generation tokens processed.", self.generation)
        counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", self.prompt)
        if self.spec_tokens:
            counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", self.drafts)
            counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", self.draft_tokens)
            counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", self.accepted)
            name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            lines.append(f"# HELP {name} Accepted tokens per draft position.")
            lines.append(f"# TYPE {name} counter")
            for e in range(self.engines):
                for pos, v in enumerate(self.per_pos[e]):
                    lines.append(f'{name}{{engine="{e}",model_name="{MODEL}",position="{pos}"}} {float(v)}')
        return "\n".join(lines) + "\n"


class Stub:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.counters = Counters(args.engines, args.spec_tokens)
        self.rng = random.Random(args.seed)
        self.held: list[asyncio.StreamWriter] = []
        self.completed = 0
        self.arrived = 0.0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_line = await reader.readline()
                if not request_line:
                    return
                headers: dict[str, str] = {}
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    key, _, value = line.decode("latin-1").partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                self.arrived = time.monotonic()  # read by completion() before its first await
                method, path, _ = request_line.decode("latin-1").split(" ", 2)
                if self.args.mode == "silent":
                    self.held.append(writer)
                    await asyncio.Event().wait()  # never answer; the connection stays open
                keep = await self.route(method, path.split("?", 1)[0], body, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            if writer not in self.held:
                writer.close()

    async def route(self, method: str, path: str, body: bytes, w: asyncio.StreamWriter) -> bool:
        mode = self.args.mode
        if mode == "not-openai":
            return await self.reply(w, 200, b"<html><body>It works!</body></html>", "text/html")
        if method == "GET" and path == "/health":
            return await self.reply(w, 200, b"")
        if method == "GET" and path == "/v1/models":
            data = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "stub"}]}
            return await self.reply(w, 200, json.dumps(data).encode(), "application/json")
        if method == "GET" and path == "/metrics":
            if self.args.no_metrics:
                return await self.reply(w, 404, b'{"detail":"Not Found"}', "application/json")
            return await self.reply(w, 200, self.counters.exposition().encode(), "text/plain; version=0.0.4")
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            return await self.completion(path, json.loads(body or b"{}"), w)
        return await self.reply(w, 404, b'{"detail":"Not Found"}', "application/json")

    async def reply(
        self, w: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "text/plain"
    ) -> bool:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "X")
        head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
        w.write(head.encode() + body)
        await w.drain()
        return True

    async def completion(self, path: str, req: dict[str, object], w: asyncio.StreamWriter) -> bool:
        mode = self.args.mode
        if mode == "error-status":
            msg = {
                "object": "error",
                "message": "This model's maximum context length is 512 tokens.",
                "code": 400,
            }
            return await self.reply(w, 400, json.dumps(msg).encode(), "application/json")
        max_tokens = int(req.get("max_tokens") or 16)  # type: ignore[call-overload]
        chat = path.endswith("chat/completions")
        prompt = req.get("prompt") if not chat else json.dumps(req.get("messages"))
        prompt_tokens = max(1, len(str(prompt)) // 4)
        c = self.counters
        engine = c.requests % c.engines
        c.requests += 1
        if self.args.block_loop_after is not None and c.requests > self.args.block_loop_after:
            _block_the_loop(self.args.block_how)
        if self.args.wedge_after is not None and c.requests > self.args.wedge_after:
            self.held.append(w)
            await asyncio.Event().wait()  # wedged: the request is read, never answered
        if mode == "json-body":
            body = {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "hello", "index": 0}]}
            return await self.reply(w, 200, json.dumps(body).encode(), "application/json")
        arrived = self.arrived
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        c.running += 1
        c.prompt[engine] += prompt_tokens
        await asyncio.sleep(self.args.ttft)
        sent = 0
        step = 0
        next_at = time.monotonic()
        try:
            while sent < max_tokens:
                n = min(self.decode_step(engine), max_tokens - sent)
                sent += n
                c.generation[engine] += n
                if mode in ("malformed", "hang-stream", "drop") and step == 2:
                    return await self.misbehave(w)
                await self.event(w, self.chunk(chat, "tok " * n))
                if step == 0 and self.args.timing_log:
                    with self.args.timing_log.open("a") as f:
                        f.write(f"{arrived:.6f} {time.monotonic():.6f}\n")
                step += 1
                if self.args.token_interval:
                    # On an absolute schedule: the offered rate is exactly 1/interval per stream, whatever
                    # the cost of sending (unless the stub falls behind, which then shows as a lower rate).
                    next_at += self.args.token_interval
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                elif step % 64 == 0:
                    await asyncio.sleep(0)  # let other streams have a turn
            options = req.get("stream_options")
            if mode != "no-usage" and isinstance(options, dict) and options.get("include_usage"):
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": sent,
                    "total_tokens": prompt_tokens + sent,
                }
                await self.event(
                    w, {"id": "cmpl-stub", "object": "text_completion", "choices": [], "usage": usage}
                )
            await self.send(w, b"data: [DONE]\n\n")
            w.write(b"0\r\n\r\n")
            await w.drain()
            self.completed += 1
            if self.args.die_after and self.completed >= self.args.die_after:
                log(f"stub: dying after {self.completed} requests, as asked")
                os._exit(3)
            return True
        finally:
            c.running -= 1

    def decode_step(self, engine: int) -> int:
        """Tokens produced by one decode step; with speculation, count drafts and acceptance like vLLM."""
        c = self.counters
        k = c.spec_tokens
        if not k:
            return 1
        accepted = 0
        while accepted < k and self.rng.random() < self.args.accept:
            accepted += 1
        c.drafts[engine] += 1
        c.draft_tokens[engine] += k
        c.accepted[engine] += accepted
        for pos in range(accepted):
            c.per_pos[engine][pos] += 1
        return accepted + 1

    @staticmethod
    def chunk(chat: bool, text: str) -> dict[str, object]:
        if chat:
            choice: dict[str, object] = {"index": 0, "delta": {"content": text}, "finish_reason": None}
            return {
                "id": "chatcmpl-stub",
                "object": "chat.completion.chunk",
                "choices": [choice],
                "usage": None,
            }
        return {
            "id": "cmpl-stub",
            "object": "text_completion",
            "choices": [{"index": 0, "text": text}],
            "usage": None,
        }

    async def event(self, w: asyncio.StreamWriter, obj: dict[str, object]) -> None:
        await self.send(w, b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    @staticmethod
    async def send(w: asyncio.StreamWriter, data: bytes) -> None:
        w.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await w.drain()

    async def misbehave(self, w: asyncio.StreamWriter) -> bool:
        mode = self.args.mode
        if mode == "malformed":
            await self.send(w, b'data: {"choices": [{"text": "x"\n\n')
            await self.send(w, b"data: [DONE]\n\n")
            w.write(b"0\r\n\r\n")
            await w.drain()
            return True
        if mode == "hang-stream":
            self.held.append(w)
            await asyncio.Event().wait()
        w.transport.abort()  # drop: reset the connection mid-stream
        return False


async def serve(args: argparse.Namespace) -> None:
    stub = Stub(args)
    server = await asyncio.start_server(stub.handle, "127.0.0.1", args.port, backlog=512)
    port = server.sockets[0].getsockname()[1]
    log(f"listening on 127.0.0.1:{port}")
    write_ready(args.ready_file, f"{port}\n")
    async with server:
        await server.serve_forever()


def _housekeeping() -> None:
    """Waits with a timeout in a selector of its own, as vLLM's API server watches its engine's
    liveness: a thread in a selectors wait that is not the loop serving the port."""
    read_end, _write_end = os.pipe()
    selector = selectors.DefaultSelector()
    selector.register(read_end, selectors.EVENT_READ)
    while True:
        selector.select(timeout=0.5)


def _block_the_loop(how: str) -> None:
    """A handler that never returns to the loop: nothing on any connection is read again."""
    print(f"handler blocks the loop ({how})", flush=True)
    # A real server has threads of its own besides the loop (housekeeping, timed waits): then nothing
    # says the tree is closed, and only the unread requests point at the loop.
    threading.Thread(target=_housekeeping, name="housekeeping", daemon=True).start()
    if how == "pipe":
        read_end, _write_end = os.pipe()
        os.read(read_end, 1)
    elif how == "event":
        threading.Event().wait()
    n = 0
    while True:
        n += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: pick a free one)")
    parser.add_argument("--token-interval", type=float, default=0.0, help="seconds between decode steps")
    parser.add_argument("--ttft", type=float, default=0.0, help="seconds before the first token")
    parser.add_argument(
        "--spec-tokens", type=int, default=0, help="draft tokens per step (0: no speculation)"
    )
    parser.add_argument("--accept", type=float, default=0.5, help="acceptance probability per draft position")
    parser.add_argument("--engines", type=int, default=1, help="split counters over this many engine labels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mode",
        default="ok",
        choices=[
            "ok",
            "silent",
            "not-openai",
            "json-body",
            "malformed",
            "no-usage",
            "hang-stream",
            "drop",
            "error-status",
        ],
    )
    parser.add_argument("--no-metrics", action="store_true", help="/metrics answers 404")
    parser.add_argument("--die-after", type=int, default=0, help="exit 3 after this many completed requests")
    parser.add_argument(
        "--wedge-after",
        type=int,
        help="never answer completion requests after the first N (health stays 200)",
    )
    parser.add_argument(
        "--block-loop-after",
        type=int,
        help="the handler of the completion request after the first N blocks the whole event loop",
    )
    parser.add_argument(
        "--block-how",
        choices=("pipe", "event", "spin"),
        default="pipe",
        help="how the handler blocks: a read of a pipe only it could write (a bare kernel read, no "
        "Python wait), a threading.Event, or a busy loop",
    )
    parser.add_argument("--boot-seconds", type=float, default=0.0, help="print startup lines this long first")
    parser.add_argument("--boot-hang", action="store_true", help="print a startup line, then never listen")
    parser.add_argument("--cpu", type=int, help="pin to this CPU (benchmarks)")
    parser.add_argument(
        "--timing-log", type=Path,
        help="append, per streamed request, the monotonic times its body arrived and its first token was sent",
    )  # fmt: skip
    add_ready_file_arg(parser)
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    log("stub: starting")
    if args.boot_hang:
        log("stub: loading weights")
        block_forever()
    deadline = time.monotonic() + args.boot_seconds
    while time.monotonic() < deadline:
        log("stub: loading weights")
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
