"""The ``isolate`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from hangwatch.cli.options import add_command
from hangwatch.cli.options import add_grace
from hangwatch.cli.options import add_output_file
from hangwatch.cli.options import add_supervision_options
from hangwatch.cli.options import command_of
from hangwatch.cli.options import output_folder
from hangwatch.cli.values import number
from hangwatch.cli.values import seconds
from hangwatch.engines import PROFILES
from hangwatch.errors import UsageError

if TYPE_CHECKING:
    from hangwatch.isolate.state import IsolateState
    from hangwatch.model.isolate import Toggle

EXIT_FOUND = 0  # a change made it boot (or the baseline boots: nothing to isolate)
EXIT_NOT_FOUND = 1  # inconclusive, or no change tried made it boot
EXIT_INTERRUPTED = 130
# Kept options parsed by a type function (whose call says they were given); the others are given
# when not left at None, False or [].
_TYPED = frozenset({"stall_after", "timeout", "interval", "probe_timeout", "grace", "budget"})


def _count(flag: str) -> Callable[[str], int]:
    parse = number(flag, "", example="3")

    def parse_count(text: str) -> int:
        value = parse(text)
        if value is None or value != int(value) or value < 1:
            raise UsageError(f"{flag} {text}: give a whole number, 1 or more, e.g. {flag} 3")
        return int(value)

    return parse_count


class IsolateCommand:
    """Find the setting that makes a hanging (or crashing) start-up boot: one change at a time.

    Example: hangwatch isolate --stall-after 120 --repeat 3 -- vllm serve M -tp 2 --speculative-config '{...}'
    The command as given is the baseline (trial 0); each further trial is the baseline with one change
    (built in where the engine's profile has them, or from --matrix FILE), supervised as `hangwatch run
    --until-ready` would, each in its own run directory, the tree cleaned up in between. Exit 0 when a
    change makes it boot (or the baseline boots), 1 when none does or the evidence is inconclusive, 130 on
    Ctrl-C.
    """

    name = "isolate"

    def __init__(self) -> None:
        # The options given on this command line (dests), as their values are parsed: a value equal to
        # the default is given all the same (`--stall-after 60` on resume of a run with 30 is refused).
        self._given: set[str] = set()

    def _track_given(self, parser: argparse.ArgumentParser) -> None:
        from hangwatch.isolate.state import OPTION_FLAGS

        for action in parser._actions:
            if action.dest in OPTION_FLAGS and action.type is not None and callable(action.type):
                parse = action.type

                def given(text: str, parse: Callable[[str], Any] = parse, dest: str = action.dest) -> Any:
                    self._given.add(dest)
                    return parse(text)

                action.type = given

    def given_options(self, args: argparse.Namespace) -> dict[str, object]:
        """dest -> value of each kept option this command line gives (OPTION_FLAGS)."""
        from hangwatch.isolate.state import OPTION_FLAGS

        out: dict[str, object] = {}
        for dest in OPTION_FLAGS:
            value = getattr(args, dest)
            if dest in self._given or (dest not in _TYPED and value not in (None, False, [])):
                out[dest] = value
        return out

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        t = parser.add_argument_group("what to try")
        t.add_argument(
            "--matrix", type=Path, metavar="FILE", help="the toggles to try, as TOML (docs/isolate.md)"
        )
        t.add_argument(
            "--engine",
            choices=sorted(PROFILES),
            help="engine profile (default: detected from the command line)",
        )
        t.add_argument(
            "--repeat",
            type=_count("--repeat"),
            default=None,
            metavar="N",
            help="run every trial N times (flaky hangs): each trial is then k of N booted",
        )
        t.add_argument(
            "--pairs",
            action="store_true",
            help="after the single changes, try pairs of those that did not make it boot alone",
        )
        t.add_argument(
            "--all", dest="run_all", action="store_true", help="try every change, even after one made it boot"
        )
        t.add_argument(
            "--budget",
            type=seconds("--budget", no_limit=True),
            metavar="S",
            help="total seconds for every trial together (default: no limit)",
        )
        t.add_argument(
            "--resume",
            type=Path,
            metavar="DIR",
            help="continue an interrupted isolate in DIR, without repeating its finished runs",
        )
        w = parser.add_argument_group("each trial's supervision (as hangwatch run --until-ready)")
        add_supervision_options(
            w, timeout_help="per trial: verdict timeout after S seconds if not ready (default: no limit)"
        )
        add_grace(w, "SIGTERM grace before SIGKILL at each clean-up (default: %(default)s)")
        w.add_argument("--no-stacks", action="store_true", help="never take stacks (py-spy)")
        w.add_argument("--no-doctor", action="store_true", help="skip the fast preflight checks")
        o = parser.add_argument_group("output")
        o.add_argument(
            "--run-dir",
            type=output_folder("--run-dir"),
            metavar="DIR",
            help="where each trial's run directory goes (trial-NN; default: "
            "~/.local/state/hangwatch/runs/...-isolate-PID)",
        )
        add_output_file(o, "--report-json", "write the result as JSON (schema hangwatch.isolate/1)")
        add_output_file(o, "--report-html", "write the result as one self-contained HTML page")
        o.add_argument("--quiet", action="store_true", help="no progress lines, only the result")
        add_command(parser, "the command to isolate (the baseline)")
        self._track_given(parser)

    def run(self, args: argparse.Namespace) -> int:
        from dataclasses import replace

        from hangwatch.cli.options import watch_options
        from hangwatch.isolate.session import IsolateOptions
        from hangwatch.isolate.session import run_isolate
        from hangwatch.isolate.state import OPTION_FLAGS
        from hangwatch.isolate.state import resumed_options
        from hangwatch.render.files import write_outputs
        from hangwatch.render.isolate_html import write_isolate_html
        from hangwatch.render.isolate_text import isolate_text
        from hangwatch.render.json_report import write_report

        command: tuple[str, ...] | None = command_of(args) or None
        state, toggles, notes = _state_and_toggles(args, command)
        given = self.given_options(args)
        self._given.clear()
        now = {dest: getattr(args, dest) for dest in OPTION_FLAGS}
        if args.resume is not None and state.options is None:
            warning = (
                f"{state.path} keeps no options (an older hangwatch wrote it): resuming with the ones given "
                "now; give the same --stall-after, --ready-url/--ready-pattern, --all ... as the first run"
            )
            print(f"hangwatch isolate: warning: {warning}", file=sys.stderr, flush=True)
            notes.append(warning)
        elif args.resume is not None and state.options is not None:
            # What the interrupted isolate ran with, whatever this command line leaves out.
            for dest, value in resumed_options(args.resume, state.options, given, now).items():
                setattr(args, dest, value)
        state.options = {dest: getattr(args, dest) for dest in OPTION_FLAGS}
        command = state.command
        repeat = args.repeat or state.repeat
        if state.runs and repeat != state.repeat:
            notes.append(f"--repeat {repeat} (the interrupted run had --repeat {state.repeat})")
        state.repeat = repeat
        state.toggles = toggles
        show_progress = not args.quiet
        args.report_md = None
        args.quiet = True
        watch = replace(watch_options(args), report_json=None, report_html=None)
        run_dir = state.path.parent
        if not args.no_doctor and not state.runs:
            from hangwatch.run import preflight

            preflight(command, args.engine)
        options = IsolateOptions(
            command=command, watch=watch, grace=args.grace, run_dir=run_dir, repeat=repeat,
            budget_s=args.budget, run_all=args.run_all, pairs=args.pairs, toggles=toggles, notes=tuple(notes),
        )  # fmt: skip

        def say(text: str) -> None:
            if show_progress:
                print(f"[isolate] {text}", file=sys.stderr, flush=True)

        say(f"{len(toggles)} change(s) to try, --repeat {repeat}; runs in {run_dir}")
        report = run_isolate(options, state, say)
        print(isolate_text(report), flush=True)
        write_outputs(
            [
                ("--report-json", args.report_json, lambda path: write_report(report, path)),
                ("--report-html", args.report_html, lambda path: write_isolate_html(report, path)),
            ]
        )
        write_report(report, run_dir / "isolate.json")
        if report.interrupted:
            # The options are kept in the state: the directory (and the command, when it held secrets)
            # is all a resume needs.
            again = "" if state.command_complete() else " -- <the same command>"
            print(f"continue with: hangwatch isolate --resume {run_dir}{again}", flush=True)
            return EXIT_INTERRUPTED
        found = bool(report.conclusion.minimal_changes) or (
            report.baseline is not None and report.baseline.all_booted
        )
        return EXIT_FOUND if found else EXIT_NOT_FOUND


def _state_and_toggles(
    args: argparse.Namespace, command: tuple[str, ...] | None
) -> tuple[IsolateState, tuple[Toggle, ...], list[str]]:
    """Where the runs go (a new run directory, or the one resumed) and the changes to try."""
    from hangwatch.isolate.matrix import load_matrix
    from hangwatch.isolate.state import STATE_FILE
    from hangwatch.isolate.state import IsolateState
    from hangwatch.isolate.state import load_state
    from hangwatch.supervise.session import default_run_dir

    notes: list[str] = []
    if args.resume is not None:
        if args.run_dir is not None and args.run_dir.resolve() != args.resume.resolve():
            raise UsageError("--resume DIR and --run-dir name two folders: give only --resume DIR")
        state = load_state(args.resume, command)
        notes.append(f"resumed from {args.resume}")
    else:
        if command is None:
            raise UsageError(
                "no command to isolate",
                "Put the command after `--`: hangwatch isolate [options] -- CMD [ARGS...]",
            )
        run_dir = args.run_dir or default_run_dir().with_name(default_run_dir().name + "-isolate")
        if (run_dir / STATE_FILE).exists():
            raise UsageError(
                f"--run-dir {run_dir} already holds an isolate run",
                f"Continue it with --resume {run_dir}, or give another --run-dir.",
            )
        state = IsolateState(run_dir / STATE_FILE, command, args.repeat or 1, ())
    if args.matrix is not None:
        toggles = load_matrix(args.matrix)
    elif args.resume is not None and state.toggles:
        toggles = state.toggles
    else:
        toggles = _builtin(state.command, args.engine, notes)
    return state, toggles, notes


def _builtin(command: tuple[str, ...], engine: str | None, notes: list[str]) -> tuple[Toggle, ...]:
    from hangwatch import engines
    from hangwatch.collect.pyenv import interpreter_of
    from hangwatch.collect.pyenv import quick_env

    profile = engines.by_name(engine) if engine else engines.detect(command)
    if profile.distribution is None:
        raise UsageError(
            f"no changes to try: the {profile.name} profile has none built in",
            "Give --matrix FILE (TOML, one [[toggle]] per change; docs/isolate.md), or --engine "
            + "|".join(p.name for p in engines.ENGINES if p.distribution is not None)
            + ".",
        )
    version = None
    python = interpreter_of(command)
    if python is not None:
        installed = profile.boot.versions or (profile.distribution,)
        version = quick_env(python, profile.distributions).version_of(*installed)
    toggles = profile.toggles(command, version)
    notes.append(
        f"built-in {profile.name} toggles"
        + (f" for {profile.distribution} {version}" if version else " (installed version unknown)")
    )
    if not toggles:
        raise UsageError(
            f"no built-in {profile.name} change applies to this command",
            "Give --matrix FILE with the changes to try (docs/isolate.md).",
        )
    return toggles
