"""stacks:stale-lock-file: a member that polls in place while a lock file no process holds, older than
the tree, sits in the build caches (a marker a killed build left). Not for a marker of this run, not
without a poller, not for a lock a live process holds (collect/lockfiles.py leaves those out)."""

from __future__ import annotations

from dataclasses import replace

from fixtures.stacks import loader
from hangwatch.analyse.causes import Diagnosis
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import Miss
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stackrules import rule_stale_lock_file
from hangwatch.model.lockfiles import LockFile
from hangwatch.model.vocabulary import Cause

MARKER = LockFile("/home/u/.cache/torch_extensions/py311_cu121/fused/lock", 1800.0, before_start=True)


def _context(retrying: bool, lock_files: tuple[LockFile, ...]):
    ctx = stack_context(loader.samples("progress_then_hang", "python"), loader.ticks("progress_then_hang"))
    views = tuple(v._replace(retrying=retrying, cpu_cores=0.0) for v in ctx.views)
    return replace(ctx, views=views, lock_files=lock_files)


def test_a_poller_and_an_old_marker_name_the_marker_and_its_removal():
    d = rule_stale_lock_file(_context(True, (MARKER,)))
    assert isinstance(d, Diagnosis) and d.cause is Cause.COMPILE_STALL and not d.closed, d
    assert MARKER.path in d.explanation and "30 min" in d.explanation
    assert d.steps[0].startswith(f"Remove the marker: `rm {MARKER.path}`")
    whole = classify(_context(True, (MARKER,)))
    assert whole.rules == ("stacks:stale-lock-file",) and whole.culprits == d.culprits


def test_a_marker_made_during_this_run_is_no_leftover():
    fresh = replace(MARKER, age_s=5.0, before_start=False)
    found = rule_stale_lock_file(_context(True, (fresh,)))
    assert isinstance(found, Miss) and "older than the tree" in found.lacked


def test_no_poller_no_cause_and_no_marker_no_shape():
    found = rule_stale_lock_file(_context(False, (MARKER,)))
    assert isinstance(found, Miss) and "polling" in found.lacked
    assert rule_stale_lock_file(_context(True, ())) is None
