"""The desync the Flight Recorder shows: over the ranks of each process group, who waits in which
collective, and who never reached it (issue 26; docs/flight-recorder.md).

Each rank's dump says, per group, the last collective it enqueued and the last it completed. A rank
inside a collective has enqueued more than it completed; a rank behind the others enqueued less than
they did: it never reached the collective they wait in. That is the desync, by sequence number, the one
fact the stacks cannot give (two ranks in "all_reduce" may be in different ones). Where every rank read
entered the same collective and none completed it, the recorder says so and no rank is behind: a kernel,
the network, or a member that gave no dump.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace

from hangwatch.model.flightrecorder import FlightCapture
from hangwatch.model.flightrecorder import GroupStatus
from hangwatch.model.report import Verdict
from hangwatch.ranges import rank_words as _ranks
from hangwatch.words import plural

RULE = "stall:flight-recorder"


@dataclass(frozen=True)
class Desync:
    text: str
    behind: tuple[int, ...]  # global ranks that never reached the collective the others wait in
    waiting: tuple[int, ...]  # global ranks inside it
    pids: tuple[int, ...]  # the processes of ``behind`` the tree shows


def desync(capture: FlightCapture) -> Desync | None:
    """The first group (by id) with a collective left unfinished, in words; None when none is."""
    by_group: dict[str, list[tuple[int, GroupStatus]]] = {}
    pid_of = {d.rank: d.pid for d in capture.dumps}
    for d in capture.dumps:
        for g in d.groups:
            by_group.setdefault(g.pg, []).append((d.rank, g))
    for pg in sorted(by_group, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k)):
        seen = sorted(by_group[pg], key=lambda item: item[0])
        if not any(g.last_completed < g.last_enqueued for _, g in seen):
            continue  # idle on every rank read
        top = max(g.last_enqueued for _, g in seen)
        waiting = tuple(r for r, g in seen if g.last_enqueued == top and g.last_completed < top)
        behind = tuple(r for r, g in seen if g.last_enqueued < top)
        members = {m for _, g in seen for m in g.ranks}
        silent = sorted(members - {r for r, _ in seen})
        op = next((name for _, g in seen if (name := g.op(top))), "a collective")
        desc = next((g.desc for _, g in seen if g.desc), "")
        group = f"group {pg}" + (f" ({desc})" if desc else "")
        if not waiting:  # those that reached the furthest finished it: the ones still inside are behind them
            inside = [(r, g) for r, g in seen if g.last_completed < g.last_enqueued]
            said = "; ".join(
                f"{_ranks((r,))} is inside seq {g.last_enqueued} ({g.op(g.last_enqueued) or 'a collective'})"
                for r, g in inside[:4]
            )
            ahead = tuple(r for r, g in seen if g.last_completed >= top)
            text = f"Flight Recorder, {group}: {said}; {_ranks(ahead)} completed seq {top}"
            behind = tuple(r for r, _ in inside)
            pids = tuple(p for r in behind if (p := pid_of.get(r)) is not None)
            return Desync(text, behind, (), pids)
        verb = "wait" if len(waiting) > 1 else "waits"
        text = f"Flight Recorder, {group}: {_ranks(waiting)} {verb} in seq {top} ({op})"
        if behind:
            lasts = sorted({g.last_enqueued for r, g in seen if r in behind})
            text += f"; {_ranks(behind)} never reached it (last enqueued: seq {', '.join(map(str, lasts))})"
        else:
            cause = "a kernel that does not finish, the network"
            cause += f", or {_ranks(tuple(silent))}, which gave no dump" if silent else ""
            text += f": every rank read entered it and none completed it ({cause})"
        if silent and behind:
            text += f"; {_ranks(tuple(silent))} gave no dump"
        pids = tuple(p for r in behind if (p := pid_of.get(r)) is not None)
        return Desync(text, behind, waiting, pids)
    return None


def capture_note(capture: FlightCapture) -> str:
    """One line on what was read: dumps, pipes, time, and the ranks that gave none."""
    line = (
        f"Flight Recorder: {plural(len(capture.dumps), 'rank')} dumped"
        f" ({capture.triggered} asked through their pipe, {capture.elapsed_s:.1f} s)"
    )
    if capture.missing:
        line += "; none from " + "; ".join(f"rank {r}: {why}" for r, why in capture.missing[:4])
    return line


def refine_with_flight_recorder(verdict: Verdict, capture: FlightCapture) -> Verdict:
    """A stall with the recorder's desync: said in the summary, its note and words in the evidence, and
    the ranks that never reached the collective named as the culprits where no rule named any."""
    if not capture.dumps and not capture.triggered:
        return verdict  # nothing asked, nothing read (gloo ranks with the recorder on): nothing to say
    found = desync(capture)
    evidence = (capture_note(capture), *((found.text,) if found else ()), *verdict.evidence)
    if found is None:
        return replace(verdict, evidence=evidence)
    culprits = verdict.culprits or found.pids
    return replace(
        verdict,
        summary=f"{verdict.summary}; {found.text}",
        culprits=culprits,
        evidence=evidence,
        decided_by=(*verdict.decided_by, RULE),
    )
