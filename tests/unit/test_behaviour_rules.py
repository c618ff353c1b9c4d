"""The behaviour rules on hand-built model objects: code in place, the spin discount, the first fault in
time, requests waiting while serving, probe echoes by timing, the structure when no frame names a wait."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from dataclasses import replace

from hangwatch import engines
from hangwatch.analyse import causes
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import Policy
from hangwatch.analyse.assess import watch_policy
from hangwatch.analyse.echoes import ProbeEchoes
from hangwatch.analyse.progress import ProgressClock
from hangwatch.analyse.progress import ProgressSignal
from hangwatch.analyse.progress import progress_signals
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackmotion import in_place
from hangwatch.analyse.stackrules import classify
from hangwatch.collect.connections import ConnectionWatcher
from hangwatch.collect.connections import connection_of
from hangwatch.model.samples import ConnectionSample
from hangwatch.model.samples import ExitHow
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import OwnRequest
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import ProcState
from hangwatch.model.samples import ServerConnection
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.vocabulary import CLI_WORDS
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State


def py(name: str, line: int, file: str = "work.py") -> Frame:
    return Frame(name, file, line)


def native(name: str, lib: str = "libwork.so") -> Frame:
    return Frame(name, lib, 0, native=True)


def thread(*frames: Frame, active: bool = True, tid: int = 1) -> ThreadStack:
    return ThreadStack(tid, "MainThread", active, False, tuple(frames))


# -- code in place ---------------------------------------------------------------------------------


def test_a_poll_loop_is_in_place_wherever_it_is_caught():
    loop = (py("main", 10), py("rank", 20))
    caught = [
        thread(*loop, py("poll", 5)),
        thread(*loop, py("poll", 6), py("ready", 40)),  # inside its helper
        thread(*loop, py("poll", 5)),
    ]
    assert in_place(caught)


def test_work_moves_below_the_loop_frame():
    loop = (py("main", 10), py("compile", 20))
    caught = [
        thread(*loop, py("visit", 3), py("visit_BinOp", 8), py("visit", 3), py("fold", 9)),
        thread(*loop, py("emit", 30)),
        thread(*loop, py("visit", 3), py("visit_Call", 12), py("visit", 3)),
    ]
    assert not in_place(caught)


def _descent(depth: int, *leaf: Frame, fn: str = "build", line: int = 152) -> ThreadStack:
    """tests/programs/_util.py's compile_like as py-spy caught it: a recursion, every call on one line."""
    return thread(py("<module>", 1), py("compile_like", 162), *[py(fn, line)] * depth, *leaf)


def test_a_recursion_caught_at_other_depths_moves():
    # Three real captures of compile_like (2026-12-04) that the poll-loop rule took for one place: the
    # same function below the common path is the descent at another depth (CI: a false stall, 7 s).
    caught = [
        _descent(5, py("build", 151), py("Random.randint", 362, "random.py")),
        _descent(6, py("Random.choice", 374, "random.py")),
        _descent(5, py("build", 150), py("Random.random", 0, "random.py")),
    ]
    assert not in_place(caught)


def test_a_recursion_found_twice_at_one_depth_and_once_a_helper_below_is_not_in_place():
    # The real triple left after the first rule: 12 builds, 12 builds and a helper, 12 builds again.
    caught = [_descent(12), _descent(12, py("Random.choice", 374, "random.py")), _descent(12)]
    assert not in_place(caught)


def test_a_spin_inside_a_recursion_at_one_depth_is_in_place():
    caught = [_descent(4, fn="visit", line=30)] * 3
    assert in_place(caught)


def test_the_caller_moving_on_is_not_in_place():
    assert not in_place([thread(py("main", 10), py("step", 5)), thread(py("main", 11), py("step", 5))])


def test_a_long_native_call_whose_inner_code_moves_is_work():
    top = (py("main", 10), py("forward", 42))
    a = thread(*top, native("at::native::mm"), native("gemm_driver"), native("kernel_a"))
    b = thread(*top, native("at::native::mm"), native("gemm_driver"), native("pack_b"))
    assert not in_place([a, b], native=[a, b])


def test_two_calls_of_a_poll_loop_part_at_the_leaf_and_a_gemms_kernels_are_work_there_too():
    from hangwatch.analyse.stackmotion import apart_at_the_leaf

    top = (py("all_reduce", 10, "parallel_state.py"), py("OpOverload.__call__", 841, "torch/_ops.py"))
    loop = (native("shm_cc_loop"), native("wait_for_all"), native("wait_for_one"))
    a = thread(*top, *loop, native("get_curr_stamp"))
    b = thread(*top, *loop, native("get_ready_stamp"))
    assert not in_place([a, b], native=[a, b]) and apart_at_the_leaf([a, b], native=[a, b])
    moved = thread(py("all_reduce", 11, "parallel_state.py"), *top[1:], *loop, native("get_ready_stamp"))
    assert not apart_at_the_leaf([a, moved], native=[a, moved])  # the caller moved on
    gemm = (py("main", 10), py("forward", 42), native("at::native::mm"), native("gemm_driver"))
    k1, k2 = thread(*gemm, native("kernel_a")), thread(*gemm, native("kernel_b"))
    assert not apart_at_the_leaf([k1, k2], native=[k1, k2])  # a compute library: work


def test_a_c_poll_loop_is_in_place_inside_or_outside_its_syscall():
    top = (py("main", 10), py("poll_flag_native", 40))
    a = thread(*top, native("ffi_call"), native("__memcmp_avx2", "libc.so.6"))
    b = thread(*top)
    c = thread(*top, native("ffi_call"), native("sched_yield", "libc.so.6"))
    assert in_place([a, b, c], native=[a, b, c])


# -- the spin discount -----------------------------------------------------------------------------


def test_cpu_of_a_spinning_process_is_discounted_back_to_when_the_spin_began():
    clock = ProgressClock()
    clock.observe(5.0, (ProgressSignal("log", None, "12 lines"),))
    for t in range(6, 30):
        clock.observe(float(t), (ProgressSignal("cpu", 7, "CPU 100%"),))
    assert clock.last_progress() == 29.0
    assert clock.last_progress({7: 5.0}) == 5.0  # the spin began with the quiet spell
    assert clock.last_progress({8: 5.0}) == 29.0  # another process's spin says nothing of pid 7
    assert clock.last_progress(weak=False) == 5.0


