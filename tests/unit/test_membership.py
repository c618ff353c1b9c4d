"""Who belongs to a launched tree (supervise/membership.py), on a fixed process table."""

from __future__ import annotations

from hangwatch.collect.procfs import Stat
from hangwatch.supervise.membership import alive
from hangwatch.supervise.membership import tree_members


def st(
    pid: int, ppid: int, session: int, state: str = "S", start: int | None = None, threads: int = 1
) -> Stat:
    return Stat(pid, f"p{pid}", state, ppid, session, session, 0, 0, threads, start or pid * 10, 0, None)


# 100 is hangwatch (session 50), 101 its guardian (own session), 200 the launched session leader.
TABLE = [
    st(1, 0, 1),
    st(100, 1, 50),
    st(101, 100, 101),
    st(200, 100, 200),
    st(201, 200, 200),  # a rank, in the session
    st(202, 200, 202),  # a child that called setsid(): its own session
    st(203, 202, 202),  # ... and its child
    st(204, 1, 202),  # ... and an orphan of its session (its parent died): session 202 still
    st(205, 100, 205),  # an orphan of the tree, reparented to hangwatch (the subreaper), own session
    st(206, 205, 205),
    st(300, 1, 300),  # a stranger
    st(301, 300, 300),
    st(302, 1, 302, start=9999),  # a stranger whose pid a known member once had (start time differs)
    st(207, 201, 200, state="Z"),  # a zombie child of a rank
]


def pids(found: dict[int, Stat]) -> list[int]:
    return sorted(found)


def test_session_only_without_follow():
    found = tree_members(TABLE, set(), {200}, follow=False)
    assert pids(found) == [200, 201, 207]


def test_follow_takes_children_and_the_sessions_members_lead():
    found = tree_members(TABLE, set(), {200})
    assert pids(found) == [200, 201, 202, 203, 204, 207]
    assert pids(alive(found)) == [200, 201, 202, 203, 204]


def test_adopter_children_are_members_but_never_the_excluded_guardian():
    found = tree_members(TABLE, set(), {200}, adopter=100, exclude={101})
    assert pids(found) == [200, 201, 202, 203, 204, 205, 206, 207]


def test_known_identity_needs_the_same_start_time():
    found = tree_members(TABLE, {(302, 3020), (205, 2050)}, set())
    assert pids(found) == [205, 206]


def test_strangers_never_members():
    found = tree_members(TABLE, set(), {200}, adopter=100, exclude={101})
    assert not {1, 100, 101, 300, 301, 302} & set(found)


def test_a_zombie_main_thread_with_threads_left_is_alive_and_followed():
    """State Z is the main thread's: with other threads still there (num_threads > 1) the process runs
    on (or is still dying), cannot be reaped, and its children are the tree's."""
    table = [
        st(200, 100, 200),
        st(210, 200, 210, state="Z", threads=3),  # its main thread ended alone; two threads run on
        st(211, 210, 211),  # a child of it, in a session of its own
        st(212, 200, 212, state="Z"),  # ended: a zombie with no thread left
    ]
    found = tree_members(table, {(200, 2000)}, set())
    assert pids(found) == [200, 210, 211, 212]
    assert pids(alive(found)) == [200, 210, 211]
