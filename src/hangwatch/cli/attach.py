"""The ``attach`` command."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from hangwatch.cli.options import add_watch_options
from hangwatch.cli.options import seconds
from hangwatch.cli.options import watch_options
from hangwatch.errors import UsageError


class AttachCommand:
    """Watch a server someone else started, read-only, and give the same verdict.

    Nothing is ever signalled, stopped or killed in attach mode. The server's log is followed from
    --log, or found automatically when its stdout or stderr is a regular file.
    """

    name = "attach"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--pid", type=int, required=True, help="PID of the server's main (launcher) process"
        )
        parser.add_argument(
            "--window",
            type=seconds("--window"),
            default=60.0,
            metavar="S",
            help="watch for S seconds (default: 60)",
        )
        parser.add_argument("--log", type=Path, metavar="FILE", help="the server's log file to follow")
        parser.add_argument(
            "--own-request",
            action="store_true",
            help="while it serves, send the server a one-token completion of hangwatch's own, with a "
            "deadline (the only traffic attach ever sends besides the readiness probe; off by default)",
        )
        add_watch_options(parser, stall_default=None)

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.attach import AttachOptions
        from hangwatch.attach import run_attached
        from hangwatch.collect.proctree import whole_machine_note

        stall = args.stall_after if args.stall_after is not None else args.window
        if args.log is not None and not args.log.is_file():
            raise UsageError(f"--log {args.log}: no such file")
        options = AttachOptions(
            watch=replace(watch_options(args, stall_after=stall), own_request=args.own_request),
            pid=args.pid,
            window=args.window,
            log=args.log,
        )
        note = whole_machine_note(args.pid)
        if note is not None:
            print(f"hangwatch attach: {note}", file=sys.stderr, flush=True)
        return run_attached(options)
