"""The kernel's wait-for graph (analyse/waitgraph.py) from /proc's words (collect/kernelwaits.py parsers).

Real processes that wait like this are in tests/integration/test_wait_cycle.py; these cases pin the rules:
a wait is closed only when every member is stuck, untimed, unchanged, and waits only on stuck members."""

from __future__ import annotations

from dataclasses import replace

from hangwatch.analyse.waitgraph import OUTSIDE
from hangwatch.analyse.waitgraph import wait_graph
from hangwatch.collect import procfs
from hangwatch.collect.kernelwaits import syscall_names
from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.kernelwaits import ThreadWait
from hangwatch.model.kernelwaits import Waker
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample


def test_syscall_lines_as_the_kernel_writes_them():
    assert procfs.parse_syscall("running") is None
    assert procfs.parse_syscall("-1 0x7ffd 0x0") is None  # blocked outside a system call
    nr, args = procfs.parse_syscall("0 0x5 0x7f00 0x4 0x0 0x0 0x0 0x7ffd 0x7f12") or (None, ())
    assert syscall_names("x86_64")[nr] == "read" and args[0] == 5
    assert procfs.parse_syscall("") is None and procfs.parse_syscall("junk \x00\xff") is None


def test_fdinfo_gives_the_access_mode_and_an_epolls_watched_fds():
    flags, watched = procfs.parse_fdinfo("pos:\t0\nflags:\t02000001\nmnt_id:\t15\n")
    assert flags is not None and flags & 3 == 1 and watched == ()
    text = (
        "pos:\t0\nflags:\t02\ntfd:        7 events:       19 data: 7  pos:0 ino:5 sdev:9\ntfd: 9 events: 1\n"
    )
    assert procfs.parse_fdinfo(text)[1] == (7, 9)


def reader(pid: int, pipe: str, writes: tuple[str, ...] = ()) -> ProcessWaits:
    return ProcessWaits(pid, (ThreadWait(pid, "read", Waker.OBJECTS, (pipe,)),), writes)


def joiner(pid: int, writes: tuple[str, ...] = ()) -> ProcessWaits:
    return ProcessWaits(pid, (ThreadWait(pid, "wait4", Waker.CHILDREN, child=-1),), writes)


def capture(t: float, waits: list[ProcessWaits], cpu: dict[int, float] | None = None) -> StackSample:
    cpu = cpu or {}
    return StackSample(
        t,
        tuple(
            ProcessStacks(
                w.pid, f"p{w.pid}", None, None, DumpOutcome.OK, (), "S", cpu.get(w.pid, 1.0), kernel=w
            )
            for w in waits
        ),
        0.1,
    )


# A and B each read the pipe only the other (and their parent, joining them) can write.
CYCLE = [
    joiner(1, ("pipe:[10]", "pipe:[11]")),
    reader(2, "pipe:[10]", ("pipe:[11]",)),
    reader(3, "pipe:[11]", ("pipe:[10]",)),
]
PARENTS = {2: 1, 3: 1}


def test_two_readers_of_each_others_pipes_under_a_joining_parent_are_a_closed_cycle():
    g = wait_graph([capture(1.0, CYCLE), capture(3.0, CYCLE)], PARENTS)
    assert g is not None and g.closed and g.culprits == (2, 3), g
    assert g.joiners == frozenset({1}) and g.wakers(2) == frozenset({1, 3})


def test_one_capture_or_a_changed_wait_or_cpu_spent_proves_nothing():
    assert wait_graph([capture(1.0, CYCLE)], PARENTS) is None
    moved = [CYCLE[0], reader(2, "pipe:[12]", ("pipe:[11]",)), CYCLE[2]]
    g = wait_graph([capture(1.0, moved), capture(3.0, CYCLE)], PARENTS)
    assert g is not None and not g.closed
    g = wait_graph([capture(1.0, CYCLE), capture(3.0, CYCLE, {3: 1.5})], PARENTS)
    assert g is not None and not g.closed


