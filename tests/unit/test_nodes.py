"""Across nodes, without a network: host lists, the bundle codec, ssh's failures, the merge and its census.

Bundles here come from the real collector run on this machine against a real sleeping process (so
the codec sees what a node sends), or are built by hand where the merge's arithmetic is the point.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import fields
from dataclasses import replace
from pathlib import Path

import pytest

from hangwatch.analyse.nodes import KEY_STRIDE
from hangwatch.analyse.nodes import NodeParts
from hangwatch.analyse.nodes import analyse
from hangwatch.analyse.nodes import clock_skew
from hangwatch.analyse.nodes import merge
from hangwatch.analyse.nodes import relabel_stacks
from hangwatch.errors import UsageError
from hangwatch.model.nodes import BUNDLE_SCHEMA
from hangwatch.model.nodes import ClockReading
from hangwatch.model.nodes import CollectMode
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.nodes import NodeIdentity
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeProcess
from hangwatch.model.nodes import NodeResult
from hangwatch.model.nodes import ProcessKey
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.nodes import codec
from hangwatch.nodes import hosts
from hangwatch.nodes.collector import CollectOptions
from hangwatch.nodes.collector import collect
from hangwatch.nodes.collector import within_size
from hangwatch.nodes.gather import result_of
from hangwatch.ranges import compact_ranges
from hangwatch.ranges import rank_ranges
from hangwatch.render.nodes_text import local_text
from hangwatch.transports.ssh import Exchange
from hangwatch.transports.ssh import SshOptions
from hangwatch.transports.ssh import answer_of
from hangwatch.transports.ssh import collect_nodes
from hangwatch.transports.ssh import ssh_argv


# -- host lists -------------------------------------------------------------------------------------
def test_host_ranges_expand_like_pdsh() -> None:
    assert hosts.expand("node[1-3],login") == ["node1", "node2", "node3", "login"]
    assert hosts.expand("gpu[08-10,12]") == ["gpu08", "gpu09", "gpu10", "gpu12"]
    assert hosts.expand("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert hosts.expand("a,a,b") == ["a", "b"]


@pytest.mark.parametrize("bad", ["node[1-", "node[3-1]", "node[a-b]", "-oProxyCommand=x"])
def test_bad_host_lists_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError):
        hosts.expand(bad)


def test_hostfile_takes_the_first_word_of_each_line(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nnode1 slots=8\nnode[2-3]  # rack 2\n\n")
    assert hosts.read_hostfile(path) == ["node1", "node2", "node3"]


# -- the collector and the codec ---------------------------------------------------------------------
@pytest.fixture
def sleeper() -> object:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={"RANK": "5", "WORLD_SIZE": "8", "HF_TOKEN": "hf_secretsecretsecretsecret1234"},
    )
    yield proc
    proc.kill()
    proc.wait()


def test_a_census_bundle_round_trips_into_the_model_objects(sleeper: subprocess.Popen[bytes]) -> None:
    bundle = collect(CollectOptions(pids=(sleeper.pid,), mode=CollectMode.CENSUS, every_s=0.2))
    text = codec.encode(bundle)
    back = codec.decode(text)
    # Frozen samples compare by value: nothing lost, nothing renamed (floats kept to 6 digits).
    assert replace(back, clock=bundle.clock) == bundle
    assert codec.encode(back) == text
    assert isinstance(back.ticks[0].processes[0], ProcessSample)
    (p,) = back.processes
    assert (p.pid, p.rank, p.rank_source, p.world_size) == (sleeper.pid, "5", "env:RANK", 8)
    assert "HF_TOKEN" not in p.env and "hf_secret" not in text  # allow-listed keys only
    assert back.stacks == ()  # census mode takes no stacks
    assert back.clock.duration_s >= 0.2


def test_the_collector_never_selects_itself(tmp_path: Path) -> None:
    """The ssh session's shell carries the pattern in its command line; it and the collector are skipped."""
    bundle = collect(CollectOptions(match="never-matches-anything-zq", mode=CollectMode.CENSUS, every_s=0.0))
    assert bundle.processes == ()
    assert [e.stage for e in bundle.errors] == ["select"]


def test_over_size_bundles_drop_parts_and_say_so(sleeper: subprocess.Popen[bytes]) -> None:
    bundle = collect(CollectOptions(pids=(sleeper.pid,), mode=CollectMode.CENSUS, every_s=0.0))
    small = within_size(bundle, 1000)
    assert small.truncated
    assert small.errors[-1].stage == "limits" and "thread details" in small.errors[-1].detail


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("not json", "not JSON"),
        ('{"schema": "hangwatch.report/1"}', "schema"),
        (f'{{"schema": "{BUNDLE_SCHEMA}"}}', "missing"),
    ],
)
def test_what_is_not_a_bundle_is_a_decode_error(text: str, needle: str) -> None:
    with pytest.raises(codec.BundleDecodeError, match=needle):
        codec.decode(text)


# -- ssh: what each failure becomes -------------------------------------------------------------------
def _exchange(rc: int | None, stderr: str = "", stdout: bytes = b"") -> Exchange:
    return Exchange(rc, stdout, stderr, 100.0, 100.5)