# -- the first fault in time -----------------------------------------------------------------------


def exit_(pid: int, t: float, *, sig: int | None = None, code: int | None = None, **kw: object) -> ExitRecord:
    how = kw.pop("how", ExitHow.ZOMBIE_STAT)
    name, rank, wchar = kw.pop("name", f"p{pid}"), kw.pop("rank", None), kw.pop("wchar_at_end", None)
    return ExitRecord(t, pid, name, None, rank, how, code, sig, 30.0, wchar_at_end=wchar)  # type: ignore[arg-type]


def exc(t: float, line: str, pid: int | None = None, rank: str | None = None) -> LogFinding:
    return LogFinding(t, Cause.EXCEPTION, line, pid, rank)


def test_a_bind_refused_on_a_port_the_tree_itself_listens_on_names_the_holder():
    line = "[2026-12-04 14:48:54] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 33105)"
    refused = LogFinding(5.0, Cause.PORT_IN_USE, line)
    holder = replace(proc(7), name="sglang::scheduler", listening_ports=(27697, 33105))
    window = [Tick(t, (proc(1), holder)) for t in (4.0, 5.0)]
    stalled = causes.diagnose_stall(window, [refused])
    assert (
        stalled.cause is Cause.PORT_IN_USE
        and "port 33105 is held by sglang::scheduler[7]" in stalled.explanation
    )
    crashed = causes.diagnose_crash([exit_(1, 6.0, code=1)], [refused], root_pids={1}, window=window)
    assert (
        crashed.cause is Cause.PORT_IN_USE and "sglang::scheduler[7] of this very tree" in crashed.explanation
    )
    # Held outside the tree (a previous server): nothing inside is named, the timestamp's numbers neither.
    elsewhere = [Tick(t, (proc(1), replace(holder, listening_ports=(27697,)))) for t in (4.0, 5.0)]
    assert "this very tree" not in causes.diagnose_stall(elsewhere, [refused]).explanation
    assert causes.port_held_by_tree(line, [Tick(5.0, (replace(holder, listening_ports=(48, 54)),))]) is None


def test_a_kill_before_the_exceptions_is_the_cause():
    failures = [exit_(20, 10.40, sig=signal.SIGKILL, rank="TP1"), exit_(10, 11.2, code=1)]
    findings = [exc(10.52, "RuntimeError: Engine core initialization failed. See root cause above.", pid=10)]
    d = causes.diagnose_crash(failures, findings, root_pids={1})
    assert d.cause is Cause.DEAD_PEER and d.culprits == (20,)
    assert "consequence" in d.explanation and "Engine core initialization failed" in d.explanation


def test_an_exception_before_the_tear_down_is_the_cause():
    failures = [
        exit_(21, 7.31, sig=signal.SIGKILL),
        exit_(22, 7.31, sig=signal.SIGKILL),
        exit_(1, 7.33, sig=9),
    ]
    findings = [
        exc(7.20, "[TP1] Scheduler hit an exception: Traceback", rank="TP1"),
        exc(7.21, "[TP1] ValueError: bad"),
    ]
    exits = [exit_(23, 7.25, code=1, rank="TP1")]
    d = causes.diagnose_crash(failures, findings, root_pids={1}, exits=exits)
    assert d.cause is Cause.EXCEPTION and d.culprits == (23,)
    assert "ValueError: bad" in d.explanation and "torn down" in d.explanation


def test_a_quiet_kill_does_not_invent_peers_failing_after_it():
    d = causes.diagnose_crash([exit_(30, 4.0, sig=signal.SIGKILL)], [], root_pids={1})
    assert d.cause is Cause.DEAD_PEER and "the rest of the tree waits for it" in d.explanation
    assert "after it" not in d.explanation


def test_the_command_itself_killed_leaves_its_tree_without_it():
    """vllm-tp2-api-serving-sigkill-run (2026-12-02): the API server, the command hangwatch ran, SIGKILLed
    while serving; its engine core and workers still run at the verdict. Alone, it is a kill, no more."""
    d = causes.diagnose_crash([exit_(1, 94.9, sig=signal.SIGKILL)], [], root_pids={1}, survivors=3)
    assert d.cause is Cause.DEAD_PEER and d.culprits == (1,)
    assert "3 processes of its tree left running without it" in d.explanation
    alone = causes.diagnose_crash([exit_(1, 94.9, sig=signal.SIGKILL)], [], root_pids={1})
    assert alone.cause is Cause.UNKNOWN and alone.culprits == (1,)


def test_a_rank_reaped_unseen_before_the_first_failure_is_where_it_began():
    unseen = exit_(40, 3.0, how=ExitHow.VANISHED, rank="TP1")
    failures = [exit_(10, 3.6, code=1)]
    findings = [exc(3.4, "RuntimeError: Worker proc died", pid=10)]
    d = causes.diagnose_crash(failures, findings, root_pids={1}, exits=[unseen])
    assert d.cause is Cause.DEAD_PEER and d.culprits == (40,)
    assert "reaped it before its exit status could be read" in d.explanation


# -- requests waiting while serving ----------------------------------------------------------------


def _info(sent_ms: int, recv_ms: int, acked: int, received: int) -> bytes:
    info = bytearray(136)
    info[44:48] = sent_ms.to_bytes(4, "little")
    info[52:56] = recv_ms.to_bytes(4, "little")
    info[120:128] = acked.to_bytes(8, "little")
    info[128:136] = received.to_bytes(8, "little")
    return bytes(info)


def test_a_connection_whose_last_word_was_the_clients_waits_for_an_answer():
    waiting = connection_of(8000, 50001, _info(sent_ms=9000, recv_ms=3000, acked=0, received=240), False)
    answered = connection_of(8000, 50002, _info(sent_ms=100, recv_ms=3000, acked=900, received=240), False)
    idle = connection_of(8000, 50003, _info(sent_ms=100, recv_ms=200, acked=0, received=0), False)
    assert waiting.unanswered_s == 3.0
    assert answered.unanswered_s is None and idle.unanswered_s is None


