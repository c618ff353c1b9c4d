"""Who waits for whom, from the kernel: the wait-for graph of the tree, and the waits nothing can end.

Each process blocked in the kernel waits for someone: a reader of a pipe for the processes holding its
write end, a reader of a connected Unix socket or of a loopback TCP connection for the holders of its
other end, a taker of a file lock (``flock``, ``fcntl``) for the holders /proc/locks names, a parent
in ``wait4`` for its children, a thread in a private futex for another thread of its own process. A
process whose every thread waits like that, the same way in two captures with no CPU spent between
them, is *stuck*; the tree is *closed* when every live member is stuck and each waits only for members
that are stuck too: nothing inside the tree can end the wait, and nothing outside can either (no socket
to the outside, no timeout, no shared futex, no fd the kernel does not show us). Frame names play no
part.

Who is to blame inside a closed tree: a parent that only waits for its children waits for them, not the
other way round, so it is left out; of the rest, the processes in a cycle the others' waits lead to (a
bottom strongly connected component: A reads what only B writes, B what only A writes), or a process
that waits only for its own threads (a lock or Event no thread of it will release) with the others
waiting on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from hangwatch.model.kernelwaits import RECEIVE_CALLS
from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.kernelwaits import ThreadWait
from hangwatch.model.kernelwaits import Waker
from hangwatch.model.samples import ENDED_STATES
from hangwatch.model.stacks import StackSample

OUTSIDE = -1  # a waker the kernel does not name, or one outside the tree
STILL_CPU_S = 0.05  # CPU seconds a blocked process may show between two captures (accounting noise)


@dataclass(frozen=True)
class WaitGraph:
    """The tree's wait-for graph at the latest capture, where every member's waits could be read."""

    waits_for: tuple[tuple[int, frozenset[int]], ...]  # pid -> the pids that could end its wait
    stuck: frozenset[int]  # blocked untimed, unchanged over two captures
    closed: bool  # every live member stuck, each waiting only on stuck members
    culprits: tuple[int, ...]  # inside a closed tree: the cycle, or the process waiting on itself
    joiners: frozenset[int]  # stuck processes that only wait for their children
    detail: tuple[tuple[int, str], ...] = ()  # pid -> what it waits on, in words
    # Processes whose main thread is blocked waiting for input on fds (a read, a receive, a poll): they
    # wait for a message, whoever is to send it.
    receivers: frozenset[int] = frozenset()
    # Threads (pid, tid), main or not, that read a pipe or socket only their own process can write: waits
    # that only the process's own threads can end, like a private futex's (a handler thread blocked in a
    # native read of the process's own pipe is stuck, not waiting for a request).
    self_waits: frozenset[tuple[int, int]] = frozenset()
    # Processes whose every wait on an object is for a file lock (flock, fcntl): a cycle of them is a
    # lock-order deadlock between processes, to be broken by lock order, not by sending a message.
    lock_takers: frozenset[int] = frozenset()

    # Looked up per view by the rules: built once per graph, not once per question (a dict of 10,000
    # members built for each of 10,000 views is 10^8 steps).
    @cached_property
    def self_readers(self) -> frozenset[int]:
        """Processes whose main thread reads a pipe or socket only the process itself can write: no message
        will come from anyone else, whatever its frames (a read looks like a receive), so it waits for its
        own threads, not for input."""
        return frozenset(pid for pid, tid in self.self_waits if tid == pid)

    @cached_property
    def by_pid(self) -> dict[int, frozenset[int]]:
        """``waits_for`` as a mapping: a member's wakers (absent: not a member)."""
        return dict(self.waits_for)

    @cached_property
    def _words(self) -> dict[int, str]:
        return dict(self.detail)

    def wakers(self, pid: int) -> frozenset[int]:
        return self.by_pid.get(pid, frozenset({OUTSIDE}))

    def describe(self, pid: int) -> str:
        return self._words.get(pid, "")


@dataclass(frozen=True)
class WaitFacts:
    """What the graph knows of each member of one part of the tree, before the whole tree's closure: the
    graph of a tree whose parts wait for no member of another part is the union of theirs (``graph_of``).
    The merge across nodes makes one part a node as its answer arrives (analyse/nodes.py): no wait
    crosses nodes there, since each node's pipes, sockets and children are its own."""

    members: frozenset[int]  # the live members: blocked or not, every one of them read
    waits_for: dict[int, frozenset[int]]
    stuck: frozenset[int]
    detail: dict[int, str]
    receivers: frozenset[int]
    self_waits: frozenset[tuple[int, int]]
    lock_takers: frozenset[int]
    joiners: frozenset[int]


def wait_graph(samples: Sequence[StackSample], parents: Mapping[int, int]) -> WaitGraph | None:
    """The graph from the last two captures; None unless every process in them has readable waits."""
    return graph_of([wait_facts(samples, parents)])


