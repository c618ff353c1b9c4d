"""An idle SGLang at TP > 1 waits for work, not in a hung collective (docs/multinode.md: the known false
positive). From the real stacks of an idle ``--tp 2`` server (tests/unit/data/sglang_tp2_idle_stacks.json):
TP1 waits in the ``broadcast`` of TP0's next requests, TP0 sleeps in its request poll (``Poller.poll``,
natively ``zmq_poll > poll``), the launcher in its event loop (``epoll_pwait``), the detokenizer in a zmq
receive, multiprocessing's resource tracker in a ``read`` of its pipe."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from builders import report_stack_samples
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stackwatch import with_native_detail
from hangwatch.model.samples import ConnectionSample
from hangwatch.model.samples import ServerConnection
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.vocabulary import Cause

DATA = Path(__file__).resolve().parent / "data" / "sglang_tp2_idle_stacks.json"
LAUNCHER, TP0, TP1 = 24334, 24484, 24485


def _samples() -> list[StackSample]:
    """As ``hangwatch stacks`` analyses them: later rounds borrow the first round's native frames."""
    rounds = report_stack_samples(DATA)
    return [*rounds[:-1], with_native_detail(rounds)]


def _replace_main(samples: list[StackSample], pid: int, frames: tuple[Frame, ...]) -> list[StackSample]:
    def swap(p: ProcessStacks) -> ProcessStacks:
        if p.pid != pid:
            return p
        threads = tuple(replace(t, frames=frames) if t.tid == pid else t for t in p.threads)
        return replace(p, threads=threads)

    return [replace(s, processes=tuple(swap(p) for p in s.processes)) for s in samples]


_BLOCKED = (
    Frame("Fault.fire", "sitecustomize.py", 196),
    Frame("Event.wait", "threading.py", 629),
    Frame("Condition.wait", "threading.py", 327),
    Frame("lock_PyThread_acquire_lock", "libpython3.11.so.1.0", native=True),
    Frame("do_futex_wait", "libc.so.6", native=True),
)


def test_an_idle_tp2_server_waits_for_work():
    samples = _samples()
    found = classify(stack_context(samples))
    assert found.cause is Cause.IDLE and found.culprits == (), found.explanation
    assert "TP1 waiting in broadcast" in found.explanation and "TP0 waits for input" in found.explanation
    assert found.confidence == "high" and not found.closed
    # ``hangwatch stacks`` takes one round by default.
    assert classify(stack_context(samples[:1])).cause is Cause.IDLE


def test_requests_waiting_for_an_answer_are_not_idle():
    """Every process waits for messages, yet a client's request waits: a message lost between them."""
    waiting = ConnectionSample((30000,), (ServerConnection(30000, 51234, 220, 0, 41.0),))
    found = classify(stack_context(_samples(), [Tick(10.0, (), connections=waiting)]))
    assert found.cause is Cause.UNKNOWN and found.culprits == ()
    assert "1 client connection(s) sent a request and got no answer" in found.explanation
    quiet = ConnectionSample((30000,), (ServerConnection(30000, 51234, 220, 4100, None),))
    found = classify(stack_context(_samples(), [Tick(10.0, (), connections=quiet)]))
    assert found.cause is Cause.IDLE and "no client request waits" in found.explanation


def test_a_stuck_launcher_is_what_the_idle_group_waits_for():
    """The launcher blocked in a handler instead of its event loop: TP0 waits for input it never sends."""
    found = classify(stack_context(_replace_main(_samples(), LAUNCHER, _BLOCKED)))
    assert found.cause is Cause.UNKNOWN and found.culprits == (LAUNCHER,), found.explanation


def test_the_rank_that_feeds_the_group_blocked_in_a_wait_of_its_own_is_still_the_culprit():
    """TP0 blocked elsewhere than in a receive (a fault, a hung forward): the others wait for it."""
    found = classify(stack_context(_replace_main(_samples(), TP0, _BLOCKED)))
    assert found.cause is Cause.COLLECTIVE_WAIT and found.culprits == (TP0,), found.explanation


def _flowing_ticks(pids: tuple[int, ...], connections: ConnectionSample | None = None) -> list[Tick]:
    """Ticks every 0.5 s over the samples' span in which ``pids`` write 20 KB each (what SGLang's
    schedulers move when they spin through their idle loop without --sleep-on-idle: 40-90 KB/s)."""
    from hangwatch.model.samples import ProcessSample

    def proc(pid: int, io: int) -> ProcessSample:
        return ProcessSample(pid, 1, str(pid), ("x",), "S", 1.0, 0.0, 0, io, io, 1, 1 << 20, (), None, None)

    members = (LAUNCHER, TP0, TP1)
    times = [i * 0.5 for i in range(11)]
    ticks = [Tick(t, tuple(proc(pid, 20_000 if pid in pids else 0) for pid in members)) for t in times]
    return [*ticks[:-1], replace(ticks[-1], connections=connections)]


def test_an_idle_group_that_spins_through_its_loop_still_waits_for_work():
    quiet = ConnectionSample((30000,), ())
    found = classify(stack_context(_samples(), _flowing_ticks((TP0, TP1), quiet)))
    assert found.cause is Cause.IDLE and found.culprits == (), found.explanation


def test_a_moving_group_with_requests_waiting_is_not_called_idle_nor_lost():
    """Requests wait and the group moves data all the time: it is working on them, not idle, and no
    message is lost."""
    waiting = ConnectionSample((30000,), (ServerConnection(30000, 51234, 220, 0, 41.0),))
    found = classify(stack_context(_samples(), _flowing_ticks((TP0, TP1), waiting)))
    assert found.cause is not Cause.IDLE, found.explanation
    assert "lost" not in found.explanation, found.explanation


def test_before_the_server_was_ever_ready_the_group_waiting_for_input_waits_for_its_feeder():
    # vllm-tp2-TP1-compile-raise-run (2026-12-02): the same shape during start-up, TP1 back in its poll
    # after an exception: no input is due to a server that never was ready, so it is no idleness.
    samples = _samples()
    idle = classify(stack_context(samples))
    booting = classify(replace(stack_context(samples), before_ready=True))
    assert idle.cause is Cause.IDLE
    assert booting.cause is Cause.UNKNOWN and booting.culprits and "never ready" in booting.explanation
    labels = {v.pid: v.label for v in stack_context(samples).views}
    assert [labels[pid] for pid in booting.culprits] == ["TP0"], booting  # TP0 feeds; TP1 waits in it
