"""process_views works once per distinct thread history, shared by the ranks that have it: each process's
view must still be the one it gets when it is analysed on its own."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.stacks import loader
from hangwatch.analyse.stackwaits import process_views


@pytest.mark.parametrize("name", ["missing_collective", "silent_compile", "spin_wait", "lock_deadlock"])
@pytest.mark.parametrize("mode", ["native", "python"])
def test_a_view_computed_among_all_is_the_view_alone(name, mode):
    samples = loader.samples(name, mode)
    views = process_views(samples)
    assert views
    for v in views:
        alone = [replace(s, processes=tuple(p for p in s.processes if p.pid == v.pid)) for s in samples]
        (own,) = process_views(alone)
        assert own._replace(peer=v.peer) == v  # whether it is a peer depends on the others