def graph_of(parts: Sequence[WaitFacts | None]) -> WaitGraph | None:
    """The graph of the parts together; None where any part's waits could not be read, or no part has a
    live member."""
    if any(part is None for part in parts):
        return None
    read = [part for part in parts if part is not None and part.members]
    if not read:
        return None
    members = frozenset().union(*(part.members for part in read))
    waits_for = {pid: w for part in read for pid, w in part.waits_for.items()}
    stuck = frozenset().union(*(part.stuck for part in read))
    joiners = frozenset().union(*(part.joiners for part in read))
    closed = stuck == members and all(waits_for[pid] <= members for pid in members)
    culprits = _culprits(waits_for, set(members - joiners)) if closed else ()
    return WaitGraph(
        tuple(sorted(waits_for.items())),
        stuck,
        closed,
        culprits,
        joiners & stuck,
        tuple(sorted((pid, words) for part in read for pid, words in part.detail.items())),
        frozenset().union(*(part.receivers for part in read)),
        frozenset().union(*(part.self_waits for part in read)),
        frozenset().union(*(part.lock_takers for part in read)),
    )


def wait_facts(samples: Sequence[StackSample], parents: Mapping[int, int]) -> WaitFacts | None:
    """Each member's waits from the last two captures (``WaitFacts``); None unless every live process in
    them has readable waits, or with fewer than two captures."""
    if len(samples) < 2:
        return None
    before, last = samples[-2], samples[-1]
    live = [p for p in last.processes if p.state and p.state != "gone" and p.state not in ENDED_STATES]
    if any(p.kernel is None for p in live):
        return None
    waits = {p.pid: p.kernel for p in live if p.kernel is not None}
    earlier = {p.pid: p for p in before.processes}
    peers = dict(last.unix_peers)
    tcp = dict(last.tcp_peers)
    peers.update(tcp)
    end_holders, socket_holders = _holders(last, waits, peers)
    children: dict[int, set[int]] = {}
    for child, parent in parents.items():
        if child in waits:
            children.setdefault(parent, set()).add(child)

    stuck: set[int] = set()
    waits_for: dict[int, frozenset[int]] = {}
    detail: dict[int, str] = {}
    lock_takers: set[int] = set()
    joiners: set[int] = set()
    receivers: set[int] = set()
    self_waits: set[tuple[int, int]] = set()
    for p in live:
        w = waits[p.pid]
        scope = p.pid - w.pid
        old = earlier.get(p.pid)
        # Untimed first: a rank with a thread in a timed wait (gloo's epoll loop) is never stuck, and its
        # two keys need not be built.
        if (
            w.untimed()
            and old is not None
            and old.kernel is not None
            and p.cpu_s is not None
            and old.cpu_s is not None
            and p.cpu_s - old.cpu_s <= STILL_CPU_S
            and old.kernel.key() == w.key()
        ):
            stuck.add(p.pid)
        wakers, words = _wakers(
            p.pid, w, end_holders, socket_holders, peers, children=children, scope=scope, tcp=tcp
        )
        waits_for[p.pid] = frozenset(wakers)
        detail[p.pid] = words
        own, main, takes_locks, joins = _own_threads(
            p.pid, w, end_holders, socket_holders, peers, scope=scope
        )
        self_waits |= {(p.pid, tid + scope) for tid in own}
        if main is not None and main.tid not in own and main.call in RECEIVE_CALLS:
            receivers.add(p.pid)
        if takes_locks:
            lock_takers.add(p.pid)
        if joins:
            joiners.add(p.pid)
    return WaitFacts(
        frozenset(waits),
        waits_for,
        frozenset(stuck),
        detail,
        frozenset(receivers),
        frozenset(self_waits),
        frozenset(lock_takers),
        frozenset(joiners),
    )


def _holders(
    last: StackSample, waits: Mapping[int, ProcessWaits], peers: Mapping[int, int]
) -> tuple[dict[tuple[int, str], set[int]], dict[tuple[int, int], set[int]]]:
    """Who holds the end a reader of a pipe or a taker of a file lock waits on: the pipe's writers, the
    lock's holders (Unix and TCP sockets go through their peers: socket_holders)."""
    # Each member's waits are in its node's numbering (ProcessStacks.kernel), and another node may number
    # a pipe or socket the same: the objects are keyed with the member's shift from that numbering (its
    # scope, 0 on one node). The sample's own peers and lock holders are one node's: the merge across
    # nodes carries none, and a node's part of it leaves its own out (analyse/nodes.py, ``_as_merged``).
    end_holders: dict[tuple[int, str], set[int]] = {}
    for key, holder in last.lock_holders:
        end_holders.setdefault((0, f"lock:{key}"), set()).add(holder)
    socket_holders: dict[tuple[int, int], set[int]] = {}
    # Only a socket that is some socket's peer is ever looked up (a gloo rank holds one per peer rank).
    ends = set(peers.values())
    for pid, w in waits.items():
        scope = pid - w.pid
        for pipe in w.writes:
            holders = end_holders.get((scope, pipe))
            if holders is None:
                end_holders[(scope, pipe)] = {pid}
            else:
                holders.add(pid)
        if ends:
            for inode in w.sockets:
                if inode in ends:
                    socket_holders.setdefault((scope, inode), set()).add(pid)
    return end_holders, socket_holders


