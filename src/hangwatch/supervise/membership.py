"""Who belongs to a launched tree right now, from one scan of /proc: shared by the clean-up and the guardian.

A process is a member when it is a known member (pid and start time), in the launched session, or
(``follow``) found from a live member: its children, and the whole session of a member that leads
a session of its own (a child that called setsid() and the processes it started, even those whose
parent died since). With ``adopter`` (hangwatch's pid while it is the tree's subreaper) its children
are members too: orphans of the tree are reparented to it. Nothing is ever found by name, and a
process in ``exclude`` (hangwatch's own helpers) is never a member, nor anything below it.

A session id is safe to follow: the kernel never hands out as a new pid a number that is still
some process's session id, so a member's session holds only what that member started.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from hangwatch.collect import procfs
from hangwatch.model.samples import ProcessId


def tree_members(
    stats: Iterable[procfs.Stat],
    identities: set[ProcessId],
    sessions: Iterable[int],
    *,
    follow: bool = True,
    adopter: int | None = None,
    exclude: Iterable[int] = (),
) -> dict[int, procfs.Stat]:
    """{pid: stat} of every member (zombies included: callers that signal skip state ``Z``)."""
    excluded = set(exclude)
    by_pid = {s.pid: s for s in stats if s.pid not in excluded}
    sessions = set(sessions)
    members = {
        pid: s
        for pid, s in by_pid.items()
        if s.identity in identities or s.session in sessions or (adopter is not None and s.ppid == adopter)
    }
    if not follow:
        return members
    children: dict[int, list[procfs.Stat]] = defaultdict(list)
    by_session: dict[int, list[procfs.Stat]] = defaultdict(list)
    for s in by_pid.values():
        children[s.ppid].append(s)
        by_session[s.session].append(s)
    frontier = [pid for pid, s in members.items() if not s.exited]
    while frontier:
        s = members[frontier.pop()]
        found = list(children.get(s.pid, ()))
        if s.session == s.pid and s.pid not in sessions:  # it leads a session of its own: all of it
            sessions.add(s.pid)
            found += by_session.get(s.pid, ())
        for new in found:
            if new.pid not in members:
                members[new.pid] = new
                if not new.exited:
                    frontier.append(new.pid)
    return members


def scan(
    identities: set[ProcessId],
    sessions: Iterable[int],
    *,
    follow: bool = True,
    adopter: int | None = None,
    exclude: Iterable[int] = (),
) -> dict[int, procfs.Stat]:
    """:func:`tree_members` of a fresh scan of /proc."""
    stats = [s for s in (procfs.read_stat(pid) for pid in procfs.list_pids()) if s is not None]
    return tree_members(stats, identities, sessions, follow=follow, adopter=adopter, exclude=exclude)


def alive(members: dict[int, procfs.Stat]) -> dict[int, procfs.Stat]:
    return {pid: s for pid, s in members.items() if not s.exited}