def test_a_waker_outside_the_tree_or_a_timeout_or_a_shared_futex_keeps_it_open():
    # B's pipe has no writer in the tree (a terminal, another job): someone outside may write it.
    lonely = [CYCLE[0], CYCLE[1], reader(3, "pipe:[99]", ("pipe:[10]",))]
    g = wait_graph([capture(1.0, lonely), capture(3.0, lonely)], PARENTS)
    assert g is not None and not g.closed and OUTSIDE in g.wakers(3)
    for waker in (Waker.TIMEOUT, Waker.ANYONE, Waker.RUNNING):
        extra = replace(CYCLE[2], threads=(*CYCLE[2].threads, ThreadWait(33, "futex", waker)))
        waits = [CYCLE[0], CYCLE[1], extra]
        g = wait_graph([capture(1.0, waits), capture(3.0, waits)], PARENTS)
        assert g is not None and not g.closed, waker


def test_a_member_whose_waits_cannot_be_read_leaves_no_graph():
    blind = capture(3.0, CYCLE)
    blind = replace(blind, processes=(*blind.processes[:2], replace(blind.processes[2], kernel=None)))
    assert wait_graph([capture(1.0, CYCLE), blind], PARENTS) is None


def test_a_process_waiting_only_on_its_own_threads_is_the_bottom_of_the_graph():
    alone = [joiner(1), ProcessWaits(2, (ThreadWait(2, "futex", Waker.ITSELF),))]
    g = wait_graph([capture(1.0, alone), capture(3.0, alone)], {2: 1})
    assert g is not None and g.closed and g.culprits == (2,), g


def test_a_unix_socket_is_woken_by_whoever_holds_its_peer():
    a = ProcessWaits(2, (ThreadWait(2, "recvmsg", Waker.OBJECTS, ("socket:[20]",)),), sockets=(20,))
    b = ProcessWaits(3, (ThreadWait(3, "recvmsg", Waker.OBJECTS, ("socket:[21]",)),), sockets=(21,))
    waits = [joiner(1, ()), a, b]
    peers = ((20, 21), (21, 20))
    samples = [replace(capture(t, waits), unix_peers=peers) for t in (1.0, 3.0)]
    g = wait_graph(samples, PARENTS)
    assert g is not None and g.closed and g.culprits == (2, 3), g
    # Without the peers (netlink refused, or a TCP socket), nobody inside is known to wake them.
    g = wait_graph([capture(t, waits) for t in (1.0, 3.0)], PARENTS)
    assert g is not None and not g.closed


def test_a_loopback_tcp_connection_is_woken_by_whoever_holds_its_other_end():
    a = ProcessWaits(2, (ThreadWait(2, "recvfrom", Waker.OBJECTS, ("socket:[30]",)),), sockets=(30,))
    b = ProcessWaits(3, (ThreadWait(3, "recvfrom", Waker.OBJECTS, ("socket:[31]",)),), sockets=(31,))
    waits = [joiner(1, ()), a, b]
    samples = [replace(capture(t, waits), tcp_peers=((30, 31), (31, 30))) for t in (1.0, 3.0)]
    g = wait_graph(samples, PARENTS)
    assert g is not None and g.closed and g.culprits == (2, 3), g
    assert g.describe(2) == "recvfrom of a TCP socket", g
    # The other end outside the tree (a client, another job's server): anyone may end it.
    outside = [replace(capture(t, waits), tcp_peers=((30, 31),)) for t in (1.0, 3.0)]
    g = wait_graph(outside, PARENTS)
    assert g is not None and not g.closed and 3 not in g.culprits


def test_a_file_lock_is_released_only_by_its_holders_from_proc_locks():
    from hangwatch.collect.procfs import parse_locks

    text = (
        "1: FLOCK  ADVISORY  WRITE 19243 fe:00:2146368 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 19244 fe:00:2146368 0 EOF\n"
        "2: FLOCK  ADVISORY  WRITE 19244 fe:00:2146383 0 EOF\n"
        "2: -> FLOCK  ADVISORY  WRITE 19243 fe:00:2146383 0 EOF\n"
        "3: POSIX  ADVISORY  READ 77 08:01:5 0 EOF\n"
    )
    held = parse_locks(text)
    assert held == (("fe:00:2146368", 19243), ("fe:00:2146383", 19244), ("08:01:5", 77))
    a = ProcessWaits(2, (ThreadWait(2, "flock", Waker.OBJECTS, ("lock:fe:00:2146383 /tmp/l-B",)),))
    b = ProcessWaits(3, (ThreadWait(3, "flock", Waker.OBJECTS, ("lock:fe:00:2146368 /tmp/l-A",)),))
    waits = [joiner(1, ()), a, b]
    holders = (("fe:00:2146368", 2), ("fe:00:2146383", 3))
    g = wait_graph([replace(capture(t, waits), lock_holders=holders) for t in (1.0, 3.0)], PARENTS)
    assert g is not None and g.closed and g.culprits == (2, 3), g
    assert g.describe(2) == "flock for the file lock of /tmp/l-B", g
    assert g.lock_takers == frozenset({2, 3}), g  # a lock-order deadlock, told from a message cycle
    # Held by a process outside the tree (another job's compile): not closed.
    g = wait_graph(
        [replace(capture(t, waits), lock_holders=((holders[0][0], 999),)) for t in (1.0, 3.0)], PARENTS
    )
    assert g is not None and not g.closed


