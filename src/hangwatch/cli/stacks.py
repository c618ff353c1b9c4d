"""The ``stacks`` command."""

from __future__ import annotations

import argparse

from hangwatch.cli.options import add_output_file
from hangwatch.cli.options import seconds
from hangwatch.engines import PROFILES
from hangwatch.errors import UsageError


class StacksCommand:
    """Take the stacks of every process of a running tree now, merged across ranks, with a cause.

    Read-only: processes in state T are not dumped (they are reported as stopped), and a process a
    dump leaves stopped is resumed. Needs the same permission as a debugger (py-spy uses ptrace).
    """

    name = "stacks"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--pid", type=int, required=True, help="PID of the tree's root (the launcher)")
        parser.add_argument("--engine", choices=sorted(PROFILES), help="engine profile (default: detected)")
        parser.add_argument(
            "--samples",
            type=int,
            default=1,
            metavar="N",
            help="capture rounds, to see what moves (default: 1)",
        )
        parser.add_argument(
            "--every",
            type=seconds("--every"),
            default=2.0,
            metavar="S",
            help="seconds between rounds (default: 2)",
        )
        parser.add_argument(
            "--no-native", action="store_true", help="Python frames only (no --native unwinding)"
        )
        add_output_file(parser, "--report-json", "write the samples and the merged tree")

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.stacks import SnapshotOptions
        from hangwatch.stacks import take_snapshot

        if args.samples < 1 or args.samples > 100:
            raise UsageError("--samples must be between 1 and 100")
        options = SnapshotOptions(
            pid=args.pid,
            engine=args.engine,
            samples=args.samples,
            every_s=args.every,
            native=not args.no_native,
            report_json=args.report_json,
        )
        return take_snapshot(options)
