"""The ``collect`` command: this node's evidence as one JSON bundle on stdout (hangwatch.node-bundle/2)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hangwatch.cli.values import seconds
from hangwatch.engines import PROFILES
from hangwatch.errors import UsageError
from hangwatch.model.nodes import CollectMode


class CollectCommand:
    """Print this node's share of a server as one JSON bundle: what `stacks --hosts` runs on each node.

    The processes are the trees of the --pid roots, or of the processes whose title or command line
    matches --match (a regular expression): never more. census: processes, ranks, CPU and thread states
    over --every seconds; full (the default): plus --samples stack rounds and log tails. Read-only,
    bounded by --deadline and --max-bytes; what fails is listed in the bundle's errors.
    """

    name = "collect"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--pid", type=int, action="append", default=[], help="a root of the server's tree")
        which.add_argument(
            "--match", metavar="REGEX", help="roots: processes whose title or command line match"
        )
        parser.add_argument("--mode", choices=[m.value for m in CollectMode], default=CollectMode.FULL.value)
        parser.add_argument("--engine", choices=sorted(PROFILES), help="engine profile (default: detected)")
        parser.add_argument("--samples", type=int, default=2, metavar="N", help="stack rounds (full mode)")
        parser.add_argument(
            "--every", type=seconds("--every"), default=1.0, metavar="S", help="seconds between rounds"
        )
        parser.add_argument("--no-native", action="store_true", help="Python frames only")
        parser.add_argument("--log", type=Path, action="append", default=[], help="a log file to tail")
        parser.add_argument("--log-lines", type=int, default=30, metavar="N")
        parser.add_argument(
            "--deadline",
            type=seconds("--deadline"),
            default=20.0,
            metavar="S",
            help="stop taking rounds by then",
        )
        parser.add_argument("--max-bytes", type=int, default=8_000_000, help="cap on the bundle's size")
        parser.add_argument(
            "--no-probe", action="store_true", help="send no request to the engine's readiness URL"
        )
        parser.add_argument("--probe-url", metavar="URL", help="probe this URL on the node instead")
        parser.add_argument("--no-gpu", action="store_true", help="no NVML reading")
        parser.add_argument(
            "--stream",
            action="store_true",
            help="stay running: one bundle per request line on stdin (census, full, full-native), "
            "until stdin closes (what attach --hosts keeps open on each node)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.collect.http_probe import validate_probe_url
        from hangwatch.collect.nvml import NvmlGpuSource
        from hangwatch.nodes import codec
        from hangwatch.nodes.collector import CollectOptions
        from hangwatch.nodes.collector import collect

        if not 1 <= args.samples <= 20:
            raise UsageError("--samples must be between 1 and 20")
        if args.max_bytes < 10_000:
            raise UsageError("--max-bytes must be at least 10000")
        options = CollectOptions(
            pids=tuple(args.pid),
            match=args.match,
            mode=CollectMode(args.mode),
            samples=args.samples,
            every_s=args.every,
            native=not args.no_native,
            engine=args.engine,
            logs=tuple(args.log),
            log_lines=args.log_lines,
            deadline_s=args.deadline,
            max_bytes=args.max_bytes,
            probe=not args.no_probe,
            probe_url=validate_probe_url(args.probe_url) if args.probe_url else None,
        )
        # NVML once for the whole run (a stream reads it every round): its start costs tens of ms.
        gpu = None if args.no_gpu else NvmlGpuSource()
        try:
            if args.stream:
                from hangwatch.nodes.collector import serve_requests

                return serve_requests(options, sys.stdin, sys.stdout, gpu)
            sys.stdout.write(codec.encode(collect(options, gpu=gpu)) + "\n")
            sys.stdout.flush()
            return 0
        finally:
            if gpu is not None:
                gpu.close()
