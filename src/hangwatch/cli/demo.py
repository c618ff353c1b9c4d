"""The ``demo`` command."""

from __future__ import annotations

import argparse

from hangwatch.cli.options import add_report_files
from hangwatch.cli.options import default_run_dir_checked
from hangwatch.cli.options import output_folder
from hangwatch.cli.values import seconds
from hangwatch.errors import UsageError

MIN_RANKS = 2  # the deadlock is between ranks: one rank alone has nobody to wait for
MAX_RANKS = 64


def _ranks(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--ranks {text!r}: not a whole number; give e.g. --ranks 4") from None
    if value < MIN_RANKS:
        raise UsageError(
            f"--ranks {value}: the demo's deadlock is between ranks, so it needs at least {MIN_RANKS} "
            "(default: 4)"
        )
    if value > MAX_RANKS:
        raise UsageError(f"--ranks {value}: at most {MAX_RANKS} (each rank is a process of this machine)")
    return value


class DemoCommand:
    """Replay the story behind hangwatch in small: an SGLang-like server loads, then deadlocks silently.

    A launcher and a few "scheduler" ranks print SGLang's startup lines, really read their
    "weights", then block forever waiting on each other at 0 % CPU. hangwatch follows the phases
    and gives the stall verdict about 15 s after the start. The story's log goes to a run folder as
    `hangwatch run`'s does (--run-dir, default ~/.local/state/hangwatch/runs/..., the oldest pruned).
    """

    name = "demo"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--ranks",
            type=_ranks,
            default=4,
            help=f"scheduler ranks, {MIN_RANKS} to {MAX_RANKS} (default: 4)",
        )
        parser.add_argument(
            "--stall-after",
            type=seconds("--stall-after"),
            default=12.0,
            metavar="S",
            help="stall window (default: 12 s)",
        )
        # The verdict names the story's log: it must still be there afterwards, so it goes where run's
        # logs go (pruned like them), not to a temporary folder that is removed or left to pile up.
        parser.add_argument(
            "--run-dir",
            type=output_folder("--run-dir"),
            help="where the story's log goes (default: ~/.local/state/hangwatch/runs/...)",
        )
        add_report_files(parser)
        parser.add_argument("--quiet", action="store_true", help="only the verdict")

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.demo.session import run_demo

        return run_demo(
            ranks=args.ranks, stall_after_s=args.stall_after,
            run_dir=args.run_dir or default_run_dir_checked(),
            report_json=args.report_json, report_html=args.report_html, report_md=args.report_md,
            quiet=args.quiet,
        )  # fmt: skip
