"""Run hangwatch's ``doctor`` and ``cleanup`` commands in a subprocess, as the CLI does.

The same parser setup and error handling as ``hangwatch.cli.main``, with only these two
commands, so that their tests do not depend on the rest of the command registry (once
cli/__init__.py lists them, ``python -m hangwatch doctor ...`` is equivalent).
"""

from __future__ import annotations

import sys

_MAIN = """
import argparse, sys
from hangwatch.cli.cleanup import CleanupCommand
from hangwatch.cli.doctor import DoctorCommand
from hangwatch.errors import HangwatchError
parser = argparse.ArgumentParser(prog="hangwatch")
sub = parser.add_subparsers(dest="command", required=True)
for command in (DoctorCommand(), CleanupCommand()):
    p = sub.add_parser(command.name, description=command.__doc__)
    command.prepare_parser(p)
    p.set_defaults(handler=command)
args = parser.parse_args(sys.argv[1:])
try:
    sys.exit(args.handler.run(args))
except HangwatchError as exc:
    print(f"hangwatch: error: {exc.describe()}", file=sys.stderr)
    sys.exit(exc.exit_code)
"""


def hangwatch_argv(*args: str) -> list[str]:
    return [sys.executable, "-c", _MAIN, *args]
