"""The ``cleanup`` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from hangwatch.cli.options import add_grace
from hangwatch.cli.values import seconds
from hangwatch.errors import UsageError


class CleanupCommand:
    """Stop one process tree you name, and verify it freed the GPUs and /dev/shm.

    The tree is a PID (with its descendants, and its session if it leads one), the tree listening
    on a port, or a hangwatch run directory. SIGTERM to each process (stopped ones are continued),
    a grace period, SIGKILL; then: no process of the tree left, its GPU memory released (NVML,
    bounded wait), and its /dev/shm segments removed once no process at all maps them. Nothing
    outside the named tree is signalled, and nothing is ever matched by name.
    Exit code 0 clean, 1 GPU memory not released in time, 3 processes remain.

    Example: hangwatch cleanup --port 8000 --dry-run
    """

    name = "cleanup"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--pid", type=int, help="the root of the tree")
        which.add_argument(
            "--run", type=Path, metavar="DIR", help="a hangwatch run directory (with run.json)"
        )
        which.add_argument("--port", type=int, metavar="N", help="the tree listening on this TCP port")
        parser.add_argument("--dry-run", action="store_true", help="list what would be done; change nothing")
        add_grace(parser, "SIGTERM grace before SIGKILL (default: 10)")
        parser.add_argument(
            "--gpu-wait",
            type=seconds("--gpu-wait", zero_ok=True),
            default=15.0,
            metavar="S",
            help="how long to wait for the GPU memory to be released (default: 15)",
        )

    def run(self, args: argparse.Namespace) -> int:

        if args.port is not None and not 0 < args.port < 65536:
            raise UsageError(f"--port {args.port}: not a TCP port")
        if args.pid is not None and args.pid <= 0:
            raise UsageError(f"--pid {args.pid}: not a process id")
        from hangwatch.cleanup import run_cleanup

        return run_cleanup(
            pid=args.pid, port=args.port, run_dir=args.run, dry_run=args.dry_run, grace_s=args.grace,
            gpu_wait_s=args.gpu_wait,
        )  # fmt: skip
