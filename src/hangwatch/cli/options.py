"""Options shared by the commands: the option types (output files), and ``run``/``attach``'s watch options,
parsed once into a typed, frozen dataclass.

An option type checks its value while the command line is parsed and raises ``UsageError`` (not
argparse's error, which prints the whole usage): ``hangwatch: error: --report-md out: is a folder ...``,
exit 2, before anything starts.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

from hangwatch.analyse.assess import DEFAULT_STALL_AFTER_S
from hangwatch.cli.values import seconds
from hangwatch.collect.http_probe import validate_probe_url
from hangwatch.engines import PROFILES
from hangwatch.errors import UsageError
from hangwatch.model.history import AUTO_FACTOR
from hangwatch.model.history import AUTO_FLOOR_S
from hangwatch.model.history import AUTO_MARGIN_S
from hangwatch.model.history import AUTO_MIN_BOOTS
from hangwatch.render.files import STDOUT
from hangwatch.render.files import folder_problem
from hangwatch.render.files import output_path_problem
from hangwatch.supervise.plan import WatchOptions

ArgGroup = argparse.ArgumentParser | argparse._ArgumentGroup


def output_file(flag: str) -> Callable[[str], Path]:
    """The type of an option that names a file hangwatch writes: a file in a folder that exists and
    that we can write in, a FIFO, a device or a descriptor we can write to, never a folder; ``-`` is
    standard output (``STDOUT``: ``cli`` then moves the command's own words to stderr)."""

    example = "report." + flag.rsplit("-", 1)[-1]  # --report-md: report.md

    def parse(text: str) -> Path:
        if not text.strip():
            raise UsageError(f"{flag} needs a file name, e.g. {flag} {example}")
        if text == "-":
            return STDOUT
        path = Path(text).expanduser()
        problem = output_path_problem(path, example)
        if problem is not None:
            raise UsageError(f"{flag} {text}: {problem}")
        return path

    return parse


def output_folder(flag: str) -> Callable[[str], Path]:
    """The type of an option that names a folder hangwatch creates files in (``--run-dir``): a folder we
    can create files in, or a path where one can be made (tried for real, before anything starts)."""

    def parse(text: str) -> Path:
        if not text.strip():
            raise UsageError(f"{flag} needs a folder, e.g. {flag} ./runs/first")
        path = Path(text).expanduser()
        problem = output_folder_problem(path)
        if problem is not None:
            raise UsageError(f"{flag} {text}: {problem}")
        return path

    return parse


def output_folder_problem(path: Path) -> str | None:
    """Why files cannot be created in the folder ``path`` (made with its parents if missing), or None."""
    existing = path
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir():
        problem = folder_problem(existing)
        return None if problem is None else f"{problem}: give a folder you can write to"
    if existing == path:
        return "is a file, not a folder: give a folder (it is created if missing)"
    return f"{existing} is a file, not a folder: give a folder (it is created if missing)"


def default_run_dir_checked() -> Path:
    """A new run folder under the default place, refused (exit 2, before launching) where none can be
    made (a read-only home, a $XDG_STATE_HOME that is a file).

    The oldest run folders there are removed first, so that the newest $HANGWATCH_KEEP_RUNS (default 50,
    this one counted) remain (supervise/rundirs.py); a --run-dir the user gives is never pruned, since
    this is called only without one. Pruning never fails the command: a note on stderr at most."""
    import sys

    from hangwatch.supervise.rundirs import keep_runs_setting
    from hangwatch.supervise.rundirs import prune_run_dirs
    from hangwatch.supervise.session import default_run_dir

    path = default_run_dir()
    problem = output_folder_problem(path)
    if problem is not None:
        raise UsageError(f"--run-dir (default) {path}: {problem}, or give --run-dir DIR")
    keep, note = keep_runs_setting()
    notes = [note] if note else []
    if path.parent.is_dir():  # the first run makes the base: nothing to prune yet
        notes += prune_run_dirs(path.parent, keep, new=path).problems
    for line in notes:
        print(f"hangwatch: note: old run folders: {line}", file=sys.stderr)
    return path


def probe_url(flag: str) -> Callable[[str], str]:
    """The type of an option that names a URL hangwatch probes (``--ready-url``)."""

    def parse(text: str) -> str:
        return validate_probe_url(text, flag)

    return parse


STALL_AUTO = "auto"


def stall_after_arg(text: str) -> float | str:
    """``--stall-after S`` or ``--stall-after auto`` (each boot phase's window from its history)."""
    if text.strip().lower() == STALL_AUTO:
        return STALL_AUTO
    try:
        value = seconds("--stall-after")(text)
    except UsageError as exc:
        raise UsageError(
            f"{exc}; or --stall-after auto (each start-up phase's window from its history)"
        ) from None
    if value is None:  # not reached: only ``no_limit`` options read inf as None
        raise UsageError(f"--stall-after {text}: give a number of seconds, or auto")
    return value


def add_output_file(group: ArgGroup, flag: str, help_text: str) -> None:
    """``--report-json FILE`` and its kin, the same in every command."""
    group.add_argument(
        flag, type=output_file(flag), metavar="FILE", help=f"{help_text} (-: to stdout, the rest to stderr)"
    )


def add_grace(group: ArgGroup, help_text: str) -> None:
    """``--grace S``: how long the clean-up waits after SIGTERM before SIGKILL (run, cleanup, isolate)."""
    group.add_argument(
        "--grace", type=seconds("--grace", zero_ok=True), default=10.0, metavar="S", help=help_text
    )


def add_command(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The command after ``--`` (run, doctor, isolate); :func:`command_of` reads it."""
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]", help=help_text)


def command_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The command given after ``--`` (the separator itself left out); () when none was."""
    cmd: list[str] = args.cmd
    return tuple(cmd[1:] if cmd[:1] == ["--"] else cmd)


def add_report_files(group: ArgGroup) -> None:
    """The reports of one watch (run, attach, demo): JSON, HTML, Markdown."""
    add_output_file(group, "--report-json", "write the report as JSON (schema hangwatch.report/1)")
    add_output_file(group, "--report-html", "write a self-contained HTML report (works offline)")
    add_output_file(group, "--report-md", "write a short Markdown summary for an issue tracker")


def add_watch_options(
    parser: argparse.ArgumentParser, stall_default: float | None = DEFAULT_STALL_AFTER_S
) -> None:
    """The options of one watch (run, attach). ``stall_default`` None: the command resolves a missing
    --stall-after itself (attach: never longer than its window); the help says the same in both."""
    g = parser.add_argument_group("what to watch for")
    g.add_argument(
        "--engine", choices=sorted(PROFILES), help="engine profile (default: detected from the command line)"
    )
    add_supervision_options(g, stall_default)
    o = parser.add_argument_group("output")
    add_report_files(o)
    o.add_argument(
        "--no-stacks", action="store_true", help="never take stacks (py-spy), even when the tree goes quiet"
    )
    o.add_argument("--quiet", action="store_true", help="no echo of the server's output, no live view")


def add_supervision_options(
    g: ArgGroup,
    stall_default: float | None = DEFAULT_STALL_AFTER_S,
    timeout_help: str = "give up (verdict timeout) after S seconds if not ready (default: no limit)",
) -> None:
    """How one watch decides: readiness, the stall window, the timeout, sampling and probing. Shared by
    every command that supervises (run, attach, each of isolate's trials), read by ``watch_options``."""
    g.add_argument(
        "--ready-url",
        type=probe_url("--ready-url"),
        help="ready when this URL answers 2xx (default: the engine's /health)",
    )
    g.add_argument("--ready-pattern", help="ready when a log line matches this regular expression")
    g.add_argument(
        "--waiting-pattern",
        action="append",
        default=[],
        metavar="REGEX",
        help="log lines that mean 'still waiting' and are not progress (repeatable)",
    )
    g.add_argument(
        "--stall-after",
        type=stall_after_arg,
        default=stall_default,
        metavar="S",
        # One rule, said one way in every command: the default is the Assessor's, whoever resolves it.
        help=f"stalled when nothing progresses for S seconds (default: {DEFAULT_STALL_AFTER_S:g} s); "
        "sooner when the stacks show a wait nothing can end. 'auto' (run, isolate): each start-up "
        f"phase its own window, {AUTO_FACTOR:g} x its longest quiet spell in earlier boots of the same "
        f"configuration + {AUTO_MARGIN_S:g} s, at least {AUTO_FLOOR_S:g} s, once {AUTO_MIN_BOOTS} boots "
        f"timed it ({DEFAULT_STALL_AFTER_S:g} s before that, and while serving)",
    )
    g.add_argument(
        "--timeout",
        type=seconds("--timeout", no_limit=True),
        metavar="S",
        help=timeout_help,
    )
    g.add_argument(
        "--interval",
        type=seconds("--interval"),
        default=1.0,
        metavar="S",
        help="sampling interval (default: 1 s)",
    )
    g.add_argument(
        "--probe-timeout",
        type=seconds("--probe-timeout"),
        default=2.0,
        metavar="S",
        help="HTTP probe timeout (default: 2 s)",
    )


def _regex(text: str, flag: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise UsageError(f"{flag} {text!r} is not a valid regular expression: {exc}") from None


def watch_options(args: argparse.Namespace, stall_after_s: float | None = None) -> WatchOptions:
    given = stall_after_s if stall_after_s is not None else args.stall_after
    auto = given == STALL_AUTO
    # auto: the fixed window stands for every phase the history does not time yet, and for serving.
    stall = DEFAULT_STALL_AFTER_S if auto else given
    if not isinstance(stall, float | int) or stall <= 0:
        raise UsageError("--stall-after must be a positive number of seconds")
    if args.interval > stall:
        raise UsageError(f"--interval {args.interval:g} must be no longer than --stall-after {stall:g}")
    return WatchOptions(
        engine=args.engine,
        ready_url=validate_probe_url(args.ready_url, "--ready-url") if args.ready_url else None,
        ready_pattern=_regex(args.ready_pattern, "--ready-pattern") if args.ready_pattern else None,
        waiting_patterns=tuple(_regex(p, "--waiting-pattern") for p in args.waiting_pattern),
        stall_after_s=stall,
        timeout=args.timeout,
        interval=args.interval,
        report_json=args.report_json,
        quiet=args.quiet,
        probe_timeout=args.probe_timeout,
        report_html=getattr(args, "report_html", None),
        report_md=getattr(args, "report_md", None),
        stacks=not getattr(args, "no_stacks", False),
        stall_auto=auto,
    )
