"""Rules fixed from the fault matrix on real engines (docs/fault-matrix.md), each built from the sample
values of the cell's own report: the stacks, CPU times, log sources and probe timings it recorded."""

from __future__ import annotations

from dataclasses import replace

from hangwatch import engines
from hangwatch.analyse.assess import Assessor
from hangwatch.analyse.assess import Policy
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stackrules import stack_context
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import PhaseEvent
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack


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
    a = Assessor(engines.by_name("vllm"), Policy(stall_after=30.0), root_pids={_API})
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
