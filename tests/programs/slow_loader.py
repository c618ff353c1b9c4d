"""A loader that reads "weights" slowly and silently: rchar rises steadily, CPU stays near 0 %.

Creates a ``--size-mb`` data file (or reads ``--file``), prints ``loading weights from PATH``, then reads
it in ``--chunk-kb`` chunks, one chunk per ``--interval`` seconds (default 1 MiB per 0.25 s, 4 MiB/s),
wrapping around at the end, for ``--seconds`` with no output at all. Reads served from the page cache
still count in /proc/PID/io ``rchar``; ``--drop-cache`` additionally asks the kernel to drop the file's
pages (posix_fadvise DONTNEED) before each pass so that ``read_bytes`` rises too on a real disk.
Then prints ``weights loaded`` and serves GET /health when ``--port`` is given (else exits 0).
``--ready-file`` is written just before the silent reading starts.

Example::

    python tests/programs/slow_loader.py --size-mb 64 --seconds 60 --port 8000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _util import add_ready_file_arg
from _util import log
from _util import serve_health
from _util import write_ready

_MIB = 1024 * 1024


def make_data_file(size_mb: int) -> Path:
    """Write a ``size_mb`` MiB file of non-zero bytes into the temp dir and return its path."""
    fd, name = tempfile.mkstemp(prefix="slow_loader-", suffix=".bin")
    block = bytes(range(256)) * (_MIB // 256)
    with os.fdopen(fd, "wb") as out:
        for _ in range(size_mb):
            out.write(block)
    return Path(name)


def read_slowly(path: Path, seconds: float, chunk: int, interval: float, drop_cache: bool) -> int:
    """Read ``path`` chunk by chunk at a fixed pace for ``seconds``; return the bytes read."""
    total = 0
    deadline = time.monotonic() + seconds
    next_read = time.monotonic()
    with path.open("rb", buffering=0) as src:
        fd = src.fileno()
        while time.monotonic() < deadline:
            data = src.read(chunk)
            if not data:  # end of file: start the next pass
                if drop_cache:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                src.seek(0)
                continue
            total += len(data)
            # Pace on an absolute schedule so the rate stays steady whatever each read cost.
            next_read += interval
            time.sleep(max(0.0, min(next_read, deadline) - time.monotonic()))
    return total


def main() -> None:
    """Parse arguments, read slowly and silently, then optionally serve."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=64, help="size of the data file to create")
    parser.add_argument("--file", type=Path, help="read this file instead of creating one")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to read silently")
    parser.add_argument("--chunk-kb", type=int, default=1024, help="bytes per read, in KiB")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between reads")
    parser.add_argument("--drop-cache", action="store_true", help="posix_fadvise DONTNEED before each pass")
    parser.add_argument("--port", type=int, help="after loading, serve GET /health on this port")
    add_ready_file_arg(parser)
    args = parser.parse_args()

    path = args.file or make_data_file(args.size_mb)
    try:
        log(f"loading weights from {path}")
        write_ready(args.ready_file)
        total = read_slowly(path, args.seconds, args.chunk_kb * 1024, args.interval, args.drop_cache)
    finally:
        if args.file is None:
            path.unlink(missing_ok=True)
    log(f"weights loaded ({total / _MIB:.1f} MiB read)")
    if args.port is not None:
        serve_health(args.port)


if __name__ == "__main__":
    main()
