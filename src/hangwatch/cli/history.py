"""The ``history`` command."""

from __future__ import annotations

import argparse


class HistoryCommand:
    """List the phase history: each configuration and the usual duration of each phase of its boots.

    Every `hangwatch run` (and each `isolate` trial) records the phases its boot finished, keyed by what
    makes boots comparable: engine and version, model and its size, TP/PP/DP/EP, boot-changing switches,
    GPU model and count, host, and whether the compile caches were warm. A run's report shows each phase
    against that history. The database is $XDG_STATE_HOME/hangwatch/history.sqlite3
    (default ~/.local/state/hangwatch/).

    Example: hangwatch history --json | jq '.configurations[].phases'
             hangwatch history --forget 3fa2c1d0e4b5
    """

    name = "history"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--json", action="store_true", help="the listing as JSON on stdout (schema hangwatch.history/1)"
        )
        parser.add_argument(
            "--forget",
            metavar="ID",
            help="remove one configuration and its boots (its id as the listing shows it, or enough of its "
            "first characters to name one)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from hangwatch.supervise.history import forget_history
        from hangwatch.supervise.history import show_history

        if args.forget is not None:
            return forget_history(args.forget)
        return show_history(as_json=args.json)
