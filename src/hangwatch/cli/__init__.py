"""The command line: ``hangwatch run``, ``attach``, ``watch``, ``probe``, ``dump``, ``stacks``,
``collect``, ``doctor``, ``cleanup``, ``bench``, ``isolate``, ``history``, ``demo``.

``main(argv) -> int`` returns the exit code so tests can call it directly; errors a user can act
on are ``HangwatchError`` subclasses, caught here and only here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from typing import NoReturn

from hangwatch import __version__
from hangwatch.cli.command import Command
from hangwatch.errors import HangwatchError
from hangwatch.errors import UsageError
from hangwatch.model.vocabulary import USAGE_EXIT_CODE
from hangwatch.redact import scrub
from hangwatch.render.files import STDOUT
from hangwatch.render.files import report_on_stdout

# Each command's module and class, in the order --help lists them. A command's module is imported when
# it runs (or to list them all): `hangwatch collect`, which every node of a fan-out starts, then imports
# the collector, not the watch, the analysis and the renderers (docs/multinode.md).
COMMAND_CLASSES: tuple[tuple[str, str, str], ...] = (
    ("run", "hangwatch.cli.run", "RunCommand"),
    ("attach", "hangwatch.cli.attach", "AttachCommand"),
    ("watch", "hangwatch.cli.watch", "WatchCommand"),
    ("probe", "hangwatch.cli.watch", "ProbeCommand"),
    ("dump", "hangwatch.cli.watch", "DumpCommand"),
    ("stacks", "hangwatch.cli.stacks", "StacksCommand"),
    ("collect", "hangwatch.cli.collect", "CollectCommand"),
    ("doctor", "hangwatch.cli.doctor", "DoctorCommand"),
    ("cleanup", "hangwatch.cli.cleanup", "CleanupCommand"),
    ("bench", "hangwatch.cli.bench", "BenchCommand"),
    ("isolate", "hangwatch.cli.isolate", "IsolateCommand"),
    ("history", "hangwatch.cli.history", "HistoryCommand"),
    ("demo", "hangwatch.cli.demo", "DemoCommand"),
)


def commands(only: str | None = None) -> tuple[Command, ...]:
    """The commands (``only``: that one, where it is one of them), each imported now."""
    chosen = [entry for entry in COMMAND_CLASSES if only is None or entry[0] == only]
    return tuple(getattr(importlib.import_module(module), cls)() for _, module, cls in chosen)


class Parser(argparse.ArgumentParser):
    """argparse, with an error said in one line and where to read more, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            USAGE_EXIT_CODE, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options)\n"
        )


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``only``: with that command's section alone (the one given: the others'
    modules are not imported), where it is a command."""
    parser = Parser(
        prog="hangwatch",
        description="Is my inference server still warming up, or is it wedged, and why?",
        epilog=(
            "Exit codes (run, attach): 0 ready or clean exit, 2 usage error, 3 stalled, 4 crashed, "
            "5 timeout, "
            "130 interrupted. doctor: 0 pass, 1 warnings, 3 failures. "
            "isolate: 0 a change makes it boot, 1 none found or inconclusive. "
            "watch: 0 once stopped. probe: 0 passes, 1 fails. dump: 0 written, 1 not."
        ),
    )
    parser.add_argument("--version", action="version", version=f"hangwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands(only if only in {name for name, _, _ in COMMAND_CLASSES} else None):
        doc = (type(command).__doc__ or "").strip()
        p = sub.add_parser(
            command.name,
            help=doc.splitlines()[0],
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.prepare_parser(p)
        p.set_defaults(handler=command)
    return parser


# The options that name a file hangwatch writes (cli/options.py's output_file): any may be `-`.
REPORT_OPTIONS = ("report_json", "report_html", "report_md")


def _unknown_leading_option(argv: list[str]) -> str | None:
    """An option given before the command that hangwatch itself does not have (``hangwatch --bogus``).

    argparse would first say that COMMAND is missing, which sends the user looking for the wrong thing."""
    for arg in argv:
        if arg in ("-h", "--help", "--version") or not arg.startswith("-"):
            return None
        return arg.split("=", 1)[0]
    return None


def _on_stdout(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """With an output on `-`, the report goes to stdout and everything else hangwatch (and what it starts)
    prints goes to stderr, so that ``hangwatch stacks --report-json - | jq`` reads JSON only."""
    dashes = [name for name in REPORT_OPTIONS if getattr(args, name, None) == STDOUT]
    if not dashes:
        return contextlib.nullcontext()
    if len(dashes) > 1:
        flags = " and ".join("--" + name.replace("_", "-") for name in dashes)
        raise UsageError(f"{flags} -: only one output can go to stdout: give the others a file name")
    return report_on_stdout()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    try:
        unknown = _unknown_leading_option(argv)
        if unknown is not None:
            raise UsageError(
                f"{unknown}: no such option of hangwatch: options go after the command "
                f"(hangwatch COMMAND {unknown} ...; `hangwatch --help` lists the commands)"
            )
        # Option types raise UsageError for a bad value (a report path that is a folder, --stall-after nan):
        # one short message, not the whole usage.
        args, extras = parser.parse_known_args(argv)
        if extras:
            # Said with the command's own help: `hangwatch --help` does not list `run`'s options.
            raise UsageError(
                f"unrecognized arguments: {' '.join(extras)} "
                f"(`hangwatch {args.command} --help` lists its options)"
            )
        handler: Command = args.handler
        with _on_stdout(args):
            return handler.run(args)
    except HangwatchError as exc:
        # Redacted as every other line hangwatch prints: an error may quote a URL or an argument.
        print(f"hangwatch: error: {scrub(exc.describe())}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("hangwatch: interrupted", file=sys.stderr)
        return 130


def console_main() -> None:
    try:
        code = main()
    except SystemExit as exc:  # argparse exits 2 on a usage error: keep it
        code = exc.code if isinstance(exc.code, int) else USAGE_EXIT_CODE
    sys.exit(code)
