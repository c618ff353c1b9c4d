"""Next steps fitted to the case (analyse/nextsteps.py): known values in place of PID and PORT, no advice
that needs the live tree once run stopped it, NCCL's variables only where NCCL is in use."""

from __future__ import annotations

import pytest

from hangwatch.analyse import causes
from hangwatch.analyse.nextsteps import KEEP_FOR_A_LOOK
from hangwatch.analyse.nextsteps import StepFacts
from hangwatch.analyse.nextsteps import fit
from hangwatch.model.vocabulary import Cause


def test_the_known_pid_and_port_are_written_in():
    steps = fit(causes.NEXT_STEPS[Cause.PORT_IN_USE], StepFacts(pid=None, port=8000))
    assert "`ss -ltnp 'sport = :8000'`" in steps[0] and "cleanup --port 8000" in steps[0], steps
    steps = fit(causes.NEXT_STEPS[Cause.WAIT_CYCLE], StepFacts(pid=4242, port=None))
    assert any("`ls -l /proc/4242/fd`" in s and "/proc/4242/task/*/syscall" in s for s in steps), steps
    steps = fit(causes.NEXT_STEPS[Cause.IDLE], StepFacts(pid=1, port=30000))
    assert "curl http://127.0.0.1:30000/health" in steps[0], steps


def test_an_unknown_value_stays_a_placeholder():
    steps = fit(causes.NEXT_STEPS[Cause.PORT_IN_USE], StepFacts(pid=None, port=None))
    assert "sport = :PORT" in steps[0]


@pytest.mark.parametrize("cause", list(Cause))
def test_once_the_tree_is_stopped_nothing_reads_a_live_process(cause):
    steps = fit(causes.NEXT_STEPS.get(cause, ()), StepFacts(pid=77, port=None, tree_alive=False))
    for step in steps:
        assert "/proc/77" not in step and "--pid 77" not in step and "kill -CONT" not in step, step
        assert step.strip() and not step.endswith(";"), step
    live = fit(causes.NEXT_STEPS.get(cause, ()), StepFacts(pid=77, port=None))
    if len(live) != len(steps) or live != steps[: len(live)]:
        assert steps[-1] == KEEP_FOR_A_LOOK  # said how to keep the tree for a look next time


def test_the_moot_part_of_a_step_goes_and_its_other_advice_stays():
    stopped = fit(causes.NEXT_STEPS[Cause.WAIT_CYCLE], StepFacts(pid=5, port=None, tree_alive=False))
    assert stopped[0] == causes.NEXT_STEPS[Cause.WAIT_CYCLE][0]  # reading the stacks needs no live tree
    assert stopped[-1] == KEEP_FOR_A_LOOK and len(stopped) == 2


def test_nccl_advice_only_where_nccl_is_in_use():
    gloo = fit(causes.NEXT_STEPS[Cause.COLLECTIVE_WAIT], StepFacts(pid=3, port=None, nccl=False))
    assert not any("NCCL_" in s for s in gloo), gloo
    assert any("TORCH_DISTRIBUTED_DEBUG=DETAIL" in s for s in gloo)  # torch's own, for any backend
    assert any("2-rank all_reduce outside the engine" in s for s in gloo)  # the clause after NCCL's
    for nccl in (True, None):  # in use, or not known: said
        said = fit(causes.NEXT_STEPS[Cause.COLLECTIVE_WAIT], StepFacts(pid=3, port=None, nccl=nccl))
        assert any("NCCL_DEBUG=INFO" in s for s in said) and any("NCCL_P2P_DISABLE" in s for s in said)


def test_a_step_said_twice_is_said_once():
    assert fit(("Do X.", "Do X."), StepFacts(pid=None, port=None)) == ("Do X.",)
