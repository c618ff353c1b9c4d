"""Evidence of work that stacks alone miss, and waits that end by themselves.

Two shapes that three stack captures misread (2026-12-04, tests/programs/work_loops.py and
lock_file_poll.py on the 2-core machine):

- CPU work with no log line and no I/O whose loop calls a few helpers (a recursion, a sort, a dict build)
  is caught inside the loop's few lines, as a poll loop ``while not ready(): pass`` is: it was called a
  spin and stalled at a 10 s window. Work that allocates or copies touches fresh memory all the time, and
  the kernel counts it (page faults); a spin re-reading a flag faults nothing.
- A rank polling for a file lock (a non-blocking try, then a sleep) that another build holds was "nothing
  inside the tree can end this wait" when three captures all found it asleep. A thread that wakes again
  and again (the kernel's count of its runs rising) looks again: its wait ends when the lock comes free.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from builders import dense_burst
from builders import report_stack_samples
from hangwatch.analyse.progress import FLOW_FAULTS_PER_S_MIN
from hangwatch.analyse.progress import SignalKind
from hangwatch.analyse.progress import data_flowing
from hangwatch.analyse.progress import progress_signals
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stackwaits import OUR_WAKES_PER_CAPTURE
from hangwatch.analyse.stackwaits import OUR_WAKES_PER_STOP
from hangwatch.analyse.stackwaits import RETRY_WAKES
from hangwatch.analyse.stackwaits import process_views
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.collect import procfs
from hangwatch.model.kernelwaits import ProcessWaits
from hangwatch.model.kernelwaits import ThreadWait
from hangwatch.model.kernelwaits import Waker
from hangwatch.model.samples import GpuActivity
from hangwatch.model.samples import GpuProcessMemory
from hangwatch.model.samples import GpuReading
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.vocabulary import Cause

WORKER, WAITER = 20, 21


def proc(pid: int, faults: int | None, cpu_delta: float) -> ProcessSample:
    return ProcessSample(
        pid, 1, f"rank{pid - 20}", ("python",), "R", 10.0, cpu_delta, 0, 0, 0, 1, 1 << 20, (), None,
        str(pid - 20), faults=faults,
    )  # fmt: skip


def ticks(faults_per_s: int, until: int = 12) -> list[Tick]:
    """The worker faulting ``faults_per_s`` and burning a core; the waiter idle."""
    return [
        Tick(float(t), (proc(WORKER, 1000 + faults_per_s * t, 1.0), proc(WAITER, 50, 0.0)))
        for t in range(until + 1)
    ]


def worker_loop(line: int) -> ThreadStack:
    """The worker's loop caught in one of its helpers: on stacks alone, a poll loop's shape."""
    frames = (
        Frame("<module>", "boot.py", 90),
        Frame("build_tables", "boot.py", 40),
        Frame({41: "sort_some", 42: "table", 43: "fib"}[line], "boot.py", line + 20),
    )
    return ThreadStack(WORKER, "MainThread", True, True, frames)


def waiter_in_barrier() -> ThreadStack:
    frames = (
        Frame("<module>", "boot.py", 90),
        Frame("barrier", "torch/distributed/distributed_c10d.py", 4100),
    )
    return ThreadStack(WAITER, "MainThread", False, False, frames)


def samples(lines: tuple[int, int, int] = (41, 41, 41)) -> list[StackSample]:
    """The worker caught three times in its loop: by default in one helper every time (a poll loop's
    shape, re-reading one condition); ``(41, 42, 41)`` walks two helpers."""
    out = []
    for t, line in zip((3.0, 5.0, 7.0), lines, strict=True):
        worker = ProcessStacks(
            WORKER, "rank0", None, "0", DumpOutcome.OK, (worker_loop(line),), "R", 10.0 + t, world_size=2
        )
        waiter = ProcessStacks(
            WAITER, "rank1", None, "1", DumpOutcome.OK, (waiter_in_barrier(),), "S", 5.0, world_size=2
        )
        out.append(StackSample(t, (worker, waiter), 0.1))
    return out


def test_fresh_memory_touched_in_every_interval_is_the_code_moving():
    assert data_flowing(ticks(38_000), 3.0, 7.0) == frozenset({WORKER})
    # A spin faults nothing; a background thread's odd allocation is under the rate.
    assert data_flowing(ticks(0), 3.0, 7.0) == frozenset()
    assert data_flowing(ticks(FLOW_FAULTS_PER_S_MIN // 4), 3.0, 7.0) == frozenset()


def test_faults_not_read_say_nothing():
    window = [Tick(float(t), (proc(WORKER, None, 1.0),)) for t in range(9)]
    assert data_flowing(window, 3.0, 7.0) == frozenset()


def test_a_rank_working_while_its_peer_waits_in_a_barrier_is_neither_a_spin_nor_a_closed_wait():
    # Rank 0 builds its tables (the stacks find it in its loop's helpers, in place by their shape) while
    # rank 1 waits for it in the barrier: the faults say rank 0 works.
    working = ticks(38_000)
    d = classify(stack_context(samples(), working))
    assert not d.closed, d
    history = StackHistory()
    for s in samples():
        history.add(s)
    for t in working:
        history.observe_tick(t)
    assert not history.spinning(WORKER)


def test_the_same_stacks_without_faults_are_still_a_spin():
    # The guard is the kernel's count, not the frames' names: with nothing touched, the loop spins, and
    # the rank waiting for it names it. Not closed: its code runs, and may yet finish.
    still = ticks(0)
    d = classify(stack_context(samples(), still))
    assert d.cause is Cause.COLLECTIVE_WAIT and d.culprits == (WORKER,) and not d.closed, d
    history = StackHistory()
    for s in dense_burst(samples()):  # the burst, then the captures that confirm a spin no frame names
        history.add(s)
    for t in still:
        history.observe_tick(t)
    assert history.spinning(WORKER)


def test_stat_counts_the_faults_of_fresh_memory():
    before = procfs.read_stat(os.getpid())
    assert before is not None
    buffer = bytearray(32 << 20)  # 32 MiB touched: 8,192 pages
    for i in range(0, len(buffer), 4096):
        buffer[i] = 1
    after = procfs.read_stat(os.getpid())
    assert after is not None and after.faults - before.faults >= 4096


def test_schedstat_counts_the_wakes_of_a_thread():
    import time

    first = procfs.read_wakeups(os.getpid(), os.getpid())
    for _ in range(5):
        time.sleep(0.001)
    second = procfs.read_wakeups(os.getpid(), os.getpid())
    assert first is not None and second is not None and second - first >= 5


# A rank that polls for a lock (a try, then a sleep) while its peer waits for it in the all-reduce.
POLLER, PEER = 30, 31


def poller_thread() -> ThreadStack:
    frames = (
        Frame("<module>", "job.py", 90),
        Frame("take_lock", "job.py", 40),
        Frame("time_sleep", "libpython3.11.so", 0, native=True),
    )
    return ThreadStack(POLLER, "MainThread", False, False, frames)


def peer_thread() -> ThreadStack:
    frames = (
        Frame("<module>", "job.py", 90),
        Frame("all_reduce", "torch/distributed/distributed_c10d.py", 2806),
    )
    return ThreadStack(PEER, "MainThread", False, False, frames)


def lock_samples(wakes_per_capture: int, stops_per_capture: int | None = None) -> list[StackSample]:
    """``stops_per_capture``: what the collector counted of its own stops (None: not counted)."""
    out = []
    for i, t in enumerate((3.0, 5.0, 7.0)):
        sleeping = ThreadWait(POLLER, "clock_nanosleep", Waker.TIMEOUT, wakeups=100 + i * wakes_per_capture)
        waiting = ThreadWait(PEER, "futex", Waker.ITSELF, wakeups=7)
        stops = None if stops_per_capture is None else i * stops_per_capture
        poller = ProcessStacks(
            POLLER, "rank1", None, "1", DumpOutcome.OK, (poller_thread(),), "S", 1.0, world_size=2,
            kernel=ProcessWaits(POLLER, (sleeping,), our_stops=stops),
        )  # fmt: skip
        peer = ProcessStacks(
            PEER, "rank0", None, "0", DumpOutcome.OK, (peer_thread(),), "S", 1.0, world_size=2,
            kernel=ProcessWaits(PEER, (waiting,)),
        )  # fmt: skip
        out.append(StackSample(t, (poller, peer), 0.1))
    return out


def test_a_rank_that_wakes_and_looks_again_is_a_poll_and_never_a_closed_wait():
    views = {v.pid: v for v in process_views(lock_samples(40))}
    assert views[POLLER].retrying and not views[PEER].retrying
    d = classify(stack_context(lock_samples(40)))
    # Still named: the others wait for it. But whatever it polls for may come: the window applies.
    assert d.cause is Cause.COLLECTIVE_WAIT and d.culprits == (POLLER,), d
    assert not d.closed, d


def test_a_rank_parked_in_one_long_sleep_is_still_a_closed_wait():
    # The same frames, the kernel's count rising only by what our own dumps cause (each stops and resumes
    # its target: +2 a capture, measured on the gloo programs): a sleep(3600) looks at nothing between.
    views = {v.pid: v for v in process_views(lock_samples(OUR_WAKES_PER_CAPTURE))}
    assert not views[POLLER].retrying
    assert process_views(lock_samples(OUR_WAKES_PER_CAPTURE + RETRY_WAKES // 2))[0].retrying
    d = classify(stack_context(lock_samples(0)))
    assert d.cause is Cause.COLLECTIVE_WAIT and d.culprits == (POLLER,) and d.closed, d


def test_our_own_stops_as_the_collector_counted_them_are_not_a_poll():
    # Our unwinder stops a process twice a capture (py-spy's run, then the copy): +4 wakes a capture. As
    # counted, that is us, not a poll; the one-stop guess of an older collector's bundle would call it one.
    assert not process_views(lock_samples(2 * OUR_WAKES_PER_STOP, stops_per_capture=2))[0].retrying
    assert process_views(lock_samples(2 * OUR_WAKES_PER_STOP))[0].retrying
    # Woken more than our stops account for: a poll still.
    assert process_views(lock_samples(2 * OUR_WAKES_PER_STOP + RETRY_WAKES, stops_per_capture=2))[0].retrying


# GPU work is progress whatever the host does: tensor-core GEMMs on a side stream while the host polls
# the completion event with short sleeps (CPU under the threshold, no log, GPU memory steady).
HOST, TENANT = 40, 41


def gpu_tick(mem_util: float, holders: tuple[tuple[int, float | None], ...], t: float = 5.0) -> Tick:
    gpu = GpuSample(
        gpus=(GpuReading(0, "NVIDIA H200", 99.0, mem_util, 40 << 30, 141 << 30, 690.0, 1980),),
        processes=tuple(GpuProcessMemory(pid, 0, 20 << 30, sm) for pid, sm in holders),
    )
    return Tick(t, (proc(HOST, 100, 0.02),), gpu=gpu)


def test_a_gpu_moving_memory_for_the_tree_is_progress_whatever_its_host_does():
    signals = progress_signals(gpu_tick(0.0, (), 4.0), gpu_tick(38.0, ((HOST, None),)), None)
    assert [s.kind for s in signals] == [SignalKind.GPU_WORK], signals
    assert signals[0].pid == HOST


def _pipes(**values: float) -> GpuActivity:
    fields = dict.fromkeys(("tensor_util", "dram_bw_util", "integer_util", "fp32_util", "fp16_util"), 0.0)
    fields.update(values)
    return GpuActivity(index=0, interval_s=1.0, graphics_util=100.0, sm_util=100.0, **fields)


def test_a_gpu_computing_in_cache_is_progress_by_its_pipes_and_a_spin_is_not():
    """Small GEMMs whose operands sit in L2 read 6 % memory utilisation, under MEM_UTIL_WORK: GPM's pipes
    read every tick say it computes; every SM spinning lifts the integer pipe to 0.65 % and nothing else."""
    before = gpu_tick(0.0, (), 4.0)
    computing = gpu_tick(6.0, ((HOST, None),))
    computing = replace(computing, gpu=replace(computing.gpu, activity=(_pipes(tensor_util=41.0),)))
    [signal] = progress_signals(before, computing, None)
    assert signal.kind is SignalKind.GPU_WORK and "tensor 41 %" in signal.text
    spinning = replace(computing, gpu=replace(computing.gpu, activity=(_pipes(integer_util=0.65),)))
    assert progress_signals(before, spinning, None) == ()
    # A kernel polling memory for a peer's flag reads some DRAM: left to NVML's memory utilisation (10 %).
    polling = replace(computing, gpu=replace(computing.gpu, activity=(_pipes(dram_bw_util=8.0),)))
    assert progress_signals(before, polling, None) == ()
    no_gpm = gpu_tick(6.0, ((HOST, None),))  # a GPU without GPM: memory utilisation alone, as before
    assert progress_signals(before, no_gpm, None) == ()


def test_a_spinning_gpu_is_not_progress():
    # A kernel spinning on a flag: 100 % utilisation, 0 % memory utilisation (docs/gpu-signals.md).
    assert progress_signals(gpu_tick(0.0, (), 4.0), gpu_tick(0.0, ((HOST, None),)), None) == ()


def test_another_tenants_work_on_the_same_gpu_is_not_the_trees():
    # Without per-process samples a GPU shared with a process outside the tree proves nothing...
    shared = gpu_tick(38.0, ((HOST, None), (TENANT, None)))
    assert progress_signals(gpu_tick(0.0, (), 4.0), shared, None) == ()
    # ...with them, only the tree's own kernels running count.
    theirs = gpu_tick(38.0, ((HOST, 0.0), (TENANT, 97.0)))
    assert progress_signals(gpu_tick(0.0, (), 4.0), theirs, None) == ()
    ours = gpu_tick(38.0, ((HOST, 95.0), (TENANT, 0.0)))
    assert [s.kind for s in progress_signals(gpu_tick(0.0, (), 4.0), ours, None)] == [SignalKind.GPU_WORK]


def test_a_lone_burner_in_place_that_nobody_waits_for_is_work():
    # A sort inside C, an arithmetic loop: in place, no memory touched, and nothing in the tree waits on
    # it or is stuck beside it. Its stacks cannot tell it from a spin, and a spin waits for someone: its
    # CPU stays progress. The same burner with a rank blocked beside it is a spin (the test above).
    alone = [
        StackSample(s.t, tuple(p for p in s.processes if p.pid == WORKER), s.elapsed_s)
        for s in dense_burst(samples())
    ]
    history = StackHistory()
    for s in alone:
        history.add(s)
    for t in ticks(0, until=12):
        history.observe_tick(t)
    assert not history.spinning(WORKER)
    # Requests waiting for the tree's answer make it part of a wait (a server owes them).
    assert history.spinning(WORKER, awaited=True)


def test_a_loop_walking_several_helpers_works_without_a_fault():
    # torch.multiprocessing.spawn, 2026-12-04: a rank building tables (a sort, a dict build) while its peer
    # waited in the all-reduce touched no fresh memory (its allocator kept its pages) and was caught in
    # its sort, its dict build, its sort: a loop walking helpers is work, a poll re-reads one condition.
    walking = samples((41, 42, 41))
    still = ticks(0)
    d = classify(stack_context(walking, still))
    assert not d.closed, d
    history = StackHistory()
    for s in walking:
        history.add(s)
    for t in still:
        history.observe_tick(t)
    assert not history.spinning(WORKER)


# vLLM at TP=1 (vllm-tp1-model-serving-block-run, 2026-12-04): its one worker blocked in execute_model (an
# Event nobody sets), its engine core polling for the answer, the API server answering /health all the
# while: "no rule matched", no culprit, though the worker waits where only its own threads can wake it.
def test_a_tp1_worker_parked_on_its_own_event_is_named_while_the_front_answers_probes():
    samples = report_stack_samples(
        Path(__file__).resolve().parent / "data" / "vllm_tp1_worker_wedge_stacks.json"
    )
    names = {p.pid: p.name for p in samples[-1].processes}
    worker = next(pid for pid, name in names.items() if name.startswith("VLLM::Worker"))
    front = [pid for pid, name in names.items() if name in ("VLLM::APIServer", "VLLM::EngineCore")]
    # The front moves data every tick (its /health answers, its polls of the engine core).
    window = [
        Tick(
            samples[0].t - 2 + i,
            tuple(
                ProcessSample(
                    pid,
                    1,
                    name,
                    ("python",),
                    "S",
                    10.0,
                    0.01,
                    0,
                    0,
                    4096 if pid in front else 0,
                    4,
                    1 << 20,
                    (),
                    None,
                    None,
                )
                for pid, name in names.items()
            ),
        )
        for i in range(int(samples[-1].t - samples[0].t) + 4)
    ]
    context = replace(
        stack_context(samples, window), requests_waiting=("3 client connections got no answer",)
    )
    d = classify(context)
    assert d.culprits == (worker,), d.explanation
    assert "main thread is stuck in" in d.explanation and "Event.wait" in d.explanation, d.explanation
    assert d.rules == ("stacks:stuck-handler",), d.rules
    # Without requests waiting, an idle server's parked thread is nobody's wedge.
    assert classify(stack_context(samples, window)).culprits != (worker,)
