"""Verdict.headline: the state once, then the summary."""

from __future__ import annotations

from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import State


def verdict(state: State, summary: str) -> Verdict:
    return Verdict(state=state, cause=None, phase=None, summary=summary, culprits=(), evidence=())


def test_a_summary_that_names_its_state_is_not_prefixed_again():
    v = verdict(State.STALLED, "stalled: nothing progressed for 10 s")
    assert v.headline == "stalled: nothing progressed for 10 s"


def test_a_summary_without_its_state_gets_it():
    v = verdict(State.CRASHED, "rank 1 was killed by SIGKILL")
    assert v.headline == "crashed: rank 1 was killed by SIGKILL"
