"""The phase history's orchestration: at the end of every supervised launch (``run``, ``isolate``'s
trials) this boot against the history of its configuration, then this boot added to it; and the
``history`` command's listing and forgetting (cli/history.py parses, then calls these).

Here because it joins a boundary (collect/historydb.py, collect/bootfacts.py) to decisions
(analyse/history.py) and words (render/history_text.py), which only supervise/ and the commands may do; a
top-level ``history.py`` would be a command module of its own, which the architecture's table
(tests/unit/test_architecture.py) does not list. History never costs the verdict: whatever goes wrong is
one line of the report's notes, and the report is otherwise as it was.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
import sys
from collections.abc import Mapping

from hangwatch.analyse.history import auto_windows
from hangwatch.analyse.history import boot_key
from hangwatch.analyse.history import boot_record
from hangwatch.analyse.history import comparable
from hangwatch.analyse.history import compare
from hangwatch.analyse.history import launch_key
from hangwatch.analyse.history import listing_phases
from hangwatch.analyse.history import model_of
from hangwatch.analyse.history import pooled_usual
from hangwatch.collect.bootfacts import compile_caches_warm
from hangwatch.collect.bootfacts import local_model
from hangwatch.collect.bootfacts import model_name
from hangwatch.collect.historydb import HistoryUnavailable
from hangwatch.collect.historydb import history_path
from hangwatch.collect.historydb import open_history
from hangwatch.engines import registry
from hangwatch.errors import HangwatchError
from hangwatch.errors import UsageError
from hangwatch.model.history import AUTO_MIN_BOOTS
from hangwatch.model.history import AUTO_RULE
from hangwatch.model.history import HISTORY_SCHEMA
from hangwatch.model.history import USUAL_RULE
from hangwatch.model.history import BootKey
from hangwatch.model.history import ConfigHistory
from hangwatch.model.history import HistoryListing
from hangwatch.model.history import LaunchHistory
from hangwatch.model.history import PhaseWindow
from hangwatch.model.report import Report
from hangwatch.render.history_text import listing_text
from hangwatch.render.json_report import json_text
from hangwatch.render.json_report import report_to_dict
from hangwatch.words import plural

# The bundled demo's story is a script's timings, not a boot's: it is never recorded or compared (as if
# the demo had a state folder of its own, fresh each time).
DEMO_MODULE = "hangwatch.demo.story"


def started_wall(report: Report) -> float | None:
    try:
        return dt.datetime.fromisoformat(report.started_at).timestamp()
    except ValueError:
        return None


def key_of(report: Report, command: tuple[str, ...], env: Mapping[str, str]) -> BootKey:
    model, model_bytes = local_model(model_of(command))
    started = started_wall(report)
    return boot_key(
        report,
        command,
        model=model,
        model_bytes=model_bytes,
        host=socket.gethostname(),
        caches_warm=(
            compile_caches_warm(env, started, registry.cache_folders()) if started is not None else False
        ),
    )


def record_history(report: Report, command: tuple[str, ...], env: Mapping[str, str] | None = None) -> Report:
    """The report with ``phase_history`` (this boot against the boots before it) and any note; this boot's
    finished phases recorded (analyse.history.recordable says which)."""
    if DEMO_MODULE in command:
        return report
    env = os.environ if env is None else env
    key = key_of(report, command, env)
    record = boot_record(report)
    store, notes = open_history(history_path(env))
    comparison = None
    if store is not None:
        with store:
            try:
                past = store.past(key.key_id)  # before this boot is added: the comparison is with the others
            except HistoryUnavailable as exc:
                notes.append(str(exc))
            else:
                recorded = False
                if record.phases and store.writable:
                    try:
                        store.record(key, record)
                        recorded = True
                    except HistoryUnavailable as exc:
                        notes.append(str(exc))
                comparison = compare(report, key, past, recorded=recorded)
    return dataclasses.replace(
        # Deduplicated: a note said at launch (--stall-after auto read the history then) is not said twice.
        report,
        phase_history=comparison,
        notes=tuple(dict.fromkeys(report.notes + tuple(notes))),
    )


def launch_history(
    command: tuple[str, ...], engine: str, *, auto: bool, env: Mapping[str, str] | None = None
) -> LaunchHistory:
    """What the comparable configurations' earlier boots say before this one starts: each phase's usual
    duration and, with ``auto`` (--stall-after auto), each phase's window (analyse.history.auto_windows).
    Nothing is created: no history yet is nothing to say. The demo has none."""
    if DEMO_MODULE in command:
        return LaunchHistory()
    env = os.environ if env is None else env
    key = launch_key(command, engine, model=model_name(model_of(command)), host=socket.gethostname())
    store, notes = open_history(history_path(env), create=False)
    if store is None:
        return LaunchHistory(notes=tuple(notes))
    with store:
        try:
            found, _ = store.all_configs()
        except HistoryUnavailable as exc:
            return LaunchHistory(notes=(*notes, str(exc)))
    pasts = [p for p in found if comparable(p.key, key)]
    return LaunchHistory(pooled_usual(pasts), auto_windows(pasts) if auto else (), tuple(notes))


def auto_note(windows: tuple[PhaseWindow, ...], fixed_s: float) -> str:
    """The verdict's line on --stall-after auto: which phases had a window of their own, and the rest."""
    if not windows:
        return (
            f"stall window auto: no phase has {AUTO_MIN_BOOTS} earlier boots of this configuration timed "
            f"yet: {fixed_s:g} s for every phase ({AUTO_RULE})"
        )
    own = ", ".join(f"{w.phase} {w.window_s:g} s" for w in windows)
    return f"stall window auto: {own}; other phases and serving {fixed_s:g} s ({AUTO_RULE})"


