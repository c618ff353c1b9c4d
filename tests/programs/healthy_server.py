"""A well-behaved "inference server": a few phase lines, a short load, then GET /health on 127.0.0.1.

Timeline: ``Loading weights`` -> about ``--load-seconds`` of real work (CPU) -> ``Weights loaded`` ->
listens on ``--port`` and prints ``Server ready on port N`` -> serves until killed. ``/health`` returns
503 for the first ``--health-after`` seconds after listening, then 200; every other path is 404.
``--ready-file`` is written once the socket listens.

Example::

    python tests/programs/healthy_server.py --port 8000 --health-after 2
"""

from __future__ import annotations

import argparse
import time

from _util import add_ready_file_arg
from _util import compile_like
from _util import log
from _util import serve_health


def main() -> None:
    """Parse arguments, go through the phases and serve forever."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: pick a free one)")
    parser.add_argument("--load-seconds", type=float, default=2.0, help="length of the load phase")
    parser.add_argument(
        "--health-after",
        type=float,
        default=0.0,
        help="/health answers 503 for this many seconds after listening",
    )
    parser.add_argument("--access-log", action="store_true", help="print one line per HTTP request")
    add_ready_file_arg(parser)
    args = parser.parse_args()

    log("Starting server")
    log("Loading weights")
    started = time.monotonic()
    # Half the load phase computes (CPU time rises), half waits (like waiting on storage).
    compile_like(args.load_seconds / 2)
    time.sleep(args.load_seconds / 2)
    log(f"Weights loaded in {time.monotonic() - started:.2f} s")
    serve_health(args.port, args.health_after, args.access_log, args.ready_file)


if __name__ == "__main__":
    main()