@pytest.mark.parametrize(
    ("rc", "stderr", "outcome"),
    [
        (255, "ssh: connect to host 10.0.0.3 port 22: Connection refused", NodeOutcome.REFUSED),
        (255, "root@10.0.0.3: Permission denied (publickey).", NodeOutcome.AUTH),
        (255, "Host key verification failed.", NodeOutcome.HOST_KEY),
        (255, "ssh: Could not resolve hostname n9: Name or service not known", NodeOutcome.UNREACHABLE),
        (255, "ssh: connect to host n9 port 22: Connection timed out", NodeOutcome.TIMEOUT),
        (None, "", NodeOutcome.TIMEOUT),
        (127, "bash: line 1: hangwatch: command not found", NodeOutcome.NO_COLLECTOR),
        (2, "hangwatch: error: argument --match: expected one argument", NodeOutcome.REMOTE_ERROR),
        (0, "", NodeOutcome.BAD_OUTPUT),
    ],
)
def test_ssh_failures_become_that_nodes_outcome(rc: int | None, stderr: str, outcome: NodeOutcome) -> None:
    result = result_of(answer_of("n9", _exchange(rc, stderr, b"garbage"), SshOptions()))
    assert result.outcome is outcome
    assert result.bundle is None
    assert stderr.splitlines()[-1] in result.detail if stderr else result.detail


def test_the_remote_command_is_quoted_and_batch_mode_is_on() -> None:
    argv = ssh_argv(
        "n1",
        ["--match", "sglang::scheduler; rm -rf /"],
        SshOptions(remote=("/opt/v/bin/python", "-m", "hangwatch")),
    )
    assert argv[:4] == ["ssh", "-T", "-o", "BatchMode=yes"]
    assert argv[-2:] == ["n1", "/opt/v/bin/python -m hangwatch collect --match 'sglang::scheduler; rm -rf /'"]


def test_nodes_run_in_parallel_within_the_bound() -> None:
    import threading
    import time

    running, peak, lock = [0], [0], threading.Lock()

    def runner(argv: list[str], deadline: float) -> Exchange:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return _exchange(255, "Connection refused")

    results = collect_nodes([f"n{i}" for i in range(10)], [], SshOptions(concurrency=4), lambda a: a, runner)
    assert [r.host for r in results] == [f"n{i}" for i in range(10)]
    assert peak[0] == 4


# -- the merge ----------------------------------------------------------------------------------------
def _frames(*names: str) -> tuple[Frame, ...]:
    return tuple(Frame(n, "job.py", i + 1) for i, n in enumerate(names))


def _bundle(host: str, ns: int, ranks: dict[int, str], world: int, t0: float = 0.0) -> NodeBundle:
    """Ranks {pid: leaf function}; the pids repeat across nodes on purpose (pid namespaces)."""
    procs = tuple(
        NodeProcess(pid, 1, "python", "rank", str(rank), "env:RANK", world, {"RANK": str(rank)}, 0.0)
        for rank, pid in enumerate(ranks)
    )
    samples = []
    ticks = []
    for i in range(2):
        stacks = tuple(
            ProcessStacks(
                pid,
                "python",
                "rank",
                next(p.rank for p in procs if p.pid == pid),
                DumpOutcome.OK,
                (ThreadStack(pid, "MainThread", False, False, _frames("main", leaf)),),
                state="S",
                cpu_s=1.0,
                world_size=world,
            )
            for pid, leaf in ranks.items()
        )
        samples.append(StackSample(float(i), stacks, 0.01))
        ticks.append(
            Tick(
                float(i),
                tuple(
                    ProcessSample(pid, 1, "python", (), "S", 1.0, 0.0, 0, 0, 0, 1, 0, (), "rank", p.rank)
                    for pid, p in zip(ranks, procs, strict=True)
                ),
            )
        )
    return NodeBundle(
        BUNDLE_SCHEMA,
        "0",
        CollectMode.FULL,
        "match x",
        NodeIdentity(host, "boot", ns, "6"),
        ClockReading(1000.0 + t0, 5.0, 0.5),
        procs,
        tuple(ticks),
        tuple(samples),
    )


def _ok(host: str, bundle: NodeBundle, sent: float = 1000.0, received: float = 1001.0) -> NodeResult:
    return NodeResult(host, NodeOutcome.OK, "", bundle, sent, received)


def test_equal_pids_on_two_nodes_stay_two_ranks_and_the_odd_one_is_named_with_its_node() -> None:
    a = _bundle("n1", 11, {7: "all_reduce"}, world=3)
    b = _bundle("n2", 22, {7: "all_reduce", 8: "busy_elsewhere"}, world=3)
    # Renumber n2's ranks 1 and 2, as RANK says.
    b = replace(b, processes=tuple(replace(p, rank=str(i + 1)) for i, p in enumerate(b.processes)))
    b = replace(
        b,
        stacks=tuple(
            replace(s, processes=tuple(replace(p, rank=str(i + 1)) for i, p in enumerate(s.processes)))
            for s in b.stacks
        ),
    )
    result = analyse([_ok("n1", a), _ok("n2", b)])
    merged = result.merged
    assert len(set(merged.keys)) == 3
    assert {(k.node, k.pid_ns, k.pid) for k in merged.keys.values()} == {
        ("n1", 11, 7),
        ("n2", 22, 7),
        ("n2", 22, 8),
    }
    # The same rules as on one node, over both nodes' ranks: the odd one out is rank 2, pid 8 of n2.
    (culprit,) = result.diagnosis.culprits
    assert merged.keys[culprit] == ProcessKey("n2", 22, 8)
    assert "n[1-2]:rank0-1 waiting in all_reduce" in result.diagnosis.explanation
    assert result.tree.summary == "n[1-2]:rank0-1 in all_reduce; n2:rank2 in busy_elsewhere (odd one out)"