MIN_ID_CHARS = 4  # a prefix shorter than this names too many configurations to be meant


class HistoryFailed(HangwatchError):
    """The history exists but could not be changed (a read-only state folder, another run holding it)."""

    exit_code = 1


def read_listing(env: Mapping[str, str] | None = None) -> HistoryListing:
    """Every configuration of the history, the most recently booted first; nothing is created."""
    path = history_path(env)
    store, notes = open_history(path, create=False)
    configs: list[ConfigHistory] = []
    if store is not None:
        with store:
            try:
                found, unreadable = store.all_configs()
            except HistoryUnavailable as exc:
                found, unreadable = [], 0
                notes.append(str(exc))
        if unreadable:
            notes.append(
                f"history: {plural(unreadable, 'configuration')} could not be read (another version's)"
            )
        configs = [
            ConfigHistory(p.key_id, p.key, p.boots, p.first_at, p.last_at, listing_phases(p)) for p in found
        ]
    return HistoryListing(HISTORY_SCHEMA, str(path), USUAL_RULE, tuple(configs), tuple(notes))


def show_history(*, as_json: bool) -> int:
    """``hangwatch history [--json]``: the listing on stdout; exit 0 (none yet is an empty listing)."""
    listing = read_listing()
    if as_json:
        for note in listing.notes:  # the JSON has them too; a person piping it to jq sees them here
            print(f"hangwatch: note: {note}", file=sys.stderr)
        sys.stdout.write(json_text(report_to_dict(listing)))
    else:
        print(listing_text(listing))
    return 0


def forget_history(given: str) -> int:
    """``hangwatch history --forget ID``: one configuration and its boots removed; exit 2 for an id that
    names none (or several), 1 where the history cannot be changed."""
    wanted = given.strip().lower()
    if len(wanted) < MIN_ID_CHARS:
        raise UsageError(
            f"--forget {given!r}: give the configuration's id, or at least {MIN_ID_CHARS} of its first "
            "characters (`hangwatch history` lists them)"
        )
    path = history_path()
    store, notes = open_history(path, create=False)
    for note in notes:
        print(f"hangwatch: note: {note}", file=sys.stderr)
    if store is None:
        raise UsageError(f"--forget {given}: no history to forget from ({path})")
    with store:
        try:
            matches = [k for k in store.key_ids() if k.startswith(wanted)]
            if not matches:
                raise UsageError(
                    f"--forget {given}: no configuration has this id (`hangwatch history` lists them)"
                )
            if len(matches) > 1:
                raise UsageError(
                    f"--forget {given}: {len(matches)} configurations start so ({', '.join(matches)}): "
                    "give more of the id"
                )
            boots = store.forget(matches[0])
        except HistoryUnavailable as exc:
            raise HistoryFailed(str(exc)) from None
    print(f"hangwatch history: forgot configuration {matches[0]} ({plural(boots, 'boot')})")
    return 0
