"""A server between requests is idle, not stalled (issue 24, item 5): the stack rule that reads it
(``stacks:idle-server``) and the assessor's decision (``ready:idle-server``, only with no readiness rule).

Built by hand: a process that listens on a TCP port and waits for input in its event loop (the kernel's
timed poll), with or without a worker reading a pipe only the front writes; then the shapes that must not
read as idle: a member stuck elsewhere, ranks in a collective beside a listening store, a request
waiting, a server never ready by its readiness rule, a listener whose wait only a member can end.
"""

from __future__ import annotations

from dataclasses import replace

from builders import frames
from builders import process_sample
from hangwatch import engines
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import Policy
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stackrules import rule_idle_server
from hangwatch.analyse.stackrules import rule_wait_cycle
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.kernelwaits import ThreadWait
from hangwatch.model.kernelwaits import Waker
from hangwatch.model.samples import ConnectionSample
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.status import StackRequest
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State

FRONT, WORKER = 100, 101
PORT = 8765

# http.server's main thread between requests: serve_forever in its selector's poll (0.5 s timeout).
SERVE = (
    *frames("main", "BaseServer.serve_forever", file="socketserver.py"),
    Frame("_PollLikeSelector.select", "selectors.py", 415),
)
POLL = ProcessWaits(FRONT, (ThreadWait(FRONT, "poll", Waker.TIMEOUT),), writes=("pipe:[7]",))
# A worker reading the pipe only the front writes: it waits for the front, the front for the outside.
READ_PIPE = (*frames("_worker"), Frame("_ConnectionBase.recv_bytes", "multiprocessing/connection.py", 216))
READS = ProcessWaits(WORKER, (ThreadWait(WORKER, "read", Waker.OBJECTS, ("pipe:[7]",)),))
# A worker stuck on an Event of its own: nothing outside can end that, and the front may wait for it.
STUCK = (*frames("_worker"), Frame("Event.wait", "threading.py", 629))
OWN_FUTEX = ProcessWaits(WORKER, (ThreadWait(WORKER, "futex", Waker.ITSELF),))