def _own_threads(
    pid: int,
    w: ProcessWaits,
    end_holders: Mapping[tuple[int, str], set[int]],
    socket_holders: Mapping[tuple[int, int], set[int]],
    peers: Mapping[int, int],
    *,
    scope: int,
) -> tuple[set[int], ThreadWait | None, bool, bool]:
    """One pass over a process's threads: the tids of those that read pipes and Unix sockets whose other
    end only its own process holds (waits its own threads must end, like a private futex's), its main
    thread's wait, whether every object it waits on is a file lock, and whether it only waits for its
    children (and its own threads)."""
    own: set[int] = set()
    main = None
    objects = locks = 0
    calls: set[Waker] = set()
    for t in w.threads:
        calls.add(t.waker)
        if main is None and t.tid == w.pid:
            main = t
        if t.waker is not Waker.OBJECTS or not t.on:
            continue
        objects += len(t.on)
        locks += sum(1 for obj in t.on if obj.startswith("lock:"))
        if all(_other_end(obj, scope, end_holders, socket_holders, peers) == {pid} for obj in t.on):
            own.add(t.tid)
    joins = Waker.CHILDREN in calls and calls <= {Waker.CHILDREN, Waker.ITSELF}
    return own, main, bool(objects) and locks == objects, joins


def _other_end(
    obj: str,
    scope: int,
    end_holders: Mapping[tuple[int, str], set[int]],
    socket_holders: Mapping[tuple[int, int], set[int]],
    peers: Mapping[int, int],
) -> set[int]:
    """The members that hold the end a reader of ``obj`` (named in the numbering of ``scope``'s node)
    waits on: a pipe's writers, the holders of a Unix socket's peer. Empty where the kernel names no
    member (outside the tree, or unknown)."""
    if obj.startswith("lock:"):
        return end_holders.get((scope, obj.split(" ", 1)[0]), set())  # "lock:KEY PATH"
    if obj.startswith("pipe:"):
        return end_holders.get((scope, obj), set())
    peer = peers.get(int(obj[8:-1]))
    return socket_holders.get((scope, peer), set()) if peer is not None else set()


def _wakers(
    pid: int,
    w: ProcessWaits,
    end_holders: Mapping[tuple[int, str], set[int]],
    socket_holders: Mapping[tuple[int, int], set[int]],
    peers: Mapping[int, int],
    *,
    children: Mapping[int, set[int]],
    scope: int,
    tcp: Mapping[int, int],
) -> tuple[set[int], str]:
    """Who could end any of its threads' waits (OUTSIDE for anyone we cannot name), and in words.
    ``pid``: the process in the sample; ``scope``: the shift of its waits' numbering to the sample's."""
    wakers: set[int] = set()
    words: list[str] = []
    for t in w.threads:
        if t.waker is Waker.OBJECTS:
            for obj in t.on:
                ends = _other_end(obj, scope, end_holders, socket_holders, peers)
                if ends == {pid}:
                    continue  # a pipe only it writes, its own socketpair: one of its threads would have to
                if obj.startswith("lock:"):
                    words.append(f"{t.call} for the file lock of {obj.split(' ', 1)[-1]}")
                elif obj.startswith("pipe:") or int(obj[8:-1]) not in peers:
                    words.append(f"{t.call} of {obj}")
                else:
                    words.append(f"{t.call} of a {'TCP' if int(obj[8:-1]) in tcp else 'Unix'} socket")
                wakers |= (ends - {pid}) or {OUTSIDE}
        elif t.waker is Waker.CHILDREN:
            child = t.child + scope if t.child is not None and t.child > 0 else t.child
            mine = children.get(pid, set()) if child in (None, -1) else {child}
            wakers |= mine or {OUTSIDE}
            words.append("wait4 for its children" if child in (None, -1) else f"wait4 for child {child}")
        elif t.waker is Waker.ANYONE:
            wakers.add(OUTSIDE)
            words.append(t.call)
    return wakers, ", ".join(dict.fromkeys(words))


def _culprits(waits_for: Mapping[int, frozenset[int]], candidates: set[int]) -> tuple[int, ...]:
    """The bottom strongly connected components of the graph among ``candidates``: the waits every
    other wait leads to. A single process there waits on nothing but its own threads."""
    graph = {pid: {q for q in waits_for.get(pid, frozenset()) if q in candidates} for pid in candidates}
    components = _components(graph)
    index = {pid: i for i, comp in enumerate(components) for pid in comp}
    bottom = [
        comp for i, comp in enumerate(components) if all(index[q] == i for pid in comp for q in graph[pid])
    ]
    return tuple(sorted(pid for comp in bottom for pid in comp))


def _components(graph: Mapping[int, set[int]]) -> list[set[int]]:
    """Tarjan's strongly connected components, iteratively (a tree of thousands of ranks is no stack)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[set[int]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp: set[int] = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.add(top)
                    if top == node:
                        break
                out.append(comp)
    return out