def _serving_assessor(stall: float = 8.0) -> Assessor:
    a = Assessor(engines.by_name("vllm"), Policy(stall_after_s=stall), root_pids={1})
    green = ProbeResult(0.0, "http://127.0.0.1:8000/health", ProbeOutcome.HTTP, 200)
    assert a.observe(Tick(0.0, (proc(1),), probes=(green,))) is not None  # ready
    return a


def proc(pid: int, cpu: float = 0.0) -> ProcessSample:
    return ProcessSample(pid, 0, f"p{pid}", ("x",), "S", 10.0, cpu, 0, 0, 0, 4, 1 << 20, (8000,), None, None)


def test_clients_waiting_and_nothing_moving_is_a_wedge_while_serving():
    a = _serving_assessor()
    conn = ConnectionSample((8000,), (ServerConnection(8000, 50001, 240, 0, 1.0),))
    verdict = None
    t = 1.0
    while verdict is None and t < 30:
        verdict = a.observe(Tick(t, (proc(1),), connections=conn))
        t += 1.0
    assert verdict is not None and verdict.state is State.STALLED
    assert verdict.summary.startswith("stalled while serving")
    assert any("client connection" in e for e in verdict.evidence)
    assert t - 1.0 <= 1.0 + 8.0 + 1.0  # from the first tick that saw them waiting


def test_an_idle_server_with_clients_connected_but_answered_is_healthy():
    a = _serving_assessor()
    conn = ConnectionSample((8000,), (ServerConnection(8000, 50001, 240, 900, None),))
    assert all(a.observe(Tick(float(t), (proc(1),), connections=conn)) is None for t in range(1, 40))


def test_our_own_request_pending_counts_as_waiting():
    a = _serving_assessor()
    own = OwnRequest(1.0, "http://127.0.0.1:8000/v1/completions")
    verdict = None
    t = 1.0
    while verdict is None and t < 30:
        verdict = a.observe(Tick(t, (proc(1),), own_request=own))
        t += 1.0
    assert verdict is not None and any("pending" in e for e in verdict.evidence)


# -- probe echoes by timing ------------------------------------------------------------------------


def test_a_probe_that_timed_out_while_our_capture_paused_the_server_does_not_recover_into_progress():
    """vllm-tp2-TP1-serving-spin-run (2026-12-04): a native capture round of 10.4 s paused the API server
    for 5 s, the /health probe sent in it timed out, the next answered 200: not progress."""
    from hangwatch.analyse.stackwatch import StackHistory

    a = _serving_assessor()
    a.stacks = StackHistory()
    a.stacks.add(StackSample(3.0, (), 10.4))  # a round from 3.0 to 13.4
    timeout = ProbeResult(6.2, "http://127.0.0.1:8000/health", ProbeOutcome.TIMEOUT, None, "no answer", 2.0)
    green = ProbeResult(8.2, "http://127.0.0.1:8000/health", ProbeOutcome.HTTP, 200, None, 0.2)
    assert a._paused_by_capture(timeout) and not a._paused_by_capture(green)
    assert not progress_signals(
        Tick(5.0, (proc(1),)),
        Tick(13.5, (proc(1),), probes=(timeout, green)),
        None,
        serving=True,
        paused=a._paused_by_capture,
    )
    # The same failure away from any capture, then the server answering again: that is news.
    later = replace(timeout, t=20.0)
    assert not a._paused_by_capture(later)
    kinds = [
        s.kind
        for s in progress_signals(
            Tick(19.0, (proc(1),)),
            Tick(23.0, (proc(1),), probes=(later, replace(green, t=22.0))),
            None,
            serving=True,
            paused=a._paused_by_capture,
        )
    ]
    assert kinds == ["probe"], kinds


def test_a_line_at_a_slow_probe_answer_is_an_echo_and_news_away_from_probes_is_not():
    echoes = ProbeEchoes()
    echoes.observe_probes([ProbeResult(10.0, "u", ProbeOutcome.HTTP, 503, elapsed_s=20.0)])
    line = "Health check failed. Server couldn't get a response from detokenizer for last 20 seconds."
    assert echoes.is_echo(line, 30.05)
    assert not echoes.is_echo("Decode batch. #running-req: 3", 25.0)


def test_after_quick_probes_a_kind_of_line_is_an_echo_from_its_second_time():
    echoes = ProbeEchoes()
    for t in range(5):
        echoes.observe_probes([ProbeResult(float(t), "u", ProbeOutcome.HTTP, 200, elapsed_s=0.002)])
    assert not echoes.is_echo("Load weight end. elapsed=0.02 s", 1.01)  # once, by chance: progress
    assert echoes.is_echo("probe-ish line 3", 2.01) is False
    assert echoes.is_echo("probe-ish line 4", 3.01)  # the same kind, again at an answer
    assert not echoes.is_echo("probe-ish line 9", 3.7)  # seen away from a probe: news for good
    assert not echoes.is_echo("probe-ish line 10", 4.01)


# -- the structure, when no frame names the wait ---------------------------------------------------


def _sample(t: float, *procs: tuple[int, str, ThreadStack, float]) -> StackSample:
    return StackSample(
        t,
        tuple(
            ProcessStacks(pid, title, "Worker", title.rsplit("_", 1)[-1], DumpOutcome.OK, (th,), "S", cpu)
            for pid, title, th, cpu in procs
        ),
        0.1,
    )


def test_with_no_majority_the_rank_whose_log_stopped_earlier_is_the_odd_one_out():
    a = thread(py("main", 1), py("wait_until_ready", 30, "executor.py"), active=False)
    b = thread(
        py("main", 1),
        py("load_weights", 80, "loader.py"),
        py("Event.wait", 600, "threading.py"),
        active=False,
    )
    samples = [_sample(t, (10, "W_TP0", a, 5.0), (11, "W_TP1", b, 5.0)) for t in (3.0, 5.0, 7.0)]
    ctx = stack_context(samples)
    assert classify(ctx).culprits == ()  # nothing to tell them apart
    from dataclasses import replace

    d = classify(replace(ctx, laggards=(11,)))
    assert d.culprits == (11,) and "odd one out" in d.explanation