def _stacks(
    pid: int, stack: tuple[Frame, ...], kernel: ProcessWaits | None, **changes: object
) -> ProcessStacks:
    base = ProcessStacks(
        pid, f"proc{pid}", None, None, DumpOutcome.OK,
        (ThreadStack(pid, "MainThread", False, False, stack),), "S", 1.0, kernel=kernel,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def _samples(*procs: ProcessStacks, times: tuple[float, ...] = (3.0, 5.0, 7.0)) -> list[StackSample]:
    return [StackSample(t, procs, 0.05) for t in times]


def _procs(ports: tuple[int, ...] = (PORT,), worker: bool = True) -> tuple[ProcessSample, ...]:
    front = process_sample(FRONT, "proc100", listening_ports=ports)
    return (front, process_sample(WORKER, "proc101", ppid=FRONT)) if worker else (front,)


def _ticks(procs: tuple[ProcessSample, ...], until: float = 7.0) -> list[Tick]:
    connections = ConnectionSample(ports=(PORT,))
    return [Tick(float(t), procs, connections=connections) for t in range(int(until) + 1)]


def _classify(*procs: ProcessStacks, tree: tuple[ProcessSample, ...] | None = None, **ctx: object):  # type: ignore[no-untyped-def]
    context = stack_context(_samples(*procs), _ticks(tree if tree is not None else _procs()))
    return classify(replace(context, **ctx))  # type: ignore[arg-type]


def test_a_server_waiting_in_its_event_loop_with_a_worker_waiting_on_it_is_idle():
    d = _classify(_stacks(FRONT, SERVE, POLL), _stacks(WORKER, READ_PIPE, READS))
    assert d.cause is Cause.IDLE and d.rules == ("stacks:idle-server",), d
    assert not d.closed and d.culprits == ()
    assert f"proc100[100] listens on port {PORT} and waits for input in" in d.explanation
    assert "proc101[101] waiting in _worker > _ConnectionBase.recv_bytes for messages" in d.explanation
    assert "no client request waits for an answer" in d.explanation


def test_a_lone_server_is_idle_however_few_processes_serve():
    d = _classify(_stacks(FRONT, SERVE, POLL), tree=_procs(worker=False))
    assert d.cause is Cause.IDLE, d


def test_without_a_listening_port_the_same_waits_are_not_read_as_a_server():
    d = _classify(_stacks(FRONT, SERVE, POLL), _stacks(WORKER, READ_PIPE, READS), tree=_procs(ports=()))
    assert d.cause is not Cause.IDLE, d


def test_a_member_stuck_outside_a_wait_for_input_is_no_idle_server():
    d = _classify(_stacks(FRONT, SERVE, POLL), _stacks(WORKER, STUCK, OWN_FUTEX))
    assert d.cause is not Cause.IDLE, d
    miss = rule_idle_server(
        stack_context(
            _samples(_stacks(FRONT, SERVE, POLL), _stacks(WORKER, STUCK, OWN_FUTEX)), _ticks(_procs())
        )
    )
    assert miss is not None and not hasattr(miss, "cause") and "every other member" in miss.lacked  # type: ignore[union-attr]


def test_ranks_in_a_collective_beside_a_listening_store_are_a_collective_wait():
    """A torchrun job hung in all_reduce: the agent hosts the store (it listens, and polls), the ranks
    wait in the collective, one of them elsewhere. The store's port is no server waiting for work."""
    agent, r0, r1 = 200, 201, 202
    tree = (
        process_sample(agent, "pt_elastic", listening_ports=(29500,)),
        process_sample(r0, "python", ppid=agent, rank="0"),
        process_sample(r1, "python", ppid=agent, rank="1"),
    )
    reduce = frames("main", "all_reduce", "c10d::Work::wait", file="torch/distributed/distributed_c10d.py")
    d = _classify(
        _stacks(agent, (*frames("run", "_invoke_run"), Frame("select", "selectors.py", 415)), None),
        _stacks(r0, reduce, None, rank="0"),
        _stacks(r1, frames("main", "rank_busy_elsewhere", "time_sleep()"), None, rank="1"),
        tree=tree,
    )
    assert d.cause is Cause.COLLECTIVE_WAIT, d


def test_a_rank_waiting_in_a_rendezvous_beside_the_store_it_hosts_is_no_idle_server():
    """Every process waits for input here, and the store listens: yet the ranks wait for members of their
    own group that never came, not for work."""
    r0 = 300
    store = frames(
        "main", "init_process_group", "c10d::TCPStore::wait", file="torch/distributed/rendezvous.py"
    )
    # Its main thread in a receive of the store's socket, as the kernel shows it: it waits for input.
    recv = ProcessWaits(r0, (ThreadWait(r0, "recvfrom", Waker.ANYONE, ("socket:[5]",)),))
    samples = _samples(_stacks(r0, store, recv, rank="0", world_size=2))
    tree = (process_sample(r0, "python", rank="0", listening_ports=(29500,)),)
    miss = rule_idle_server(stack_context(samples, _ticks(tree)))  # the shape is there, short of one thing
    assert miss is not None and "collective or rendezvous" in miss.lacked, miss  # type: ignore[union-attr]
    assert classify(stack_context(samples, _ticks(tree))).cause is Cause.RENDEZVOUS_WAIT  # ... named first


def test_requests_waiting_or_a_server_never_ready_are_not_idle():
    procs = (_stacks(FRONT, SERVE, POLL), _stacks(WORKER, READ_PIPE, READS))
    waiting = _classify(*procs, requests_waiting=("1 client connection(s) sent a request and got no answer",))
    assert waiting.cause is not Cause.IDLE, waiting
    assert _classify(*procs, before_ready=True).cause is not Cause.IDLE


def test_a_listener_whose_wait_only_a_member_can_end_waits_for_that_member_not_for_work():
    # The front reads the worker's pipe (untimed), the worker the front's: the kernel names only members.
    front = ProcessWaits(
        FRONT, (ThreadWait(FRONT, "read", Waker.OBJECTS, ("pipe:[8]",)),), writes=("pipe:[7]",)
    )
    worker = ProcessWaits(
        WORKER, (ThreadWait(WORKER, "read", Waker.OBJECTS, ("pipe:[7]",)),), writes=("pipe:[8]",)
    )
    reading = (*frames("main"), Frame("_ConnectionBase.recv_bytes", "multiprocessing/connection.py", 216))
    context = stack_context(
        _samples(_stacks(FRONT, reading, front), _stacks(WORKER, READ_PIPE, worker)), _ticks(_procs())
    )
    miss = rule_idle_server(context)
    assert miss is not None and "the outside can end" in miss.lacked  # type: ignore[union-attr]
    # And it is what it is: a wait cycle, closed.
    cycle = rule_wait_cycle(context)
    assert cycle is not None and getattr(cycle, "closed", False)


def _watch(policy: Policy, procs: tuple[ProcessStacks, ...], until: float = 30.0):  # type: ignore[no-untyped-def]
    """The assessor fed 1 s ticks of a quiet tree, and a capture of ``procs`` whenever one is due."""
    a = Assessor(engines.by_name("generic"), policy, root_pids={FRONT}, stacks=StackHistory())
    tree = _procs(worker=len(procs) > 1)
    connections = ConnectionSample(ports=(PORT,))
    t = 0.0
    while t <= until:
        log = LogSample(new_lines=1) if t == 0.0 else LogSample()
        v = a.observe(Tick(t, tree, log=log, connections=connections))
        if v is None and a.stacks_wanted() is not StackRequest.NONE:
            v = a.observe_stacks(StackSample(t, procs, 0.05))
        if v is not None:
            return a, v
        t += 1.0
    return a, None


def test_with_no_readiness_rule_an_idle_server_is_ready_when_the_stall_window_runs_out():
    a, v = _watch(
        Policy(stall_after_s=10.0, has_readiness=False),
        (_stacks(FRONT, SERVE, POLL), _stacks(WORKER, READ_PIPE, READS)),
    )
    assert v is not None and v.state is State.READY and v.cause is Cause.IDLE, v
    assert v.decided_by[:2] == ("ready:idle-server", "stacks:idle-server"), v.decided_by
    assert v.summary.startswith("ready after 10.0 s: idle, waiting for work:"), v.summary
    assert f"listening on {PORT}" in v.evidence
    assert a.serving and a.ready_at == 10.0  # watched on as a server: a request left unanswered stalls
    assert not v.culprits and v.next_steps  # what to do to see a wedge: send it a request


def test_with_a_readiness_rule_the_rule_decides_and_an_idle_looking_server_is_not_taken_for_ready():
    _, v = _watch(Policy(stall_after_s=10.0, has_readiness=True), (_stacks(FRONT, SERVE, POLL),))
    assert v is not None and v.state is State.STALLED, v


def test_a_server_with_a_member_stuck_is_stalled_at_the_window_as_before():
    _, v = _watch(
        Policy(stall_after_s=10.0, has_readiness=False),
        (_stacks(FRONT, SERVE, POLL), _stacks(WORKER, STUCK, OWN_FUTEX)),
    )
    assert v is not None and v.state is State.STALLED, v
