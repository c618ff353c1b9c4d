"""The watch loops' one schedule (hangwatch/pacing.py), on a clock the test moves: ticks on a grid, a late
tick said late, and a loop that fell behind starting again at once instead of catching up in a burst."""

from __future__ import annotations

from hangwatch.pacing import Pacer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait_for(self, delay: float) -> bool:
        self.waits.append(round(delay, 3))
        self.now += delay
        return False


def test_ticks_keep_to_their_grid_whatever_each_tick_costs() -> None:
    clock = Clock()
    pacer = Pacer(2.0, clock.wait_for, clock)
    for cost in (0.5, 1.5, 0.0):
        assert pacer.late_s() == 0.0
        clock.now += cost  # the tick's own work
        assert pacer.wait() is False
    assert clock.waits == [1.5, 0.5, 2.0]
    assert clock.now == 106.0  # three ticks, 2 s apart from the first


def test_a_loop_that_fell_behind_starts_again_at_once_and_says_how_late() -> None:
    clock = Clock()
    pacer = Pacer(1.0, clock.wait_for, clock)
    clock.now += 3.25  # a stack capture held the first tick
    pacer.wait()
    assert clock.waits == [0.0]  # no sleep, and no burst of catch-up ticks after it
    assert pacer.late_s() == 0.0  # the grid starts again from here
    clock.now += 0.25
    pacer.wait()
    assert clock.waits == [0.0, 0.75]
    clock.now += 0.4  # the next tick itself comes late: said so
    assert pacer.late_s() == 0.4


def test_a_stop_asked_for_during_the_wait_ends_it() -> None:
    pacer = Pacer(5.0, lambda delay: True, lambda: 0.0)
    assert pacer.wait() is True