def test_with_no_majority_a_rank_spinning_in_place_while_its_peer_waits_for_messages_is_the_culprit():
    """vllm-tp2-TP1-kv_alloc-spin-run (2026-12-02): TP1 busy in a loop of its own, TP0 done with its KV
    cache and polling its ZeroMQ sockets for the next command. The spinner is not waiting for the poller."""
    spin = thread(
        py("initialize_kv_cache", 40, "cpu_model_runner.py"), py("fire", 90, "faults.py"), active=True
    )
    poll = thread(
        py("worker_busy_loop", 5, "multiproc_executor.py"),
        py("poll", 106, "zmq/sugar/poll.py"),
        native("poll"),
        active=False,
    )
    samples = [_sample(t, (10, "W_TP0", poll, 5.0), (11, "W_TP1", spin, 5.0 + t)) for t in (3.0, 5.0, 7.0)]
    d = classify(stack_context(samples))
    assert d.culprits == (11,) and "spins in place" in d.explanation, d
    # The same spinner against a peer stuck outside any receive (a Python Event): the spinner spin-waits
    # for it, as rank 0 does in a collective its peer never joins.
    stuck = thread(py("load_weights", 80, "loader.py"), py("Event.wait", 600, "threading.py"), active=False)
    samples = [_sample(t, (10, "W_TP0", stuck, 5.0), (11, "W_TP1", spin, 5.0 + t)) for t in (3.0, 5.0, 7.0)]
    d = classify(stack_context(samples))
    assert d.culprits == (10,) and "odd one out" in d.explanation, d


def test_ranks_waiting_alike_for_their_stuck_driver_name_the_driver():
    rank = thread(py("worker_busy_loop", 5, "executor.py"), py("acquire_read", 40, "mq.py"), active=False)
    core = thread(
        py("run", 3, "core.py"),
        py("initialize", 70, "core.py"),
        py("Event.wait", 600, "threading.py"),
        active=False,
    )
    samples = [
        StackSample(
            t,
            (
                ProcessStacks(5, "Core", "EngineCore", None, DumpOutcome.OK, (core,), "S", 1.0),
                ProcessStacks(10, "W_TP0", "Worker", "TP0", DumpOutcome.OK, (rank,), "S", 1.0),
                ProcessStacks(11, "W_TP1", "Worker", "TP1", DumpOutcome.OK, (rank,), "S", 1.0),
            ),
            0.1,
        )
        for t in (3.0, 5.0, 7.0)
    ]
    window = [Tick(7.0, (proc_with_parent(5, 1), proc_with_parent(10, 5), proc_with_parent(11, 5)))]
    d = classify(stack_context(samples, window))
    assert d.culprits == (5,) and "drives them" in d.explanation


def proc_with_parent(pid: int, ppid: int) -> ProcessSample:
    return ProcessSample(pid, ppid, f"p{pid}", ("x",), "S", 10.0, 0.0, 0, 0, 0, 4, 1 << 20, (), None, None)


def test_a_process_py_spy_cannot_read_is_shown_where_the_kernel_has_it(tmp_path):
    from hangwatch.collect.stacks import kernel_wait

    proc = tmp_path / "77"
    proc.mkdir()
    (proc / "wchan").write_text("futex_wait_queue")
    (proc / "stack").write_text(
        "[<0>] futex_wait_queue+0x60/0x90\n[<0>] futex_wait+0x177/0x270\n[<0>] do_futex+0x11b/0x1d0\n"
    )
    assert kernel_wait(77, tmp_path) == (
        "; in the kernel at futex_wait_queue, kernel stack futex_wait_queue < futex_wait < do_futex"
    )
    assert kernel_wait(78, tmp_path) == ""


def test_attach_to_a_serving_server_ends_healthy_at_the_end_of_its_window():
    a = Assessor(
        engines.by_name("vllm"),
        # The user's --timeout 3 < --window (analyse/assess.watch_policy: the timeout stays the user's).
        watch_policy(engines.by_name("vllm"), stall_after_s=30, timeout=3, window_s=10, words=CLI_WORDS),
        root_pids={1},
    )
    green = ProbeResult(0.0, "http://127.0.0.1:8000/health", ProbeOutcome.HTTP, 200)
    first = a.observe(Tick(0.0, (proc(1),), probes=(green,)))
    assert first is not None and first.state is State.READY
    later = [a.observe(Tick(float(t), (proc(1),))) for t in range(1, 11)]
    assert later[:-1] == [None] * 9  # serving: --timeout does not apply, the window does
    end = later[-1]
    assert end is not None and end.state is State.READY and "end of the 10 s --window" in end.summary
    assert a.window_over


def test_the_merged_headline_does_not_join_processes_whose_leaves_differ():
    from hangwatch.analyse.stacktree import equivalence_classes

    top = (py("main", 1), py("all_reduce", 40, "torch/distributed/distributed_c10d.py"))
    a = ProcessStacks(
        10, "r0", "rank", "0", DumpOutcome.OK, (thread(*top, native("c10d::Work::wait")),), "S", 1.0
    )
    b = ProcessStacks(
        11, "r1", "rank", "1", DumpOutcome.OK, (thread(*top, native("sched_yield", "libc.so.6")),), "S", 1.0
    )
    c = ProcessStacks(
        12, "r2", "rank", "2", DumpOutcome.OK, (thread(*top, native("c10d::Work::wait")),), "S", 1.0
    )
    classes = equivalence_classes([a, b, c])
    assert sorted(len(k.pids) for k in classes) == [1, 2]
    assert {k.where for k in classes} == {"all_reduce > c10d::Work::wait", "all_reduce > sched_yield"}


def test_an_exception_stamped_just_after_the_first_kill_of_a_tear_down_is_its_reason():
    kills = [
        exit_(21, 7.300, sig=signal.SIGKILL),
        exit_(22, 7.301, sig=signal.SIGKILL),
        exit_(1, 7.31, sig=9),
    ]
    findings = [exc(7.305, "[TP1] Scheduler hit an exception: Traceback", rank="TP1")]
    d = causes.diagnose_crash(
        kills, findings, root_pids={1}, exits=[exit_(23, 7.29, how=ExitHow.VANISHED, rank="TP1")]
    )
    assert d.cause is Cause.EXCEPTION, d


