"""What every subcommand is: a parser section and a run method returning an exit code."""

from __future__ import annotations

import argparse
from typing import Protocol


class Command(Protocol):
    name: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...
