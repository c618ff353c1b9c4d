"""The serving-stall rule (F6) on hand-built metric samples."""

from __future__ import annotations

from hangwatch.analyse.serving import ServingClock
from hangwatch.model.samples import ServingSample


def feed(*samples: ServingSample) -> ServingClock:
    clock = ServingClock()
    for s in samples:
        clock.observe(s)
    return clock


def test_idle_server_never_stalls():
    clock = feed(*(ServingSample(t, running=0, waiting=0, generated_tokens=100) for t in range(0, 100, 2)))
    assert clock.stall(100, 10) is None


def test_busy_server_producing_tokens_never_stalls():
    clock = feed(
        *(ServingSample(t, running=4, waiting=2, generated_tokens=100 + t) for t in range(0, 100, 2))
    )
    assert clock.stall(100, 10) is None


def test_requests_waiting_and_counter_frozen_is_a_stall():
    samples = [
        ServingSample(t, running=1, waiting=0, generated_tokens=100 + min(t, 20)) for t in range(0, 40, 2)
    ]
    clock = feed(*samples)
    assert clock.stall(29, 10) is None  # the counter last moved at t=20
    stall = clock.stall(40, 10)
    assert stall is not None and stall.frozen_for_s == 20
    assert "1 requests running" in stall.evidence[0] and "frozen at 120" in stall.evidence[0]


def test_unreadable_scrapes_say_nothing():
    clock = feed(
        ServingSample(0, running=1, waiting=0, generated_tokens=5),
        ServingSample(2, error="refused"),
        ServingSample(4, running=0, waiting=0, generated_tokens=5),
    )
    assert clock.stall(100, 10) is None  # the last readable sample was idle
