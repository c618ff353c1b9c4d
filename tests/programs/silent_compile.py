"""A server that "compiles" silently: prints ``compile begin``, burns CPU with no output and no I/O.

The compile is real work (``_util.compile_like``: parsing generated source and walking its tree), so
its stack moves between captures, as a real compiler's does. After ``--seconds`` (default 120) it prints ``compile done`` and, when
``--port`` is given, serves GET /health like healthy_server.py (else it exits 0). With ``--workers N``
the compiling happens in N ``spawn`` child processes while the parent waits in ``join()`` (0 % CPU),
like a compile worker pool.
``--ready-file`` is written once every worker is compiling.

Example::

    python tests/programs/silent_compile.py --seconds 30 --workers 2 --port 8000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from multiprocessing.queues import Queue

from _util import add_ready_file_arg
from _util import compile_like
from _util import log
from _util import serve_health
from _util import set_title
from _util import write_ready


def compile_worker(index: int, seconds: float, started: Queue[int]) -> None:
    """Tell the parent we are compiling, then compile for ``seconds``."""
    set_title(f"compile_worker_{index}")
    started.put(index)
    compile_like(seconds)


def main() -> None:
    """Parse arguments, burn CPU in-process or in workers, then optionally serve."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to burn CPU silently")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="burn in N child processes while the parent waits (0: burn in this process)",
    )
    parser.add_argument("--port", type=int, help="after compiling, serve GET /health on this port")
    add_ready_file_arg(parser)
    args = parser.parse_args()

    log("compile begin")
    if args.workers > 0:
        ctx = mp.get_context("spawn")
        started: Queue[int] = ctx.Queue()
        workers = [
            ctx.Process(target=compile_worker, args=(i, args.seconds, started), name=f"compile-{i}")
            for i in range(args.workers)
        ]
        for proc in workers:
            proc.start()
        for _ in workers:
            started.get()
        write_ready(args.ready_file)
        for proc in workers:
            proc.join()
    else:
        write_ready(args.ready_file)
        compile_like(args.seconds)
    log("compile done")
    if args.port is not None:
        serve_health(args.port)


if __name__ == "__main__":
    main()
