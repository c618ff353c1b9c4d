"""When stacks are taken, the spin veto in the progress model, and the early verdict for closed waits.

The assessor is fed ticks one second apart, as the watch loop does, and the real captured samples of a
fixture whenever ``StackHistory.due`` says a capture is due: no process, no clock.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from builders import dense_burst
from builders import report_stack_samples
from fixtures.stacks import loader
from hangwatch import engines
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import Policy
from hangwatch.analyse.stackwatch import StackHistory
from hangwatch.analyse.stackwatch import with_native_detail
from hangwatch.model.report import Verdict
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import StackSample
from hangwatch.model.status import StackRequest
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State


def test_no_capture_while_anything_but_cpu_moves():
    h = StackHistory()
    assert not h.due(now=10.0, solid_since=9.0, quiet_since=9.0)
    assert not h.due(now=10.0, solid_since=7.5, quiet_since=10.0)
    assert h.due(now=10.0, solid_since=7.0, quiet_since=10.0)  # only CPU moved for 3 s: look


def test_burst_then_relaxed_then_new_burst_when_everything_stops():
    h = StackHistory()
    sample = loader.samples("missing_collective")[0]
    t = 3.0
    times = []
    while t < 40:
        quiet_since = t if t < 30 else 30.0  # CPU moves until 30 s (a silent compile), then nothing does
        if h.due(t, solid_since=0.0, quiet_since=quiet_since):
            times.append(t)
            assert h.wants_native() == (len(h.spell) < 2)  # native for the first two of a burst
            h.add(replace(sample, t=t))
        t += 1.0
    # 3 samples 2 s apart, then one every 10 s while only CPU moves, then a fresh burst after 33 s.
    assert times[:4] == [3.0, 5.0, 7.0, 17.0]
    assert 27.0 in times and 33.0 in times and 35.0 in times and 37.0 in times


def test_progress_ends_the_spell():
    h = StackHistory()
    h.due(5.0, 0.0, 0.0)
    h.add(replace(loader.samples("missing_collective")[0], t=5.0))
    assert h.spell
    assert not h.due(6.0, solid_since=5.5, quiet_since=5.5)
    assert not h.spell and h.kept  # kept for the report, not for judging the new spell


def test_python_only_samples_borrow_native_frames():
    native = loader.samples("missing_collective", "native")[0]
    python = replace(loader.samples("missing_collective", "python")[1], t=native.t + 2)
    merged = with_native_detail([native, python])
    rank0 = next(p for p in merged.dumped if p.name == "gloo_rank0").main_thread
    assert rank0 is not None and rank0.frames[-1].native
    assert any(f.name == "c10d::Work::wait" for f in rank0.frames)


def _spinning_samples() -> list[StackSample]:
    """The real H200 capture of a host spinning in cudaDeviceSynchronize (gpu_spin), CPU +1 core/s."""
    native, python = loader.samples("gpu_spin", "native")[0], loader.samples("gpu_spin", "python")[1]
    proc = native.processes[0]
    return (
        [
            replace(src, t=t, processes=(replace(src.processes[0], cpu_s=10.0 + t),))
            for src, t in ((native, 3.0), (python, 5.0), (python, 7.0))
        ]
        if proc.threads
        else []
    )


def test_spin_veto_for_a_known_spin_wait():
    h = StackHistory()
    samples = _spinning_samples()
    pid = samples[0].processes[0].pid
    h.add(samples[0])
    assert not h.spinning(pid)  # one sample proves nothing
    h.add(samples[1])
    assert not h.spinning(pid)  # nor do two: a moving loop can be caught twice in the same place
    h.add(samples[2])
    assert h.spinning(pid)


def test_spin_veto_whatever_the_frames_are_called():
    """Ranks polling a flag in loops of their own (Python, and C through ctypes): CPU burns, code stays."""
    for name in ("spin_wait", "spin_wait_native"):
        for kind in ("native", "python", None):
            h = StackHistory()
            captured = loader.samples(name, kind) if kind else loader.samples(name)
            burst = [*captured, replace(captured[-1], t=captured[-1].t + 2)]  # a third, as the burst takes
            for s in burst:
                h.add(s)
            spinner = loader.pid_of(name, "spin_wait:r0")
            # No frame names this loop's wait: three captures make it a candidate, not yet a spin...
            assert not h.spinning(spinner), (name, kind)
            # ...the dense captures that follow, all in place, make it one.
            for s in dense_burst(burst)[len(burst) :]:
                h.add(s)
            assert h.spinning(spinner), (name, kind)
            waiter = loader.pid_of(name, "spin_wait:r1")
            assert not h.spinning(waiter), (name, kind)  # asleep: no CPU to veto


def test_a_burner_whose_stack_moves_is_work_not_a_spin():
    """The compile-like workers burn a core each; their stacks move between captures."""
    for kind in ("native", "python", None):
        burner = StackHistory()
        captured = loader.samples("silent_compile", kind) if kind else loader.samples("silent_compile")
        for s in [*captured, replace(captured[-1], t=captured[-1].t + 2)]:
            burner.add(s)
        for p in loader.samples("silent_compile")[-1].processes:
            assert not burner.spinning(p.pid), (kind, p.name)


def _ticks_for(
    name: str, until: float, history: StackHistory, assessor: Assessor, rounds: list[int]
) -> Verdict | None:
    """Feed 1 s ticks of the fixture's processes (no CPU, no I/O); add a fixture sample when one is due."""
    template = loader.ticks(name)[0]
    source = loader.samples(name)
    t = 0.0
    used = 0
    while t <= until:
        log = LogSample(new_lines=3) if t == 0.0 else LogSample()
        verdict = assessor.observe(Tick(t=t, processes=template.processes, log=log))
        if verdict is not None:
            return verdict
        if assessor.stacks_wanted() is not StackRequest.NONE:
            verdict = assessor.observe_stacks(replace(source[rounds[min(used, len(rounds) - 1)]], t=t))
            used += 1
            if verdict is not None:
                return verdict
        t += 1.0
    return None