def test_an_untagged_exception_is_its_writers_whatever_order_the_tear_down_kills_in():
    """sglang-tp1-sched-weights-raise-run (2026-12-02): "Scheduler hit an exception" names no one; the
    launcher killed its resource tracker 15 ms later, the scheduler last. The zombies' wchar against the
    tick before the line says the scheduler wrote it."""
    kill = signal.SIGKILL
    deaths = [
        exit_(18476, 42.263, sig=kill, name="python", wchar_at_end=10_000),
        exit_(18427, 42.476, sig=kill, name="python", wchar_at_end=50_090),
        exit_(18478, 42.516, sig=kill, name="sglang::detokenizer", wchar_at_end=7_000),
        exit_(18477, 42.531, sig=kill, name="sglang::scheduler", wchar_at_end=904_100),
    ]
    before = {18476: 10_000, 18427: 50_000, 18478: 7_000, 18477: 900_000}

    def member(pid: int, wchar: int) -> ProcessSample:
        return ProcessSample(
            pid, 1, "p", (), ProcState.SLEEPING, 1.0, 0.0, 0, wchar, 0, 4, 1 << 20, (), None, None
        )

    window = [Tick(41.9, tuple(member(pid, w) for pid, w in before.items()))]
    findings = [
        exc(42.248, "[2026-12-02 13:43:46] Scheduler hit an exception: Traceback (most recent call last):")
    ]
    d = causes.diagnose_crash(deaths, findings, root_pids={18427}, exits=deaths, window=window)
    assert d.cause is Cause.EXCEPTION and d.culprits == (18477,), d
    # Without the bytes (the zombies reaped before they could be read), the first killed is not named.
    blind = [replace(e, wchar_at_end=None) for e in deaths]
    d = causes.diagnose_crash(blind, findings, root_pids={18427}, exits=blind, window=window)
    assert d.cause is Cause.EXCEPTION and d.culprits == (), d
    # Two members writing as much say nothing either: no one is named rather than a guess.
    even = [replace(e, wchar_at_end=before[e.pid] + 4100) for e in deaths]
    d = causes.diagnose_crash(even, findings, root_pids={18427}, exits=even, window=window)
    assert d.culprits == (), d


def test_children_killed_together_by_the_process_that_then_logs_the_exception_are_its_tear_down():
    """vllm-tp2-core-weights-raise-run (2026-12-02): the engine core raised, SIGTERMed both its workers
    (12 ms apart) and logged the traceback 67 ms after the first death."""
    term = signal.SIGTERM
    deaths = [exit_(27241, 38.475, sig=term), exit_(27240, 38.487, sig=term)]
    core_exit = exit_(27211, 42.143, code=1, name="VLLM::EngineCore")
    findings = [
        exc(
            38.554,
            "(EngineCore pid=27211) ERROR [core.py:1510] Traceback (most recent call last):",
            pid=27211,
        )
    ]

    def member(pid: int, ppid: int) -> ProcessSample:
        return ProcessSample(
            pid, ppid, "p", (), ProcState.SLEEPING, 1.0, 0.0, 0, 0, 0, 4, 1 << 20, (), None, None
        )

    window = [
        Tick(38.0, (member(27172, 1), member(27211, 27172), member(27240, 27211), member(27241, 27211)))
    ]
    d = causes.diagnose_crash([*deaths, core_exit], findings, root_pids={27172}, window=window)
    assert d.cause is Cause.EXCEPTION and d.culprits == (27211,), d
    # One worker killed alone, its parent logging the consequence: still the death's fault.
    alone = causes.diagnose_crash([deaths[0], core_exit], findings, root_pids={27172}, window=window)
    assert alone.cause is Cause.DEAD_PEER and alone.culprits == (27241,), alone
    # Killed together, but the writer is a peer, not their parent: it saw the deaths, it did not cause them.
    peer = [exc(38.554, "(Worker pid=27300) ERROR Traceback (most recent call last):", pid=27300)]
    d = causes.diagnose_crash([*deaths, core_exit], peer, root_pids={27172}, window=window)
    assert d.cause is Cause.DEAD_PEER, d


def test_a_peers_exception_just_before_a_lone_ranks_death_notice_is_the_peer_noticing_it():
    """vllm-tp2-TP0-serving-sigkill-run (2026-12-02): TP1 logged "Connection reset by peer" 78 ms before
    TP0's end was noticed (its parent reaped it: vanished); TP1 lived 5 s more, then the tree ended."""
    tp0 = exit_(8380, 90.756, how=ExitHow.VANISHED, rank="TP0")
    tp1 = exit_(8381, 95.911, sig=signal.SIGTERM, rank="TP1")
    findings = [
        exc(
            90.678,
            "(Worker_TP1 pid=8381) ERROR RuntimeError: ... Connection reset by peer.",
            pid=8381,
            rank="TP1",
        )
    ]
    d = causes.diagnose_crash([tp0, tp1], findings, root_pids={1})
    assert d.cause is Cause.DEAD_PEER and d.culprits[:1] == (8380,), d
    # The same exception 0.5 s before: it came first, whoever died after it.
    early = [replace(findings[0], t=90.2)]
    d = causes.diagnose_crash([tp0, tp1], early, root_pids={1})
    assert d.cause is Cause.EXCEPTION and d.culprits == (8381,), d
    # The writer dying with the first (a tear-down of both): the exception is the fault.
    both = [tp0, replace(tp1, t=90.80)]
    d = causes.diagnose_crash(both, findings, root_pids={1})
    assert d.cause is Cause.EXCEPTION, d