def _native_first(bundle: NodeBundle, leaf: str) -> NodeBundle:
    """The bundle's first round native (``leaf`` under each thread's frames), the second Python only, as
    ``stacks --hosts`` reads by default."""
    first, second = bundle.stacks
    native = tuple(
        replace(
            p,
            native=True,
            threads=tuple(
                replace(t, frames=(*t.frames, Frame(leaf, "libc.so.6", 0, True))) for t in p.threads
            ),
        )
        for p in first.processes
    )
    return replace(bundle, stacks=(replace(first, processes=native), second))


def test_the_latest_round_borrows_its_own_nodes_native_frames_as_it_is_merged() -> None:
    # Both nodes run pid 7 in the same Python stack; their first rounds were native, in different calls.
    a = _native_first(_bundle("n1", 11, {7: "all_reduce"}, world=2), "futex_wait")
    b = _native_first(_bundle("n2", 22, {7: "all_reduce"}, world=2), "epoll_wait")
    b = replace(b, processes=tuple(replace(p, rank="1") for p in b.processes))
    b = replace(
        b,
        stacks=tuple(
            replace(s, processes=tuple(replace(p, rank="1") for p in s.processes)) for s in b.stacks
        ),
    )
    # n2's Python stack moved (another line) between its rounds: its latest capture keeps its own frames.
    moved = b.stacks[1].processes[0]
    (thread,) = moved.threads
    other = (*thread.frames[:-1], replace(thread.frames[-1], line=99))
    b = replace(
        b,
        stacks=(
            b.stacks[0],
            replace(b.stacks[1], processes=(replace(moved, threads=(replace(thread, frames=other),)),)),
        ),
    )
    merged = merge([_ok("n1", a), _ok("n2", b)])
    latest = {p.pid: p.threads[0] for p in merged.samples[-1].processes}
    assert [f.name for f in latest[KEY_STRIDE + 7].frames][-2:] == ["all_reduce", "futex_wait"]  # n1's own
    assert not any(f.native for f in latest[2 * KEY_STRIDE + 7].frames)  # never n1's, nor its own old call
    # The thread in place is one object in both rounds: copied once under its key.
    first = {p.pid: p.threads[0] for p in merged.samples[0].processes}
    assert latest[KEY_STRIDE + 7] is first[KEY_STRIDE + 7]
    assert latest[KEY_STRIDE + 7].tid == KEY_STRIDE + 7


def test_who_is_missing_names_the_silent_nodes() -> None:
    a = _bundle("n1", 11, {7: "init_process_group", 9: "init_process_group"}, world=4)
    dead = NodeResult("n2", NodeOutcome.REFUSED, "Connection refused", None, 1000.0, 1000.1)
    merged = merge([_ok("n1", a), dead])
    assert merged.census.world_size == 4
    assert merged.census.missing == (2, 3)
    assert merged.census.silent_nodes == ("n2",)
    assert [(n.label, n.outcome) for n in merged.nodes] == [
        ("n1", NodeOutcome.OK),
        ("n2", NodeOutcome.REFUSED),
    ]


def test_clock_skew_is_bounded_by_the_exchange() -> None:
    ahead = _bundle("n1", 11, {7: "x"}, world=1, t0=30.0)  # the node's clock reads 30 s ahead
    skew = clock_skew(_ok("n1", ahead, sent=1000.0, received=1001.0))
    assert skew is not None
    assert skew.bound_s == pytest.approx(0.25)  # (received - duration - sent) / 2
    assert skew.offset_s - skew.bound_s <= 30.0 <= skew.offset_s + skew.bound_s + 0.5
    # The collector's process had run 0.3 s when it read its clock: that much of the exchange is excluded.
    later = replace(ahead, clock=replace(ahead.clock, since_exec_s=0.3))
    narrower = clock_skew(_ok("n1", later, sent=1000.0, received=1001.0))
    assert narrower is not None
    assert narrower.bound_s == pytest.approx(0.1)  # (received - duration - (sent + 0.3)) / 2


def test_texts_show_each_nodes_own_pid() -> None:
    a = _bundle("n1", 11, {7: "x"}, world=1)
    merged = merge([_ok("n1", a)])
    key = next(iter(merged.keys))
    assert key == KEY_STRIDE + 7
    assert local_text(f"main[{key}] and rank {key}", merged.keys) == "main[7] and rank 7"


def test_other_collectors_and_their_clients_are_never_the_server() -> None:
    """Two streams on one host (two aliases, two pods of one machine) must not select each other."""
    from hangwatch.collect.proctree import is_collector

    assert is_collector(["ssh", "-T", "--", "n1", "'/opt/v/bin/hangwatch' collect --match 'sglang::'"])
    assert is_collector(["kubectl", "exec", "-i", "p", "-c", "c", "--", "hangwatch", "collect", "--stream"])
    assert is_collector(
        ["/usr/bin/python3", "-m", "hangwatch", "attach", "--hosts", "n[1-2]", "--match", "x"]
    )
    assert not is_collector(["python", "train.py", "--collect-stats"])
    assert not is_collector(["python", "-m", "sglang.launch_server", "--model", "hangwatch-collect"])