def test_a_read_of_a_pipe_only_its_own_process_writes_waits_for_its_own_threads():
    # One thread reads a pipe whose write end only its own process holds: no other process can end it,
    # as with a socketpair of its own. Alone and untimed, the tree is closed on it; with a second thread
    # in a timed wait, not.
    alone = [reader(10, "pipe:[7]", writes=("pipe:[7]",))]
    graph = wait_graph([capture(0.0, alone), capture(2.0, alone)], {})
    assert graph is not None and graph.waits_for == ((10, frozenset()),)
    assert graph.closed and graph.culprits == (10,)
    housekeeping = ThreadWait(11, "clock_nanosleep", Waker.TIMEOUT)
    busy = [replace(alone[0], threads=(*alone[0].threads, housekeeping))]
    graph = wait_graph([capture(0.0, busy), capture(2.0, busy)], {})
    assert graph is not None and not graph.closed
    # Written by another member, it waits for that member.
    pair = [reader(10, "pipe:[7]"), ProcessWaits(20, (housekeeping,), ("pipe:[7]",))]
    graph = wait_graph([capture(0.0, pair), capture(2.0, pair)], {})
    assert graph is not None and graph.wakers(10) == frozenset({20})


def test_a_main_thread_reading_what_only_its_process_writes_is_no_receiver():
    own = [
        reader(10, "pipe:[7]", writes=("pipe:[7]",)),
        ProcessWaits(20, (ThreadWait(20, "clock_nanosleep", Waker.TIMEOUT),)),
    ]
    graph = wait_graph([capture(0.0, own), capture(2.0, own)], {})
    assert graph is not None and graph.self_readers == frozenset({10}) and 10 not in graph.receivers
    fed = [
        reader(10, "pipe:[7]"),
        ProcessWaits(20, (ThreadWait(20, "clock_nanosleep", Waker.TIMEOUT),), ("pipe:[7]",)),
    ]
    graph = wait_graph([capture(0.0, fed), capture(2.0, fed)], {})
    assert graph is not None and graph.self_readers == frozenset() and graph.receivers == frozenset({10})


def test_any_thread_reading_what_only_its_process_writes_waits_on_itself():
    """Must cover: a request thread (not the main one) blocked in a read of the process's own pipe, beside
    a main thread in its event loop (a llama.cpp server's worker wedged in a native read, 2026-12-06). Must
    not: the same read of a pipe another member writes, which is a wait for that member's message."""
    loop = ThreadWait(10, "epoll_wait", Waker.ANYONE)
    worker = ThreadWait(12, "read", Waker.OBJECTS, ("pipe:[7]",))
    own = [ProcessWaits(10, (loop, worker), ("pipe:[7]",))]
    graph = wait_graph([capture(0.0, own), capture(2.0, own)], {})
    assert graph is not None and graph.self_waits == frozenset({(10, 12)})
    assert graph.self_readers == frozenset()  # its main thread waits for input
    fed = [
        ProcessWaits(10, (loop, worker)),
        ProcessWaits(20, (ThreadWait(20, "clock_nanosleep", Waker.TIMEOUT),), ("pipe:[7]",)),
    ]
    graph = wait_graph([capture(0.0, fed), capture(2.0, fed)], {})
    assert graph is not None and graph.self_waits == frozenset() and graph.wakers(10) >= {20}
