"""One stall rule for run and attach, said one way (issue 24, items 8 and 10): the stall window's default
and its help are the same in both commands, attach's window only cuts a default longer than itself, and
a closed wait's verdict says once, in plain words, that nothing can end it and that the stall window was
not waited out, naming no command-line flag."""

from __future__ import annotations

import argparse

from builders import frames
from builders import process_sample
from hangwatch import engines
from hangwatch.analyse.assess import DEFAULT_STALL_AFTER_S
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import Policy
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.cli import build_parser
from hangwatch.cli.attach import stall_window
from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.kernelwaits import ThreadWait
from hangwatch.model.kernelwaits import Waker
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.status import StackRequest
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State

PID = 400
# `threading.Event().wait()` in the main thread: a private futex no other thread of it will wake.
EVENT_WAIT = (
    *frames("<module>"),
    Frame("Event.wait", "threading.py", 629),
    Frame("Condition.wait", "threading.py", 327),
)
OWN = ProcessWaits(PID, (ThreadWait(PID, "futex", Waker.ITSELF),))


def _waiting(t: float) -> StackSample:
    stacks = ProcessStacks(
        PID, "python3", None, None, DumpOutcome.OK,
        (ThreadStack(PID, "MainThread", False, False, EVENT_WAIT),), "S", 1.0, kernel=OWN,
    )  # fmt: skip
    return StackSample(t, (stacks,), 0.05)


def test_a_wait_of_its_own_threads_is_said_once_to_be_one_nothing_can_end():
    d = classify(stack_context([_waiting(3.0), _waiting(5.0), _waiting(7.0)]))
    assert d.cause is Cause.WAIT_CYCLE and d.closed, d
    assert (
        d.explanation
        == "python3[400]: a wait of its own threads, with no timeout, and nothing else can end it"
    )


def test_the_closed_verdict_says_why_it_came_early_once_with_no_flag_named():
    a = Assessor(
        engines.by_name("generic"),
        Policy(stall_after_s=30.0, has_readiness=False),
        {PID},
        stacks=StackHistory(),
    )
    tree = (process_sample(PID, "python3"),)
    verdict = None
    t = 0.0
    while verdict is None and t <= 30.0:
        verdict = a.observe(Tick(t, tree, log=LogSample(new_lines=1) if t == 0.0 else LogSample()))
        if verdict is None and a.stacks_wanted() is not StackRequest.NONE:
            verdict = a.observe_stacks(_waiting(t))
        t += 1.0
    assert verdict is not None and verdict.state is State.STALLED, verdict
    assert verdict.decided_by[:2] == ("stalled:closed-wait", "stacks:wait-cycle")
    assert verdict.summary.endswith(
        "python3[400]: a wait of its own threads, with no timeout, and nothing else can end it; "
        "not waiting out the 30 s stall window"
    ), verdict.summary
    assert "--" not in verdict.summary and verdict.summary.count("can end") == 1


def _stall_help(parser: argparse.ArgumentParser, command: str) -> str:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if "--stall-after" in a.option_strings)
    return str(action.help)


def test_run_and_attach_say_the_stall_window_and_its_default_the_same_way():
    parser = build_parser()
    run, attach = _stall_help(parser, "run"), _stall_help(parser, "attach")
    assert run == attach and f"(default: {DEFAULT_STALL_AFTER_S:g} s)" in run, (run, attach)
    assert "None" not in attach


def test_attachs_window_is_how_long_to_watch_and_cuts_only_a_longer_default():
    assert stall_window(None, 300.0) == DEFAULT_STALL_AFTER_S  # as run: not the whole window
    assert stall_window(None, 20.0) == 20.0  # a shorter watch cannot wait out 60 s of quiet
    assert stall_window(90.0, 60.0) == 90.0  # one given is kept
