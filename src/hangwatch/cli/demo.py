"""The ``demo`` command."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from hangwatch.cli.options import add_output_file
from hangwatch.cli.options import seconds
from hangwatch.model.vocabulary import State

STALLED_EXIT = State.STALLED.exit_code


class DemoCommand:
    """Replay the story behind hangwatch in small: an SGLang-like server loads, then deadlocks silently.

    A launcher and a few "scheduler" ranks print SGLang's startup lines, really read their
    "weights", then block forever waiting on each other at 0 % CPU. hangwatch follows the phases
    and gives the stall verdict in about 30 s.
    """

    name = "demo"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--ranks", type=int, default=4, help="scheduler ranks (default: 4)")
        parser.add_argument(
            "--stall-after",
            type=seconds("--stall-after"),
            default=12.0,
            metavar="S",
            help="stall window (default: 12 s)",
        )
        add_output_file(parser, "--report-json", "write the report as JSON")
        parser.add_argument("--quiet", action="store_true", help="only the verdict")

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.cli import main

        run_dir = Path(tempfile.mkdtemp(prefix="hangwatch-demo-"))
        argv = ["run", "--engine", "sglang", "--until-ready", "--stall-after", str(args.stall_after)]
        # No preflight: the demo's "engine" is a story on this machine, not a server to check it for.
        argv += ["--run-dir", str(run_dir), "--grace", "3", "--no-doctor"]
        if args.report_json:
            argv += ["--report-json", str(args.report_json)]
        if args.quiet:
            argv.append("--quiet")
        argv += ["--", sys.executable, "-m", "hangwatch.demo.story", "--ranks", str(args.ranks)]
        code = main(argv)
        if code != STALLED_EXIT:
            print(
                f"\nThe demo should end in a stall verdict (exit {STALLED_EXIT}), "
                f"but hangwatch exited {code}."
            )
            return code
        print(
            "\nThat was the demo: the ranks loaded their weights, then waited on each other forever "
            "(0 % CPU, no log, no port). `hangwatch run` exits 3 for a stall; the demo exits 0 because "
            "that is the outcome it exists to show."
        )
        return 0
