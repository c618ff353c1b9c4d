"""One machine under two names: ``--hosts localhost,127.0.0.1``, a hostname and its address, a host file
that lists a node once per network interface (``node1``, ``node1-ib``).

Each bundle says which machine and which PID namespace answered (``NodeIdentity``: the kernel's boot id,
the inode of /proc/self/ns/pid). Two names whose collectors give the same boot id, the same pid
namespace and the same selection see the very same processes. Read twice, every rank is counted twice
("found twice"), and worse: the two collectors' stack captures run at once, py-spy stops its target while
it reads it, so each collector sees the other's pause as a ``stopped`` process, a false cause. So such a
name is read once, under the first name that answered; the report says which names were one machine.

The boot id alone is not enough: containers of one host and the emulated nodes of the tests (network,
PID and UTS namespaces of one kernel) share it, each with a pid namespace of its own. The selection is
part of the key too: Ray gives each node its own actor pids, so two Ray nodes started on one machine
select different processes and stay two. A bundle without a boot id or a pid namespace (the Ray
dashboard's, built without a collector) is never matched.

Only the names ``--hosts``/``--hostfile`` gave are checked: pods from a label selector, a Slurm job's
nodes and Ray's nodes are discovered, each its own.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace

from hangwatch.model.nodes import NodeBundle
from hangwatch.model.nodes import NodeResult

MachineKey = tuple[str, int, str]  # boot id, pid namespace inode, selector


def machine_key(bundle: NodeBundle) -> MachineKey | None:
    """What makes two answers the same processes; None when the bundle cannot tell."""
    node = bundle.node
    if not node.boot_id or not node.pid_ns:
        return None
    return (node.boot_id, node.pid_ns, bundle.selector)


@dataclass(frozen=True)
class SameMachine:
    """A name left out (``index`` in host order) because ``kept_host`` answered from the same machine."""

    index: int
    host: str
    kept_index: int
    kept_host: str

    def note(self, how: str) -> str:
        """``how``: "watched once" (attach), "collected once" (stacks)."""
        return f"{self.host} is the same machine as {self.kept_host} (same boot id and pid namespace): {how}"


class MachineIndex:
    """Which name first answered from each machine, over the rounds of a watch.

    A name is checked at its first answer only: that is before any stack round of the watch (the
    first rounds are census, no capture), so two collectors never capture the same processes at once.
    """

    def __init__(self) -> None:
        self._first: dict[MachineKey, tuple[int, str]] = {}
        self._checked: set[int] = set()

    def observe(self, results: Sequence[NodeResult]) -> list[SameMachine]:
        """The names of this round answering for the first time from a machine another name already
        answered from: in an earlier round, or earlier in host order in this one."""
        found: list[SameMachine] = []
        for index, result in enumerate(results):
            if index in self._checked or result.bundle is None:
                continue
            self._checked.add(index)
            key = machine_key(result.bundle)
            if key is None:
                continue
            kept = self._first.setdefault(key, (index, result.host))
            if kept[0] != index:
                found.append(SameMachine(index, result.host, *kept))
        return found


@dataclass(frozen=True)
class OncePerMachine:
    """One round's results with each machine once, and why the others were left out."""

    results: tuple[NodeResult, ...]
    left_out: tuple[SameMachine, ...]
    notes: tuple[str, ...]


def once_per_machine(
    results: Sequence[NodeResult], again: Callable[[list[int]], list[NodeResult]]
) -> OncePerMachine:
    """``stacks --hosts``: the later names of a machine left out, and the kept names of such a machine
    collected again by ``again`` (indices in host order; their results in that order), alone.

    A one-shot collection has no census before its captures: both names captured at once, each seeing
    the other's pauses as stopped processes, so the kept name's first answer is not trusted. Only when
    names repeat does this cost a second round; a kept name whose second answer fails keeps its first.
    """
    left_out = MachineIndex().observe(results)
    if not left_out:
        return OncePerMachine(tuple(results), (), ())
    gone = {s.index for s in left_out}
    kept = sorted({s.kept_index for s in left_out})
    retaken = dict(zip(kept, again(kept), strict=True))
    out = []
    for index, result in enumerate(results):
        if index in gone:
            continue
        second = retaken.get(index)
        out.append(second if second is not None and second.bundle is not None else result)
    notes = tuple(
        s.note(
            f"collected once, {s.kept_host} again alone (the two had captured at once, each pausing the "
            "processes the other read)"
        )
        for s in left_out
    )
    return OncePerMachine(tuple(out), tuple(left_out), notes)


def left_out_result(result: NodeResult, same: SameMachine) -> NodeResult:
    """What a watch round gets for a name left out: no bundle, its reason as the detail."""
    return replace(result, bundle=None, detail=same.note("watched once"), output_bytes=0)