def test_relabel_copies_a_thread_equal_in_every_round_once() -> None:
    bundle = _bundle("n1", 11, {7: "all_reduce", 8: "busy_elsewhere"}, world=2)
    # As the codec decodes them: equal stacks are one tuple. Rank 8's thread is on CPU in the second round.
    one, two = bundle.stacks
    two = replace(
        two,
        processes=tuple(
            replace(
                p,
                threads=tuple(
                    replace(t, frames=u.frames, active=p.pid == 8)
                    for t, u in zip(p.threads, q.threads, strict=True)
                ),
            )
            for p, q in zip(two.processes, one.processes, strict=True)
        ),
    )
    moved: dict = {}
    first, second = relabel_stacks(one, KEY_STRIDE, "n1", moved), relabel_stacks(two, KEY_STRIDE, "n1", moved)
    shared = []
    for a, b, raw in zip(first.processes, second.processes, two.processes, strict=True):
        assert a.pid == b.pid == KEY_STRIDE + raw.pid
        for ta, tb, t in zip(a.threads, b.threads, raw.threads, strict=True):
            assert tb == replace(t, tid=KEY_STRIDE + t.tid)
            shared.append(ta is tb)
    # Equal in every field in both rounds: one copy; a thread that changed gets its own.
    assert shared == [True, False]
    # The key names every field of a thread: a field added to ThreadStack must be added to it.
    assert [f.name for f in fields(ThreadStack)] == ["tid", "name", "active", "owns_gil", "frames"]


def test_rank_ranges_is_compact_ranges_of_rank_labels() -> None:
    for ranks in ([], [3], [5, 1, 2, 3, 9, 2], [0, 10, 11, 12, 100]):
        assert rank_ranges(ranks) == compact_ranges(f"rank{r}" for r in ranks)


def test_a_ranks_kernel_waits_move_with_it_so_its_poll_is_seen_across_nodes() -> None:
    """A rank whose main thread sleeps, wakes and looks again (its wakeups rising past what our dumps
    cause) is a poll on its node; merged under the node's key it must still be one, its main thread's
    wait found by the moved pid and its waker by the moved tid, while its waits keep the node's own
    numbering (the merge copies none of them)."""
    from hangwatch.analyse.stackwaits import process_views
    from hangwatch.model.kernelwaits import ProcessWaits
    from hangwatch.model.kernelwaits import ThreadWait
    from hangwatch.model.kernelwaits import Waker

    frames = (Frame("poll_lock", "job.py", 9, False), Frame("time_sleep", "libpython3.so", 0, True))

    def capture(i: int) -> StackSample:
        wait = ThreadWait(100, "clock_nanosleep", Waker.TIMEOUT, wakeups=50 + 30 * i)
        child = ThreadWait(101, "wait4", Waker.CHILDREN, child=200)
        reader = ThreadWait(102, "read", Waker.OBJECTS, on=("pipe:[77]",))
        p = ProcessStacks(
            100, "job", None, "1", DumpOutcome.OK,
            tuple(ThreadStack(tid, name, False, False, frames) for tid, name in ((100, "MainThread"), (101, "t"), (102, "r"))),
            "S", 1.0, kernel=ProcessWaits(100, (wait, child, reader), writes=("pipe:[78]",), our_stops=i),
        )  # fmt: skip
        return StackSample(3.0 + 2 * i, (p,), 0.1)

    samples = [capture(i) for i in range(3)]
    moved: dict = {}
    merged = [relabel_stacks(s, KEY_STRIDE, "n1", moved) for s in samples]
    [alone], [across] = process_views(samples), process_views(merged)
    assert alone.retrying and across.retrying
    wakers = [Waker.TIMEOUT, Waker.CHILDREN, Waker.OBJECTS]
    assert [t.waker for t in across.threads] == [t.waker for t in alone.threads] == wakers
    assert (
        across.main is not None and across.main.tid == KEY_STRIDE + 100 and across.main.waker is Waker.TIMEOUT
    )
    assert merged[-1].processes[0].kernel is samples[-1].processes[0].kernel


