"""Silent CPU work of many shapes, none of which may ever be called stalled.

Each shape is real work done with no log line, no I/O and no new process for ``--seconds``: only CPU
moves, and only the code's movement tells it from a spin. The shapes are what a boot's silent phases do
(a weight-layout pass, a tokenizer's table build, a scheduler's planning, a compile cache walk), written
to be hard for a rule that decides from a few stack captures:

``cycle``     a few functions in turn: a recursion of varying depth, a sort, a dict build
``sort``      one line dominates: sorting fresh random lists, almost all of the time inside C
``arith``     a pure-Python arithmetic loop: one frame, its lines varying, as a spin's
``recurse``   a recursive descent of random depth (a parser, a tree walk)
``hash``      hashing a buffer in a loop (the time in C, the Python frame fixed)
``regex``     regular expressions over generated text (the time in _sre)
``json``      serialising and parsing a structure (the C accelerator)
``threads``   two threads of ``cycle`` work beside an idle main thread joining them
``children``  ``--workers`` spawn children doing ``cycle`` work while the parent joins them

It prints ``work begin`` and, after ``--seconds``, ``work done``; then exits 0, or with ``--port`` serves
GET /health (200) like healthy_server.py.

Example::

    python tests/programs/work_loops.py --shape cycle --seconds 40
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import random
import re
import threading
import time
from collections.abc import Callable

from _util import add_ready_file_arg
from _util import log
from _util import serve_health
from _util import set_title
from _util import write_ready


def _fib(n: int) -> int:
    return n if n < 2 else _fib(n - 1) + _fib(n - 2)


def _sort_some(rng: random.Random) -> float:
    data = [rng.random() for _ in range(20_000)]
    data.sort()
    return data[len(data) // 2]


def _table(rng: random.Random) -> int:
    table = {}
    for i in range(20_000):
        table[(i * 2654435761) % 1_000_003] = rng.random()
    return len(table)


def cycle(rng: random.Random) -> int:
    return _fib(rng.randint(14, 21)) + int(_sort_some(rng) * 10) + _table(rng)


def sort(rng: random.Random) -> int:
    data = [rng.random() for _ in range(400_000)]
    for _ in range(3):
        data.sort()
        data.reverse()
    return len(data)


def arith(rng: random.Random) -> int:
    acc = 0
    n = rng.randint(200_000, 400_000)
    for i in range(n):
        acc += (i * i) % 7
        acc ^= i
    return acc


def _descend(node: int, depth: int, rng: random.Random) -> int:
    if depth == 0:
        return node
    branches = rng.randint(1, 3)
    return sum(_descend(node * 3 + b, depth - 1, rng) for b in range(branches)) % 1_000_003


def recurse(rng: random.Random) -> int:
    return _descend(1, rng.randint(6, 12), rng)


def hash_(rng: random.Random) -> int:
    buf = rng.randbytes(1 << 22)
    digest = b""
    for _ in range(8):
        digest = hashlib.sha256(buf + digest).digest()
    return digest[0]


def regex(rng: random.Random) -> int:
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 9))) for _ in range(50_000)]
    text = " ".join(words)
    return len(re.findall(r"\b(a\w*e|b\w+h)\b", text)) + len(re.sub(r"(c)(d+)", r"\2\1", text))


def json_(rng: random.Random) -> int:
    doc = {str(i): [rng.random(), {"k": i, "s": "x" * (i % 50)}] for i in range(30_000)}
    return len(json.loads(json.dumps(doc)))


SHAPES: dict[str, Callable[[random.Random], int]] = {
    "cycle": cycle,
    "sort": sort,
    "arith": arith,
    "recurse": recurse,
    "hash": hash_,
    "regex": regex,
    "json": json_,
}


def work(shape: str, seconds: float, seed: int) -> int:
    """Do ``shape`` work over and over for ``seconds``."""
    rng = random.Random(seed)
    step = SHAPES[shape]
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        total += step(rng)
    return total


def child(index: int, seconds: float) -> None:
    set_title(f"work_child_{index}")
    work("cycle", seconds, index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, "threads", "children"], default="cycle")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2, help="children for --shape children")
    parser.add_argument("--port", type=int, help="after the work, serve GET /health on this port")
    add_ready_file_arg(parser)
    args = parser.parse_args()

    log(f"work begin ({args.shape})")
    write_ready(args.ready_file)
    if args.shape == "threads":
        threads = [threading.Thread(target=work, args=("cycle", args.seconds, i)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elif args.shape == "children":
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=child, args=(i, args.seconds)) for i in range(args.workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    else:
        work(args.shape, args.seconds, 0)
    log("work done")
    if args.port is not None:
        serve_health(args.port)


if __name__ == "__main__":
    main()