def _assessor(history: StackHistory, stall_after_s: float) -> Assessor:
    return Assessor(
        engines.by_name("generic"), Policy(stall_after_s=stall_after_s), root_pids={0}, stacks=history
    )


def test_closed_wait_is_stalled_within_15_s_whatever_the_window():
    h = StackHistory()
    v = _ticks_for("missing_collective", 200, h, _assessor(h, stall_after_s=300), [0, 1, 1])
    assert v is not None and v.state is State.STALLED and v.cause is Cause.COLLECTIVE_WAIT
    assert v.confidence == "high" and "not waiting out the 300 s stall window" in v.summary
    assert float(v.summary.split("for ")[1].split(" s")[0]) <= 15


def test_open_wait_waits_out_the_window():
    h = StackHistory()
    v = _ticks_for("missing_rank", 200, h, _assessor(h, stall_after_s=40), [0, 1, 1])
    assert v is not None and v.cause is Cause.RENDEZVOUS_WAIT
    assert "for 40 s" in v.summary


def test_lock_cycle_and_dead_peer_are_closed_too():
    for name, cause in (("lock_deadlock", Cause.LOCK_DEADLOCK), ("graph_capture", Cause.CUDA_GRAPH_CAPTURE)):
        h = StackHistory()
        v = _ticks_for(name, 200, h, _assessor(h, stall_after_s=120), [0, 1, 1])
        assert v is not None and v.cause is cause, name
        assert "not waiting out" in v.summary


def test_without_stacks_the_window_applies():
    h = StackHistory()
    assessor = _assessor(h, stall_after_s=25)
    template = loader.ticks("missing_collective")[0]
    verdict = None
    t = 0.0
    while verdict is None:
        verdict = assessor.observe(Tick(t=t, processes=template.processes))
        t += 1.0
    assert verdict.state is State.STALLED and "for 25 s" in verdict.summary