def test_the_wait_graph_across_nodes_keeps_each_nodes_pipes_and_children_its_own() -> None:
    """Two nodes number their pids and pipes alike. Merged, a reader of pipe:[77] on one node waits for
    the writer of pipe:[77] on its own node, never for the other node's; a parent's wait4 waits for its
    child on its own node; a thread that reads a pipe only its own process writes is a self-wait, named
    by the moved tid."""
    from hangwatch.analyse.waitgraph import OUTSIDE
    from hangwatch.analyse.waitgraph import wait_graph
    from hangwatch.model.kernelwaits import ProcessWaits
    from hangwatch.model.kernelwaits import ThreadWait
    from hangwatch.model.kernelwaits import Waker

    frames = (Frame("wait", "job.py", 3, False),)

    def proc(pid: int, waits: tuple[ThreadWait, ...], writes: tuple[str, ...] = ()) -> ProcessStacks:
        threads = tuple(ThreadStack(w.tid, None, False, False, frames) for w in waits)
        return ProcessStacks(
            pid,
            "job",
            None,
            None,
            DumpOutcome.OK,
            threads,
            "S",
            1.0,
            kernel=ProcessWaits(pid, waits, writes=writes),
        )

    # n1: 100 reads pipe:[77], which 101 writes; 101 reads pipe:[90], which only 101 writes (thread 102).
    n1 = (
        proc(100, (ThreadWait(100, "read", Waker.OBJECTS, on=("pipe:[77]",)),)),
        proc(
            101,
            (
                ThreadWait(101, "futex", Waker.ITSELF),
                ThreadWait(102, "read", Waker.OBJECTS, on=("pipe:[90]",)),
            ),
            writes=("pipe:[77]", "pipe:[90]"),
        ),
    )
    # n2: 100 reads pipe:[77], which nobody on n2 writes; 50 waits for its child 100.
    n2 = (
        proc(50, (ThreadWait(50, "wait4", Waker.CHILDREN, child=100),)),
        proc(100, (ThreadWait(100, "read", Waker.OBJECTS, on=("pipe:[77]",)),)),
    )
    merged = []
    for t in (1.0, 2.0):
        parts = [
            relabel_stacks(StackSample(t, procs, 0.1), (i + 1) * KEY_STRIDE, f"n{i + 1}")
            for i, procs in enumerate((n1, n2))
        ]
        merged.append(StackSample(t, tuple(p for s in parts for p in s.processes), 0.1))
    one, two = KEY_STRIDE, 2 * KEY_STRIDE
    graph = wait_graph(merged, {two + 100: two + 50})
    assert graph is not None
    assert graph.wakers(one + 100) == {one + 101}
    assert graph.wakers(two + 100) == {OUTSIDE}  # n1's writer of its pipe:[77] is another pipe's
    assert graph.wakers(two + 50) == {two + 100}
    assert (one + 101, one + 102) in graph.self_waits
    assert graph.describe(two + 50) == f"wait4 for child {two + 100}"


def _ranked(bundle: NodeBundle, first: int) -> NodeBundle:
    """The bundle's ranks numbered from ``first`` in the job (RANK), in the census and every round."""

    def renumber(p: NodeProcess | ProcessStacks, i: int) -> NodeProcess | ProcessStacks:
        return replace(p, rank=str(first + i)) if p.rank is not None else p

    return replace(
        bundle,
        processes=tuple(renumber(p, i) for i, p in enumerate(bundle.processes)),  # type: ignore[misc]
        stacks=tuple(
            replace(s, processes=tuple(renumber(p, i) for i, p in enumerate(s.processes)))  # type: ignore[misc]
            for s in bundle.stacks
        ),
    )


def _same_analysis(results: Sequence[NodeResult], parts: NodeParts | None) -> None:
    """The analysis with ``parts`` is the one every node's part made at the end gives, and its context
    (views, wait graph) the one the merged samples give as one sample, as on one node."""
    from hangwatch.analyse.nodes import report_of
    from hangwatch.analyse.stackcontext import stack_context
    from hangwatch.analyse.stackrules import classify
    from hangwatch.render.nodes_text import nodes_text

    streamed, at_end = analyse(results, parts), analyse(results)
    assert streamed.diagnosis == at_end.diagnosis
    assert streamed.tree == at_end.tree
    assert streamed.merged == at_end.merged
    assert nodes_text(report_of(results, "x", parts)) == nodes_text(report_of(results, "x"))
    merged = at_end.merged
    whole = stack_context(list(merged.samples), merged.ticks, tuple(e for t in merged.ticks for e in t.exits))
    assert classify(whole) == at_end.diagnosis


def test_each_nodes_part_made_as_its_answer_arrives_is_what_the_merge_takes() -> None:
    """The fan-out makes a node's part of the merge as its answer arrives (``NodeParts.add``): its copies
    under merge keys, its views and waits. The merge takes them as they are, and the analysis is the
    one of every part made at the end, and of the merged samples analysed as one."""
    from hangwatch.analyse.nodes import node_part

    bundles = [
        _ranked(_bundle("n1", 11, {7: "all_reduce", 8: "all_reduce"}, world=4), 0),
        _ranked(_bundle("n2", 22, {7: "all_reduce"}, world=4), 2),
        _ranked(_bundle("n3", 33, {7: "busy_elsewhere"}, world=4), 3),
    ]
    parts = NodeParts(["n1", "n2", "n3"])
    results = [parts.add(_ok(b.node.hostname, b)) for b in bundles]
    analysis = analyse(results, parts)
    part = parts.part(0, "n1", results[0], 2, 2)
    assert part is not None
    # The merge took the part made on arrival: the very copies, not copies made again.
    assert analysis.merged.samples[-1].processes[0] is part.samples[-1].processes[0]
    assert analyse(results).merged.samples[-1].processes[0] is not part.samples[-1].processes[0]
    assert part == node_part(0, "n1", results[0], 2, 2)  # and made as the merge would have made it
    (culprit,) = analysis.diagnosis.culprits
    assert analysis.merged.keys[culprit] == ProcessKey("n3", 33, 7)
    assert [(r.rank, r.node) for r in analysis.merged.census.found] == [
        (0, "n1"),
        (1, "n1"),
        (2, "n2"),
        (3, "n3"),
    ]
    assert analysis.merged.census.found[0].where == "all_reduce"
    _same_analysis(results, parts)