def test_an_exception_57_ms_after_a_lone_kill_is_its_consequence():
    """sglang-tp2-TP1-weights-sigkill-attach (2026-12-02): TP1 SIGKILLed, its child 11 ms later, TP0's
    barrier failed 57 ms after the kill and TP0 raised; its launcher then killed the rest."""
    deaths = [
        exit_(31, 14.948, sig=signal.SIGKILL, rank="TP1"),
        exit_(32, 14.959, sig=signal.SIGKILL),
        exit_(30, 15.017, sig=signal.SIGKILL, rank="TP0"),
        exit_(33, 15.030, sig=signal.SIGKILL),
        exit_(1, 15.043, sig=signal.SIGKILL),
    ]
    findings = [exc(15.005, "[TP0] Scheduler hit an exception: Traceback", rank="TP0")]
    d = causes.diagnose_crash(deaths, findings, root_pids={1})
    assert d.cause is Cause.DEAD_PEER and d.culprits[:1] == (31,), d
    # The same run where TP1's exit took long: its death noticed 8 ms *after* TP0's exception.
    late = [
        replace(deaths[0], t=49.861),
        replace(deaths[1], t=49.861),
        *(replace(e, t=e.t + 35.0) for e in deaths[2:]),
    ]
    d = causes.diagnose_crash(late, [replace(findings[0], t=49.853)], root_pids={1})
    assert d.cause is Cause.DEAD_PEER and d.culprits[:1] == (31,), d


def test_a_launcher_tear_down_after_a_ranks_exception_starts_with_a_helper_not_a_rank():
    """sglang-tp2-TP1-weights-raise-run: TP1 raised, its launcher killed the tree: the resource tracker
    died 19 ms after the exception, the ranks 0.4 s later. The exception is the cause."""
    deaths = [
        exit_(36, 64.621, sig=signal.SIGKILL),
        exit_(39, 64.974, sig=signal.SIGKILL, name="sglang::detokenizer"),
        exit_(37, 65.017, sig=signal.SIGKILL, rank="TP0"),
        exit_(38, 65.024, sig=signal.SIGKILL, rank="TP1"),
        exit_(1, 65.029, sig=signal.SIGKILL),
    ]
    findings = [exc(64.602, "[TP1] Scheduler hit an exception: Traceback", rank="TP1")]
    d = causes.diagnose_crash(deaths, findings, root_pids={1})
    assert d.cause is Cause.EXCEPTION and d.culprits == (38,), d


def test_repeated_identical_lines_are_not_progress_and_new_counts_are_weak_evidence():
    from hangwatch.analyse.logscan import LogScanner

    scanner = LogScanner(engines.by_name("vllm"))
    stats = "(APIServer pid=9) INFO 12-01 22:25:{:02d} [loggers.py:123] Avg prompt throughput: 0.0 tokens/s, Running: 3 reqs"
    first = scanner.scan((stats.format(1),), 100, 1.0)
    again = scanner.scan((stats.format(11),), 100, 11.0)
    moved = scanner.scan((stats.format(21).replace("0.0 tokens", "12.5 tokens"),), 100, 21.0)
    assert first.progress_lines == 1 and again.progress_lines == 0 and again.heartbeat_lines == 0
    # The same words with other counts: a heartbeat, weak evidence of the writer the line names.
    assert moved.progress_lines == 0 and moved.heartbeat_lines == 1 and moved.heartbeat_pids == (9,)


def test_a_retry_loops_counts_are_a_heartbeat_and_a_progress_bars_advance_is_progress():
    from hangwatch.analyse.logscan import LogScanner

    scanner = LogScanner(engines.by_name("generic"))
    retry = "[rank 1] still waiting for 127.0.0.1:9 (attempt {n}, waited {s} s)"
    lines = [scanner.scan((retry.format(n=n, s=2 * n),), 60, float(n)) for n in (1, 2, 3)]
    assert [(x.progress_lines, x.heartbeat_lines) for x in lines] == [(1, 0), (0, 1), (0, 1)]
    bar = "Loading safetensors checkpoint shards: {p}% Completed | {k}/4 [00:{s:02d}<00:10, 2.0s/it]"
    shards = [
        scanner.scan((bar.format(p=25 * k, k=k, s=s),), 80, 10.0 + s)
        for k, s in ((1, 2), (2, 4), (2, 5), (3, 6))
    ]
    # The fraction grows: progress; the same fraction again, a second later (a redraw): a heartbeat.
    assert [(x.progress_lines, x.heartbeat_lines) for x in shards] == [(1, 0), (1, 0), (0, 1), (1, 0)]
    # Torch's store barrier says it every 10 s with a new elapsed time.
    barrier = (
        "Waiting in store based barrier to initialize process group for rank: 0, key: "
        "store_based_barrier_key:1 (world_size=2, num_workers_joined=1, timeout=0:30:00, elapsed=0:00:{e}.01)"
    )
    beats = [scanner.scan((barrier.format(e=e),), 150, 30.0 + e) for e in (10, 20, 30)]
    assert [x.heartbeat_lines for x in beats] == [0, 1, 1]


def test_ranks_saying_the_same_thing_in_one_output_are_news_each_not_one_writer_saying_it_again():
    """H200, 2026-12-04 (scripts/gpu/gpu_waits.py ipc): both ranks print "rank N: flags shared through CUDA
    IPC" into one pipe; rank 1's line was taken for rank 0's said again, and the evidence called it a
    'still waiting' line. The rank a line opens with names its writer, as vLLM's pid and SGLang's tag do."""
    from hangwatch.analyse.logscan import LogScanner

    scanner = LogScanner(engines.by_name("generic"))
    for opening in ("rank {r}: flags shared through CUDA IPC", "[rank{r}]: loaded shard", "[Rank {r}] ready"):
        said = [scanner.scan((opening.format(r=r),), 40, 1.0 + r) for r in range(4)]
        assert [(x.progress_lines, x.heartbeat_lines) for x in said] == [(1, 0)] * 4, opening
    # The same rank saying it again with another count is still a heartbeat.
    retry = [scanner.scan((f"rank 2: still waiting (attempt {n})",), 40, 10.0 + n) for n in (1, 2)]
    assert [x.heartbeat_lines for x in retry] == [0, 1]