def test_spinning_rank_is_stalled_after_the_window_not_kept_alive_by_its_cpu():
    """A host thread spinning in cudaDeviceSynchronize at 100 % CPU: the CPU is vetoed, the window runs."""
    h = StackHistory()
    assessor = _assessor(h, stall_after_s=20)
    spin = _spinning_samples()[0]
    proc = spin.processes[0]
    tick_proc = replace(loader.ticks("gpu_spin")[0].processes[0], cpu_delta_s=1.0, state="R")
    verdict = None
    t = 0.0
    while verdict is None and t < 120:
        verdict = assessor.observe(
            Tick(t=t, processes=(tick_proc,), log=LogSample(new_lines=1) if t == 0 else LogSample())
        )
        if verdict is None and assessor.stacks_wanted() is not StackRequest.NONE:
            verdict = assessor.observe_stacks(replace(spin, t=t, processes=(replace(proc, cpu_s=10.0 + t),)))
        t += 1.0
    assert verdict is not None and verdict.state is State.STALLED, "CPU of a spin-wait kept the tree alive"
    assert verdict.cause is Cause.GPU_SPIN
    assert t < 35  # sampling from 3 s, veto from the second sample (5 s), then the 20 s window


def test_a_burner_whose_stack_moves_counts_as_progress_even_when_starved():
    """CPU under 10 % of a core on a loaded machine; the stack moved between captures while on CPU."""
    h = StackHistory()
    for s in loader.samples("silent_compile", "native"):
        h.add(s)
    burner = loader.pid_of("silent_compile", "compile_worker_")
    assert burner in h.moved()
    assert h.moved() == ()  # once per capture
    for name in ("missing_collective", "gpu_spin", "lock_deadlock"):
        still = StackHistory()
        for s in loader.samples(name):
            still.add(s)
        assert still.moved() == (), name


def test_a_host_parked_while_its_gpu_works_is_not_a_wait_that_logs():
    """A training loop in ``cudaDeviceSynchronize`` that prints ``step N``: its stack never moves, but its
    GPU works, so its lines are not discounted; the same host over a spinning GPU is parked."""
    from hangwatch.model.samples import GpuActivity
    from hangwatch.model.samples import GpuProcessMemory
    from hangwatch.model.samples import GpuReading
    from hangwatch.model.samples import GpuSample

    # GPM as the H200 read a GEMM loop and a spinning kernel (scripts/gpu/validate_stacks.py, 2026-11-29).
    work_gpm = GpuActivity(0, 11.0, 99.12, 95.68, 88.39, 21.61, 1.84, 0.0, 0.34)
    spin_gpm = GpuActivity(0, 3.0, 100.0, 0.76, 0.0, 0.0, 0.0, 0.0, 0.0)
    first = loader.load("gpu_ipc_sync")["samples"][0]["processes"]
    host = next(int(p["pid"]) for p in first if (p.get("env") or {}).get("RANK") == "0")
    reading = GpuReading(0, "NVIDIA H200", 100.0, 30.0, 40 << 30, 141 << 30, 673.1, 1980)
    gpu = GpuSample(gpus=(reading,), processes=(GpuProcessMemory(host, 0, 700 << 20, 99.0),))
    for gpm, parked in ((work_gpm, False), (spin_gpm, True)):
        h = StackHistory()
        h.observe_tick(Tick(0.0, (), gpu=gpu))
        captured = loader.samples("gpu_ipc_sync", "native")
        for s in [*captured, replace(captured[-1], t=captured[-1].t + 2)]:
            h.add(replace(s, gpus=(gpm,)))
        assert h.parked(host) is parked, gpm


def test_a_spell_re_dated_by_a_spin_found_late_keeps_the_captures_made_since():
    """vllm-tp2-TP1-compile-raise-run (2026-12-04): TP0's CPU counted until its spin was found; the quiet
    spell was then re-dated to when the spin began, its 30 s window already over, and the verdict came
    with the one capture taken after the spell was emptied: "no rule matched", no culprit."""
    h = StackHistory()
    sample = loader.samples("missing_collective")[0]
    for t in (41.0, 43.7, 46.2, 56.2, 66.2):
        assert h.due(t, solid_since=36.0, quiet_since=t)  # only CPU moves: the spell is solid_since's
        h.add(replace(sample, t=t))
    assert not h.due(67.0, solid_since=36.0, quiet_since=38.0)  # re-dated: no fresh burst needed
    assert [s.t for s in h.spell] == [46.2, 56.2, 66.2]
    # A spell that starts after the captures (something moved since) starts empty, as before.
    assert h.due(80.0, solid_since=76.0, quiet_since=76.0) and not h.spell