def test_a_part_made_on_arrival_is_made_again_where_the_merge_decides_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A part is made under the node's hostname, its place among the hosts and every round it sent; the
    merge makes it again where those are not what it decides: two nodes of one hostname (labelled by
    the host as given), a node with fewer rounds (each node's first rounds are merged), a host named
    twice. A part that fails to be made costs nothing but the head start."""
    import hangwatch.analyse.nodes as nodes_module

    twins = [
        _ranked(_bundle("node", 11, {7: "all_reduce"}, world=3), 0),  # containers: one hostname
        _ranked(_bundle("node", 22, {7: "all_reduce"}, world=3), 1),
        _ranked(_bundle("n3", 33, {7: "busy_elsewhere"}, world=3), 2),
    ]
    parts = NodeParts(["h1", "h2", "h3"])
    results = [parts.add(_ok(host, b)) for host, b in zip(["h1", "h2", "h3"], twins, strict=True)]
    assert parts.part(0, "h1", results[0], 2, 2) is None  # made as "node": made again as "h1"
    analysis = analyse(results, parts)
    assert [n.label for n in analysis.merged.nodes] == ["h1", "h2", "n3"]
    assert "h[1-2]:rank0-1 waiting in all_reduce" in analysis.diagnosis.explanation
    _same_analysis(results, parts)

    # n2 was cut short by its deadline: one round. The merge keeps every node's first round only.
    short = replace(twins[1], node=replace(twins[1].node, hostname="n2"), stacks=twins[1].stacks[:1])
    parts = NodeParts(["n1", "n2", "n3", "n1"])  # n1 named twice: the second is made at the merge
    nodes = [replace(twins[0], node=replace(twins[0].node, hostname="n1")), short, twins[2], twins[0]]
    results = [parts.add(_ok(host, b)) for host, b in zip(["n1", "n2", "n3", "n1"], nodes, strict=True)]
    assert parts.part(0, "n1", results[0], 2, 2) is not None and parts.part(0, "n1", results[0], 1, 2) is None
    analysis = analyse(results, parts)
    assert len(analysis.merged.samples) == 1
    _same_analysis(results, parts)

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a part that cannot be made")

    parts = NodeParts(["n1", "n2"])
    with monkeypatch.context() as patch:
        patch.setattr(nodes_module, "node_part", broken)
        results = [parts.add(_ok("n1", nodes[0])), parts.add(_ok("n2", twins[2]))]
    assert results[0].bundle is nodes[0]  # the answer handed on unchanged
    assert parts.part(0, "n1", results[0], 2, 2) is None
    assert len(analyse(results, parts).merged.keys) == 2  # the merge made the parts itself
    _same_analysis(results, parts)


def test_the_fan_out_makes_each_nodes_part_in_its_worker_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gather_ssh`` with parts: each node's answer is decoded and its part made in the transport's
    worker threads, as the answers are finished (several at once), and every part is the merge's."""
    from concurrent.futures import ThreadPoolExecutor

    from hangwatch.model.nodes import NodeAnswer
    from hangwatch.nodes import gather
    from hangwatch.transports import ssh

    hosts = [f"n{i}" for i in range(8)]
    sent = {
        h: codec.encode(_ranked(_bundle(h, i, {7: "all_reduce"}, world=8), i)).encode()
        for i, h in enumerate(hosts)
    }

    def collect_nodes(
        targets: Sequence[str], args: object, options: object, finish: object
    ) -> list[NodeResult]:
        with ThreadPoolExecutor(4) as pool:
            return list(
                pool.map(
                    lambda h: finish(NodeAnswer(h, NodeOutcome.OK, "", sent[h], 1000.0, 1001.0)), targets
                )
            )  # type: ignore[operator]

    monkeypatch.setattr(ssh, "collect_nodes", collect_nodes)
    parts = NodeParts(hosts)
    results = gather.gather_ssh(hosts, [], SshOptions(), parts)
    assert [
        parts.part(i, h, r, 2, 2) is not None for i, (h, r) in enumerate(zip(hosts, results, strict=True))
    ] == [True] * 8
    analysis = analyse(results, parts)
    assert analysis.merged.census.missing == () and len(analysis.merged.keys) == 8
    _same_analysis(results, parts)


def test_the_native_frames_a_capture_borrows_are_worked_out_once_for_all_nodes() -> None:
    """Ranks of every node in one wait share their stacks (decoded into one tuple each): what a Python-only
    round borrows from the native one is worked out once for them all, and each node's copy has it."""
    from hangwatch.analyse.nodes import PartMemos
    from hangwatch.analyse.nodes import node_part

    def sent(host: str, ns: int) -> NodeBundle:
        bundle = _native_first(_bundle(host, ns, {7: "all_reduce", 8: "all_reduce"}, world=4), "futex_wait")
        return codec.decode(codec.encode(bundle))  # as the node's answer is decoded: one tuple per stack

    memos = PartMemos()
    made = [node_part(i, h, _ok(h, sent(h, 10 + i)), 2, 2, memos=memos) for i, h in enumerate(("n1", "n2"))]
    assert len(memos.borrowed) == 1
    latest = [t.frames for part in made for p in part.samples[-1].processes for t in p.threads]
    assert len({id(frames) for frames in latest}) == 1
    assert [f.name for f in latest[0]][-2:] == ["all_reduce", "futex_wait"]


def test_a_part_knows_no_more_than_the_merged_samples() -> None:
    """A node's part reads what the merged samples carry, no more: not its socket peers (two ranks on each
    node in a recvfrom on the socketpair between them, which the merge-first analysis cannot resolve),
    and not ticks past those every node has (a wait4 parent whose child shows only in its node's third
    tick, when another node sent two). Either would make a verdict the merged samples do not support."""
    from hangwatch.model.kernelwaits import ProcessWaits
    from hangwatch.model.kernelwaits import ThreadWait
    from hangwatch.model.kernelwaits import Waker

    def stacks(pid: int, rank: str | None, leaf: str, kernel: ProcessWaits) -> ProcessStacks:
        thread = ThreadStack(pid, "MainThread", False, False, _frames("main", leaf))
        return ProcessStacks(
            pid, "python", "rank", rank, DumpOutcome.OK, (thread,), "S", 1.0, world_size=4, kernel=kernel
        )

    def node(
        host: str, ns: int, procs: list[tuple[int, int, str | None]], rounds: list[StackSample], ticks: int
    ) -> NodeResult:
        census = tuple(
            NodeProcess(pid, ppid, "python", "rank", rank, "env:RANK", 4, {}, 0.0)
            for pid, ppid, rank in procs
        )
        seen = [
            tuple(
                ProcessSample(pid, ppid, "python", (), "S", 1.0, 0.0, 0, 0, 0, 1, 0, (), "rank", rank)
                for pid, ppid, rank in procs[: 1 if t < ticks - 1 else None]
            )
            for t in range(ticks)
        ]
        ticked = tuple(Tick(float(t), seen[t]) for t in range(ticks))
        bundle = NodeBundle(
            BUNDLE_SCHEMA,
            "0",
            CollectMode.FULL,
            "match x",
            NodeIdentity(host, "boot", ns, "6"),
            ClockReading(1000.0, 5.0, 0.5),
            census,
            ticked,
            tuple(rounds),
        )
        return _ok(host, bundle)

    def reads(pid: int, inode: int) -> ProcessWaits:
        return ProcessWaits(
            pid, (ThreadWait(pid, "recvfrom", Waker.OBJECTS, on=(f"socket:[{inode}]",)),), sockets=(inode,)
        )

    paired = []
    for i, host in enumerate(("n1", "n2")):
        procs = [(7, 1, str(2 * i)), (8, 1, str(2 * i + 1))]
        rounds = [
            StackSample(
                t,
                (
                    stacks(7, str(2 * i), "recv", reads(7, 500)),
                    stacks(8, str(2 * i + 1), "recv", reads(8, 501)),
                ),
                0.01,
                unix_peers=((500, 501), (501, 500)),
            )
            for t in (0.0, 1.0)
        ]
        paired.append(node(host, 10 + i, procs, rounds, 2))
    parts = NodeParts(["n1", "n2"])
    results = [parts.add(r) for r in paired]
    assert analyse(results, parts).diagnosis.cause.value != "wait-cycle"
    _same_analysis(results, parts)

    # n1: a parent in wait4 for any child; its child (reading a pipe only the parent writes) is in n1's
    # third tick only; n2 sent two ticks. n2's two processes read each other's pipes.
    parent = ProcessWaits(5, (ThreadWait(5, "wait4", Waker.CHILDREN, child=-1),), writes=("pipe:[9]",))
    child = ProcessWaits(7, (ThreadWait(7, "read", Waker.OBJECTS, on=("pipe:[9]",)),))
    n1 = node(
        "n1",
        10,
        [(5, 1, None), (7, 5, "0")],
        [
            StackSample(t, (stacks(5, None, "wait", parent), stacks(7, "0", "read", child)), 0.01)
            for t in (0.0, 1.0)
        ],
        3,
    )
    a = ProcessWaits(7, (ThreadWait(7, "read", Waker.OBJECTS, on=("pipe:[3]",)),), writes=("pipe:[4]",))
    b = ProcessWaits(8, (ThreadWait(8, "read", Waker.OBJECTS, on=("pipe:[4]",)),), writes=("pipe:[3]",))
    n2 = node(
        "n2",
        11,
        [(7, 1, "1"), (8, 1, None)],
        [StackSample(t, (stacks(7, "1", "read", a), stacks(8, None, "read", b)), 0.01) for t in (0.0, 1.0)],
        2,
    )
    parts = NodeParts(["n1", "n2"])
    results = [parts.add(n1), parts.add(n2)]
    assert parts.part(0, "n1", results[0], 2, 3) is not None  # made with its three ticks on arrival
    analysis = analyse(results, parts)
    assert len(analysis.merged.ticks) == 2 and analysis.diagnosis.cause.value != "wait-cycle"
    _same_analysis(results, parts)


def test_which_processes_are_the_ranks_is_the_jobs_to_say_not_each_nodes() -> None:
    """On its own, a node with one rank and two helpers of one title would take the helpers for its
    peer group (``peer_pids``: the largest group sharing a title, where fewer than two name a rank). The
    job names two ranks: they are the peers, in the views the merge joins as in one sample's."""
    a = _ranked(_bundle("n1", 11, {7: "all_reduce"}, world=2), 0)
    helpers = {
        pid: ProcessStacks(pid, "helper", None, None, DumpOutcome.OK, (ThreadStack(pid, "MainThread", False, False, _frames("loop", "sleep")),), "S", 1.0)
        for pid in (30, 31)
    }  # fmt: skip
    a = replace(a, stacks=tuple(replace(s, processes=(*s.processes, *helpers.values())) for s in a.stacks))
    b = _ranked(_bundle("n2", 22, {7: "all_reduce"}, world=2), 1)
    parts = NodeParts(["n1", "n2"])
    results = [parts.add(_ok("n1", a)), parts.add(_ok("n2", b))]
    part = parts.part(0, "n1", results[0], 2, 2)
    assert part is not None
    assert {v.pid - KEY_STRIDE: v.peer for v in part.views} == {7: False, 30: True, 31: True}  # n1 alone
    _same_analysis(results, parts)


def test_the_wait_graph_of_the_nodes_parts_is_the_graph_of_their_merged_samples() -> None:
    """Each node's wait facts joined (``graph_of``) are the graph of the merged samples: two nodes each
    closed (a pipe cycle) make a closed job with all four to blame; one node whose processes wait for
    anyone leaves it open; one node whose waits were not read leaves no graph at all."""
    from hangwatch.analyse.waitgraph import graph_of
    from hangwatch.analyse.waitgraph import wait_facts
    from hangwatch.analyse.waitgraph import wait_graph
    from hangwatch.model.kernelwaits import ProcessWaits
    from hangwatch.model.kernelwaits import ThreadWait
    from hangwatch.model.kernelwaits import Waker

    frames = (Frame("wait", "job.py", 3, False),)

    def proc(pid: int, reads: str, writes: str, waker: Waker = Waker.OBJECTS) -> ProcessStacks:
        wait = ThreadWait(pid, "read", waker, on=(reads,) if waker is Waker.OBJECTS else ())
        return ProcessStacks(
            pid, "job", None, None, DumpOutcome.OK, (ThreadStack(pid, None, False, False, frames),), "S", 1.0,
            kernel=ProcessWaits(pid, (wait,), writes=(writes,)),
        )  # fmt: skip

    cycle = (proc(100, "pipe:[77]", "pipe:[78]"), proc(101, "pipe:[78]", "pipe:[77]"))
    open_ = (proc(100, "pipe:[77]", "pipe:[78]"), proc(101, "", "pipe:[77]", Waker.ANYONE))
    unread = (replace(cycle[0], kernel=None), cycle[1])

    def by_node(*nodes: tuple[ProcessStacks, ...]) -> list[list[StackSample]]:
        return [
            [
                relabel_stacks(StackSample(t, procs, 0.1), (i + 1) * KEY_STRIDE, f"n{i + 1}")
                for t in (1.0, 2.0)
            ]
            for i, procs in enumerate(nodes)
        ]

    for nodes in ((cycle, cycle), (cycle, open_), (cycle, unread)):
        rounds = by_node(*nodes)
        merged = [
            StackSample(t, tuple(p for r in rounds for p in r[k].processes), 0.1)
            for k, t in enumerate((1.0, 2.0))
        ]
        joined = graph_of([wait_facts(r, {}) for r in rounds])
        assert joined == wait_graph(merged, {})
    closed = graph_of([wait_facts(r, {}) for r in by_node(cycle, cycle)])
    assert closed is not None and closed.closed and len(closed.culprits) == 4
    still_open = graph_of([wait_facts(r, {}) for r in by_node(cycle, open_)])
    assert still_open is not None and not still_open.closed
    assert graph_of([wait_facts(r, {}) for r in by_node(cycle, unread)]) is None


def test_stacks_across_nodes_keeps_the_collector_off_until_its_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the first answer to the printed report the cyclic collector is off (a collection between the
    decoding and the analysis walked every bundle), and it is on again afterwards."""
    import gc

    from hangwatch.nodes import session

    seen: list[tuple[str, bool]] = []
    results = [
        NodeResult(host, NodeOutcome.OK, "", _bundle(host, ns, {100: "all_reduce", 101: "all_reduce"}, 4), 999.0, 1001.0)
        for host, ns in (("n1", 1), ("n2", 2))
    ]  # fmt: skip

    def gather(
        hosts: Sequence[str], args: object, options: object, parts: NodeParts | None = None
    ) -> list[NodeResult]:
        seen.append(("gather", gc.isenabled()))
        return [parts.add(r) if parts is not None else r for r in results if r.host in hosts]

    def text(report: object) -> str:
        seen.append(("render", gc.isenabled()))
        return "report"

    monkeypatch.setattr(session, "gather_ssh", gather)
    monkeypatch.setattr(session, "nodes_text", text)
    options = session.NodesStacksOptions(("n1", "n2"), "x", None, 2, 0.1, False, SshOptions(), None)
    assert gc.isenabled()
    assert session.stacks_across_nodes(options) == 0
    assert seen == [("gather", False), ("render", False)]
    assert gc.isenabled()
    assert capsys.readouterr().out == "report\n"