def test_resident_memory_growing_is_progress_even_with_the_stack_in_place():

    before = ProcessSample(5, 1, "w", ("w",), "R", 10.0, 1.0, 0, 0, 0, 4, 1 << 30, (), None, None)
    after = ProcessSample(
        5, 1, "w", ("w",), "R", 11.0, 1.0, 0, 0, 0, 4, (1 << 30) + (512 << 20), (), None, None
    )
    kinds = {
        s.kind
        for s in progress_signals(Tick(0.0, (before,)), Tick(1.0, (after,)), None, spinning=lambda pid: True)
    }
    assert kinds == {"memory"}  # the CPU is vetoed (a spin), the filling memory is not


def test_a_rank_waiting_in_an_op_call_of_a_compiled_graph_waits_in_a_collective_not_a_compile():
    from hangwatch.analyse.stackwaits import Wait
    from hangwatch.analyse.stackwaits import classify_thread

    compiled = (
        py("profile_run", 10, "vllm/v1/worker/gpu_model_runner.py"),
        py("_support_torch_compile.<locals>.__call__", 703, "vllm/compilation/decorators.py"),
        py("Runner.call", 50, "/tmp/torchinductor_root/ab/cab.py"),
        py("OpOverload.__call__", 841, "torch/_ops.py"),
    )
    assert classify_thread(thread(*compiled, active=False))[0] is Wait.COLLECTIVE
    assert classify_thread(thread(*compiled, active=True))[0] is not Wait.COMPILE  # running, not compiling
    tracing = (
        *compiled[:2],
        py("compile_fx", 200, "torch/_inductor/compile_fx.py"),
        py("codegen", 5, "torch/_inductor/graph.py"),
    )
    assert classify_thread(thread(*tracing, active=False))[0] is Wait.COMPILE


def test_a_scheduler_stuck_outside_any_receive_is_what_the_others_wait_for():
    sched = thread(
        py("event_loop", 9, "scheduler.py"),
        py("forward", 77, "tp_worker.py"),
        py("Event.wait", 600, "threading.py"),
        active=False,
    )
    detok = thread(
        py("event_loop", 5, "detokenizer.py"), py("Socket.recv_pyobj", 3, "zmq/sugar/socket.py"), active=False
    )
    launcher = thread(py("run", 1, "uvicorn/server.py"), py("select", 4, "selectors.py"), active=False)
    samples = [
        StackSample(
            t,
            (
                ProcessStacks(1, "launcher", None, None, DumpOutcome.OK, (launcher,), "S", 1.0),
                ProcessStacks(2, "sglang::scheduler", "scheduler", None, DumpOutcome.OK, (sched,), "S", 1.0),
                ProcessStacks(
                    3, "sglang::detokenizer", "detokenizer", None, DumpOutcome.OK, (detok,), "S", 1.0
                ),
            ),
            0.1,
        )
        for t in (3.0, 5.0, 7.0)
    ]
    d = classify(stack_context(samples))
    assert d.culprits == (2,) and "stuck in" in d.explanation, d


def test_a_rank_reaped_unseen_before_the_exceptions_its_death_caused_is_the_cause():
    """vLLM: TP1 SIGKILLed and reaped at once (21.0 s); the engine core logs 'Engine core initialization
    failed' (21.3 s), kills TP0 (30.2 s) and exits 1 (32.4 s)."""
    unseen = exit_(98, 21.0, how=ExitHow.VANISHED, rank="TP1")
    failures = [exit_(97, 30.2, sig=signal.SIGKILL, rank="TP0"), exit_(28, 32.4, code=1)]
    findings = [exc(21.3, "RuntimeError: Engine core initialization failed. See root cause above.", pid=28)]
    d = causes.diagnose_crash(failures, findings, root_pids={1}, exits=[unseen])
    assert d.cause is Cause.DEAD_PEER and d.culprits == (98,), d


def test_requests_waiting_on_a_stopped_member_are_a_wedge_without_waiting_out_the_window():
    """vllm-tp2-*-serving-sigstop-run (2026-12-02): stalled/stopped at 32 s of a 30 s window; a stopped
    member cannot resume by itself, so with requests waiting the verdict comes as before ready."""
    a = _serving_assessor(stall=30.0)
    conn = ConnectionSample((8000,), (ServerConnection(8000, 50001, 240, 0, 1.0),))
    stopped = replace(proc(2), state=ProcState.STOPPED)
    verdict, t = None, 1.0
    while verdict is None and t < 40:
        verdict = a.observe(Tick(t, (proc(1), stopped), connections=conn))
        t += 1.0
    assert verdict is not None and verdict.state is State.STALLED and verdict.cause is Cause.STOPPED, verdict
    assert verdict.summary.startswith("stalled while serving")
    assert t - 1.0 <= 1.0 + 10.0 + 1.0, t


def test_an_idle_server_with_a_stopped_member_is_said_only_once_someone_asks_it():
    a = _serving_assessor(stall=30.0)
    stopped = replace(proc(2), state=ProcState.STOPPED)
    assert all(a.observe(Tick(float(t), (proc(1), stopped))) is None for t in range(1, 40))