def test_a_move_between_two_captures_the_burst_holds_in_place_does_not_date_the_spin():
    """vllm-tp2-TP1-serving-block-run (2026-12-04): TP0 spins in the CPU all-reduce TP1 never joined.
    The burst's two native captures found it in ``get_curr_stamp`` then ``get_ready_stamp``, which two
    captures alone call a move; the Python-only captures after them hold it in place, and it spins. The
    spin dates from the quiet spell, not from the second capture (the stall came 6.6 s late)."""
    samples = report_stack_samples(
        Path(__file__).resolve().parent / "data" / "vllm_tp0_allreduce_spin_stacks.json"
    )
    pid = samples[0].processes[0].pid
    h = StackHistory()
    assert h.due(now=samples[0].t, solid_since=59.0, quiet_since=59.0)
    for s in samples:
        h.add(s)
    assert h.spinning(pid)
    assert h.spin_since(pid) == 59.0, h.spin_since(pid)  # not 64.13, the second capture


# Captured on an H100 by scripts/gpu/validate_gpu_waits.py (2026-12-06): the CUDA-IPC flag barrier with no
# RANK in either process (a producer and a consumer, not a group). One polls its event at 100 % of a core
# in `host_wait`; the other never arrives (`never_arrive > Event.wait`). Before: the poller's CPU counted
# as progress for 240 s and no verdict ever came.
UNRANKED = "gpu_ipc_poll_unranked"
POLLER, ABSENT = 891, 892


def _unranked_history(gpm: object, gpu_pids: tuple[int, ...] = (POLLER, ABSENT)) -> StackHistory:
    from hangwatch.model.samples import GpuProcessMemory
    from hangwatch.model.samples import GpuReading
    from hangwatch.model.samples import GpuSample

    # NVML reads a spin and an FMA chain alike (100 % / 0 %, low power): only GPM's pipes tell them apart.
    reading = GpuReading(0, "NVIDIA H100 80GB HBM3", 100.0, 0.0, 2 << 30, 80 << 30, 120.0, 1980)
    gpu = GpuSample(gpus=(reading,), processes=tuple(GpuProcessMemory(p, 0, 700 << 20) for p in gpu_pids))
    h = StackHistory()
    h.observe_tick(Tick(0.0, (), gpu=gpu))
    assert h.due(now=4.0, solid_since=0.0, quiet_since=0.0)
    captured = loader.samples(UNRANKED, "python")
    for s in dense_burst(captured, total=8):
        h.add(replace(s, gpus=(gpm,)) if gpm is not None else s)
    return h


def test_a_host_polling_a_gpu_that_spins_is_held_up_by_it_without_any_rank():
    """The GPU is the edge: the poller waits on its GPU, whose pipes are idle (a kernel spinning on a flag).
    Its CPU is then a spin, whatever its frames are called and with no group to say so."""
    from hangwatch.model.samples import GpuActivity

    spin_gpm = GpuActivity(0, 3.0, 100.0, 0.76, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert _unranked_history(spin_gpm).spinning(POLLER)


def test_a_host_polling_a_gpu_that_computes_in_cache_keeps_its_cpu_as_progress():
    """Must not fire: an FMA chain in registers reads exactly like a spin to NVML (100 % / 0 %); without
    GPM's pipes, or with them busy, the poller's CPU is work, as before (a false stall kills the tree)."""
    from hangwatch.model.samples import GpuActivity

    fma_gpm = GpuActivity(0, 3.0, 100.0, 99.0, 0.0, 0.5, 37.4, 74.8, 0.0)  # FP32 74.8 %, integer 37.4 %
    assert not _unranked_history(fma_gpm).spinning(POLLER)
    assert not _unranked_history(None).spinning(POLLER)
    # Nor a process holding no GPU memory: the GPU says nothing of it.
    spin_gpm = GpuActivity(0, 3.0, 100.0, 0.76, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert not _unranked_history(spin_gpm, gpu_pids=()).spinning(POLLER)