def test_a_connection_from_a_process_of_the_tree_is_not_a_client_waiting():
    """An idle SGLang TP=2: TP1's connection to TP0's TCPStore port, whose last word was TP1's, read as a
    request waiting for minutes. A real child process plays the rank that connected and spoke last."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = (
        "import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1]))); "
        "s.sendall(b'x' * 64); print('sent', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        accepted, _ = server.accept()
        with accepted:
            assert child.stdout is not None and child.stdout.readline() == "sent\n"
            assert accepted.recv(64)  # the server read the request and never answers it
            watcher = ConnectionWatcher()
            outside = watcher.read([port])
            inside = watcher.read([port], [child.pid])
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)
        server.close()
    assert outside is not None and len(outside.unanswered) == 1  # a client's request, for all we knew
    assert inside is not None and inside.unanswered == () and inside.theirs == ()
    assert [c.internal for c in inside.connections] == [True]


def _ranked(pid: int, rank: str | None, cpu: float = 0.5) -> ProcessSample:
    return replace(proc(pid, cpu), rank=rank, role="Worker" if rank else None)


def _run_after_a_rank_dies(replacement: bool) -> tuple[object, float]:
    """TP0 SIGKILLed at 5 s; TP1 compiles on, a compiler helper starting every tick, log lines flowing
    (vllm-tp2-TP0-compile-sigkill-run); with ``replacement`` a new TP0 appears at 7 s."""
    from hangwatch.model.samples import LogSample

    a = Assessor(engines.by_name("vllm"), Policy(stall_after_s=30.0), root_pids={1})
    alive = [proc(1), _ranked(10, "TP0"), _ranked(11, "TP1")]
    for t in range(5):
        assert a.observe(Tick(float(t), tuple(alive), log=LogSample(new_lines=2))) is None
    death = (exit_(10, 5.0, sig=signal.SIGKILL, rank="TP0"),)
    verdict = None
    t = 5.0
    while verdict is None and t < 25:
        now = [proc(1), _ranked(11, "TP1"), _ranked(100 + int(t), None)]  # a new g++ each tick
        if replacement and t >= 7:
            now.append(_ranked(50, "TP0"))
        verdict = a.observe(Tick(t, tuple(now), exits=death if t == 5.0 else (), log=LogSample(new_lines=2)))
        t += 1.0
    return verdict, t


def test_a_dead_rank_stays_the_cause_while_the_others_work_on_and_helpers_start():
    verdict, t = _run_after_a_rank_dies(replacement=False)
    assert verdict is not None and verdict.state is State.CRASHED, verdict
    assert verdict.cause is Cause.DEAD_PEER and verdict.culprits == (10,), verdict
    assert t <= 5.0 + 7.0, t  # the grace after the death, not the engine's reaction seconds later


def test_a_dead_rank_replaced_by_a_new_process_of_its_rank_is_carried_on_from():
    verdict, _ = _run_after_a_rank_dies(replacement=True)
    assert verdict is None, verdict


def test_a_helper_carrying_its_ranks_rank_killed_while_the_tree_works_on_is_carried_on_from():
    # An Inductor compile worker inherits its rank's RANK; one ended by a signal while its rank compiles
    # on is the helper's end, not a rank's: the tree's progress since clears it, as any helper's.
    from hangwatch.model.samples import LogSample

    a = Assessor(engines.by_name("vllm"), Policy(stall_after_s=30.0), root_pids={1})
    helper = replace(_ranked(20, "TP0"), ppid=10)
    alive = [proc(1), _ranked(10, "TP0"), _ranked(11, "TP1"), helper]
    for t in range(5):
        assert a.observe(Tick(float(t), tuple(alive), log=LogSample(new_lines=2))) is None
    death = (exit_(20, 5.0, sig=signal.SIGTERM, rank="TP0"),)
    for t in range(5, 25):
        now = (proc(1), _ranked(10, "TP0"), _ranked(11, "TP1"), _ranked(100 + t, None))
        verdict = a.observe(Tick(float(t), now, exits=death if t == 5 else (), log=LogSample(new_lines=2)))
        assert verdict is None, verdict


def test_a_parked_writers_heartbeats_are_discounted_and_its_cpu_is_not():
    from hangwatch.analyse.progress import SignalKind

    clock = ProgressClock()
    clock.observe(10.0, (ProgressSignal(SignalKind.LOG, None, "news"),))
    for t in (14.0, 18.0, 22.0):
        clock.observe(t, (ProgressSignal(SignalKind.HEARTBEAT, 7, "attempt"),))
    assert clock.last_progress() == 22.0
    # Its code has stayed in place since 12 s: what it said again after that was a wait that logs.
    assert clock.last_progress(parked={7: 12.0}) == 12.0
    assert clock.last_progress(discount={7: 12.0}) == 22.0  # a spin's discount is for CPU, not lines
    assert clock.last_progress(weak=False) == 10.0
    clock.observe(24.0, (ProgressSignal(SignalKind.HEARTBEAT, None, "attempt"),))
    assert clock.last_progress(parked={7: 12.0}) == 24.0  # nobody's: never discounted


def test_an_op_call_met_twice_on_its_path_is_in_place_whatever_source_lines_its_captures_carry():
    """vllm-tp2-TP1-compile-raise-run (2026-12-04): TP0 spun in ``OpOverload.__call__``, met twice on its
    path (a dispatch mode calls the op again), so the recursion rule wants every capture the same; the
    spell's last capture had borrowed an earlier dump's frames, source lines included, and the captures
    compared unequal: TP0 was "moving", and the stall lost its culprit."""
    from dataclasses import replace as _replace

    top = (py("forward", 10), py("OpOverload.__call__", 875, "torch/_ops.py"), py("dispatch", 432))
    op = py("OpOverload.__call__", 875, "torch/_ops.py")
    plain = thread(*top, op)
    told = thread(*top, _replace(op, code="return self._op(*args, **kwargs)"))
    assert in_place([plain, plain, told])
    # The recursion rule still holds for places: one capture a line elsewhere is a descent that moves.
    assert not in_place([plain, plain, thread(*top, py("OpOverload.__call__", 876, "torch/_ops.py"))])


def test_a_native_poll_loop_calling_two_readers_in_turn_is_in_place_once_caught_in_itself():
    """vllm-tp2-TP1-compile-raise-run (2026-12-04): TP0 spun 32 s in vLLM's CPU all-reduce waiting for
    TP1, which had raised and gone back to its RPC loop; five native captures found its
    ``wait_for_one`` inside ``get_curr_stamp``, inside ``get_ready_stamp`` or in itself, and the
    prefix rule called that moving code."""
    top = (py("forward", 10), py("OpOverload.__call__", 875), native("shm_allreduce"), native("wait_for_all"))
    loop = (*top, native("wait_for_one"))
    curr = thread(*loop, native("get_curr_stamp"))
    ready = thread(*loop, native("get_ready_stamp"))
    itself = thread(*loop)
    assert in_place([curr, ready, itself, curr, curr], native=[curr, ready, itself, curr, curr])
    # Never caught in the loop frame itself: a driver whose time goes into its callees, as a GEMM's.
    assert not in_place([curr, ready, curr], native=[curr, ready, curr])
    # Parting higher up than the last frame is code that moves, caught in its loop frame or not.
    deeper = thread(*loop, native("get_curr_stamp"), native("load_acquire"))
    assert not in_place([deeper, ready, itself], native=[deeper, ready, itself])
