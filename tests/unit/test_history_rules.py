"""Phase history's decisions and words: the key of a boot from its command line and report, which phases
are recorded, the usual range, this boot against it (analyse/history.py), the report's block and the
listing (render/history_text.py), and the record at the end of a supervision (supervise/history.py)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from builders import report
from builders import verdict
from hangwatch.analyse.history import auto_windows
from hangwatch.analyse.history import boot_key
from hangwatch.analyse.history import comparable
from hangwatch.analyse.history import compare
from hangwatch.analyse.history import gpus_of
from hangwatch.analyse.history import launch_key
from hangwatch.analyse.history import model_of
from hangwatch.analyse.history import parallel_sizes
from hangwatch.analyse.history import program_of
from hangwatch.analyse.history import recordable
from hangwatch.analyse.history import switches_of
from hangwatch.analyse.history import usual
from hangwatch.collect.bootfacts import compile_caches_warm
from hangwatch.collect.bootfacts import local_model
from hangwatch.engines import registry
from hangwatch.model.history import BootKey
from hangwatch.model.history import LaunchHistory
from hangwatch.model.history import PastBoots
from hangwatch.model.history import PhaseDuration
from hangwatch.model.history import Standing
from hangwatch.model.report import PhaseSpan
from hangwatch.model.samples import GpuReading
from hangwatch.model.samples import GpuSample
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import State
from hangwatch.render.history_text import history_lines
from hangwatch.render.history_text import history_markdown
from hangwatch.render.history_text import phase_line
from hangwatch.supervise.history import auto_note
from hangwatch.supervise.history import launch_history
from hangwatch.supervise.history import record_history


def spans(*phases: tuple[str, float], end: float) -> tuple[PhaseSpan, ...]:
    """Consecutive spans, each (name, start); the last closed at ``end`` (as Watch.report closes it)."""
    out = []
    for i, (name, start) in enumerate(phases):
        stop = phases[i + 1][1] if i + 1 < len(phases) else end
        out.append(PhaseSpan(name, start, stop))
    return tuple(out)


READY_PHASES = spans(("process_start", 0), ("weights", 5), ("cuda_graph", 30), ("ready", 95), end=95)


@pytest.mark.parametrize(
    ("engine", "argv", "sizes"),
    [
        ("vllm", "vllm serve /m -tp 4 --pipeline-parallel-size 2", (4, 2, 1, 1)),
        ("vllm", "vllm serve /m --tensor-parallel-size=2 -dp 2 --enable-expert-parallel", (2, 1, 2, 4)),
        ("sglang", "python -m sglang.launch_server --model-path /m --tp 8 --dp-size 2 --ep 8", (8, 1, 2, 8)),
        ("sglang", "python -m sglang.launch_server --tp-size nonsense", (1, 1, 1, 1)),
        ("generic", "torchrun --nproc-per-node 4 train.py", (1, 1, 1, 1)),
    ],
)
def test_parallel_sizes_come_from_each_engines_flags(engine, argv, sizes):
    assert parallel_sizes(argv.split(), engine) == sizes


def test_the_model_is_the_flag_or_vllm_serves_positional():
    assert model_of(["vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8000"]) == "Qwen/Qwen3-0.6B"
    assert model_of(["python", "-m", "vllm.entrypoints.openai.api_server", "--model=/m"]) == "/m"
    assert model_of(["python", "-m", "sglang.launch_server", "--model-path", "/w"]) == "/w"
    assert model_of(["vllm", "serve", "--port", "8000"]) is None


def test_a_command_without_a_model_is_known_by_what_it_runs():
    assert program_of(["python", "train.py"]) == str(Path("train.py").absolute())
    assert program_of(["torchrun", "--nproc-per-node", "2", "-m", "pkg.job"]) == "-m pkg.job"
    assert program_of(["env", "A=1", "/opt/bin/server", "--x"]) == "server"


def test_switches_that_change_a_boot_split_its_history_and_others_do_not():
    argv = [
        "vllm",
        "serve",
        "/m",
        "--enforce-eager",
        "--attention-backend",
        "FLASHINFER",
        "--port",
        "8001",
        "-q",
        "fp8",
    ]
    assert switches_of(argv, "vllm") == ("attention-backend=FLASHINFER", "enforce-eager", "q=fp8")
    assert switches_of(["vllm", "serve", "/m", "--port", "9000"], "vllm") == ()
    assert switches_of(["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "t.py"], "generic") == (
        "nnodes=2",
        "nproc-per-node=4",
    )


def test_gpus_are_the_latest_nvml_reading_and_none_without_nvml():
    gpu = GpuReading(0, "NVIDIA H200", None, None, None, None, None, None)
    ticks = (
        Tick(0.0, (), gpu=GpuSample(gpus=(gpu, gpu))),
        Tick(1.0, (), gpu=GpuSample(error="NVML did not answer")),
    )
    assert gpus_of(ticks) == ("NVIDIA H200", 2)
    assert gpus_of((Tick(0.0, (), gpu=GpuSample(unavailable="no NVML")),)) == (None, 0)


def test_the_key_names_the_engine_version_and_is_stable():
    r = report(engine="vllm", environment={"vllm": "0.11.0", "torch": "2.8.0"})
    argv = ("vllm", "serve", "/m", "-tp", "2")
    k = boot_key(r, argv, model="/m", model_bytes=1 << 30, host="gpu1", caches_warm=True)
    assert (k.engine_version, k.tp, k.model, k.program) == ("0.11.0", 2, "/m", None)
    assert (
        k.key_id == boot_key(r, argv, model="/m", model_bytes=1 << 30, host="gpu1", caches_warm=True).key_id
    )
    other = boot_key(r, argv, model="/m", model_bytes=1 << 30, host="gpu1", caches_warm=False)
    assert other.key_id != k.key_id  # a cold boot is not compared with warm ones
    assert k.describe() == "vllm 0.11.0 · /m (1.0 GiB) · TP 2 · no GPU seen · host gpu1 · caches warm"
    generic = boot_key(report(environment={"torch": "2.8.0"}), ("python", "job.py"), model=None,
                       model_bytes=None, host="h", caches_warm=False)  # fmt: skip
    assert generic.engine_version == "2.8.0" and generic.program.endswith("job.py")


def test_a_ready_boot_records_every_phase_before_ready():
    r = report(verdict(State.READY), phases=READY_PHASES, duration_s=95)
    assert recordable(r) == (
        PhaseDuration("process_start", 5),
        PhaseDuration("weights", 25),
        PhaseDuration("cuda_graph", 65),
    )


@pytest.mark.parametrize("state", [State.STALLED, State.CRASHED, State.TIMEOUT, State.INTERRUPTED])
def test_a_boot_that_never_became_ready_records_only_the_phases_it_finished(state):
    phases = spans(("process_start", 0), ("weights", 5), ("cuda_graph", 30), end=400)
    r = report(verdict(state), phases=phases, duration_s=400)
    assert recordable(r) == (PhaseDuration("process_start", 5), PhaseDuration("weights", 25))


def test_the_usual_range_is_the_recent_boots_with_the_extremes_left_out_from_five():
    assert (usual("w", (22.0,)).lo_s, usual("w", (22.0,)).hi_s) == (22.0, 22.0)
    four = usual("w", (30.0, 22.0, 25.0, 23.0))
    assert (four.lo_s, four.hi_s, four.boots) == (22.0, 30.0, 4)
    five = usual("w", (300.0, 22.0, 25.0, 23.0, 1.0))  # one odd boot at each end
    assert (five.lo_s, five.hi_s, five.boots) == (22.0, 25.0, 5)
    old = (23.0,) * 10 + (500.0,) * 5  # newest first: the slow boots are older than the last ten
    recent = usual("w", old)
    assert (recent.lo_s, recent.hi_s, recent.boots, recent.recorded) == (23.0, 23.0, 10, 15)
    assert recent.last_s == 23.0


def _past(key: BootKey, **durations: tuple[float, ...]) -> PastBoots:
    boots = max(len(v) for v in durations.values())
    return PastBoots(
        key.key_id, key, boots, "2025-01-01T00:00:00+00:00", "2025-01-02T00:00:00+00:00", durations
    )


KEY = BootKey("vllm", "0.11.0", "/m", None, None, 1, 1, 1, 1, (), "NVIDIA H200", 1, "gpu1", True)


def test_each_phase_against_its_history_longer_within_shorter_and_unfinished():
    past = _past(KEY, weights=(22.0, 25.0, 23.0, 24.0, 22.5), cuda_graph=(60.0, 70.0, 65.0))
    r = report(verdict(State.READY), phases=READY_PHASES, duration_s=95)
    h = compare(r, KEY, past, recorded=True)
    lines = {line.phase: line for line in h.lines}
    assert set(lines) == {"weights", "cuda_graph"}  # process_start has no history
    assert lines["weights"].standing is Standing.WITHIN
    assert lines["cuda_graph"].standing is Standing.WITHIN
    assert phase_line(lines["weights"]) == "weights: 25 s (usual 22-24 s, 5 boots)"
    slow = report(
        verdict(State.STALLED),
        phases=spans(("process_start", 0), ("weights", 2), ("cuda_graph", 10), end=105),
        duration_s=105,
    )
    h = compare(slow, KEY, past, recorded=True)
    lines = {line.phase: line for line in h.lines}
    assert lines["weights"].standing is Standing.SHORTER
    assert phase_line(lines["cuda_graph"]) == (
        "cuda_graph: 95 s and not finished (usual 60-70 s, 3 boots): longer than usual"
    )
    # Inside the margin (a tick either way) is within.
    assert compare(report(verdict(State.READY), phases=spans(("weights", 0), ("ready", 25.9), end=26)),
                   KEY, past, recorded=True).lines[0].standing is Standing.WITHIN  # fmt: skip


def test_the_report_block_says_the_configuration_and_each_phase():
    past = _past(KEY, cuda_graph=(60.0, 70.0, 65.0, 62.0, 68.0))
    phases = spans(("process_start", 0), ("weights", 5), ("cuda_graph", 30), end=125)
    r = report(verdict(State.STALLED), phases=phases, duration_s=125)
    r = report(verdict(State.STALLED), phases=phases, duration_s=125,
               phase_history=compare(r, KEY, past, recorded=True))  # fmt: skip
    assert history_lines(r) == [
        f"  history: 5 earlier boots of this configuration, recorded (id {KEY.key_id}: {KEY.describe()})",
        "    - cuda_graph: 95 s and not finished (usual 62-68 s, 5 boots): longer than usual",
    ]
    md = history_markdown(r)
    assert f"id `{KEY.key_id}`" in md[1] and md[-1].startswith("- `cuda_graph`: 95 s")
    assert history_lines(report()) == [] and history_markdown(report()) == []


def _env(tmp_path: Path) -> dict[str, str]:
    caches = tmp_path / "caches"
    return {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "HOME": str(tmp_path / "home"),
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
    }


def test_record_history_compares_with_the_boots_before_then_adds_this_one(tmp_path):
    env = _env(tmp_path)
    command = ("vllm", "serve", "Qwen/Qwen3-0.6B")
    first = report(verdict(State.READY), engine="vllm", phases=READY_PHASES, duration_s=95)
    one = record_history(first, command, env)
    assert one.phase_history is not None
    assert (one.phase_history.earlier_boots, one.phase_history.lines, one.phase_history.recorded) == (
        0,
        (),
        True,
    )
    assert one.phase_history.key.model == "Qwen/Qwen3-0.6B" and one.phase_history.key.model_bytes is None
    assert one.notes == ()
    two = record_history(first, command, env)
    assert two.phase_history is not None and two.phase_history.earlier_boots == 1
    assert [line.phase for line in two.phase_history.lines] == ["process_start", "weights", "cuda_graph"]
    assert (tmp_path / "state" / "hangwatch" / "history.sqlite3").is_file()


def test_a_boot_that_finished_no_phase_is_compared_not_recorded(tmp_path):
    env = _env(tmp_path)
    stuck = report(verdict(State.STALLED), phases=spans(("process_start", 0), end=300), duration_s=300)
    out = record_history(stuck, ("python", "job.py"), env)
    assert out.phase_history is not None and not out.phase_history.recorded
    assert "not recorded (no phase finished)" in history_lines(out)[0]


def test_the_demo_is_never_recorded(tmp_path):
    env = _env(tmp_path)
    r = report(verdict(State.STALLED), phases=READY_PHASES)
    out = record_history(r, ("python", "-m", "hangwatch.demo.story", "--ranks", "4"), env)
    assert out.phase_history is None and out.notes == ()
    assert not (tmp_path / "state").exists()


def test_a_damaged_history_costs_one_note_and_the_report_is_whole(tmp_path):
    env = _env(tmp_path)
    folder = tmp_path / "state" / "hangwatch"
    folder.mkdir(parents=True)
    (folder / "history.sqlite3").write_text("garbage" * 100)
    r = report(verdict(State.READY), phases=READY_PHASES, notes=("GPU: unavailable",))
    out = record_history(r, ("python", "job.py"), env)
    assert out.notes[0] == "GPU: unavailable" and len(out.notes) == 2
    assert "kept as history.sqlite3.bad-" in out.notes[1]
    assert out.phase_history is not None and out.phase_history.recorded  # into the new one


def test_compile_caches_are_warm_when_an_entry_predates_the_boot(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    start = time.time()
    caches = registry.cache_folders()
    assert not compile_caches_warm(env, start, caches)  # no cache folder at all
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "fresh").write_text("written by this boot")
    assert not compile_caches_warm(env, start - 60, caches)  # written after the boot started: cold
    old = tmp_path / "inductor" / "old"
    old.write_text("from an earlier boot")
    os.utime(old, (start - 3600, start - 3600))
    assert compile_caches_warm(env, start - 60, caches)


def test_a_local_model_folder_is_absolute_and_sized_a_hub_id_is_not(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 1234}}')
    assert local_model(str(folder)) == (str(folder.resolve()), 1234)
    assert local_model("Qwen/Qwen3-0.6B") == ("Qwen/Qwen3-0.6B", None)
    assert local_model(None) == (None, None)


def _spelled(key: BootKey, boots: int, **quiet: tuple[float, ...]) -> PastBoots:
    durations = {phase: (30.0,) * len(spells) for phase, spells in quiet.items()}
    return PastBoots(key.key_id, key, boots, "", "", durations, quiet)


def test_auto_windows_are_twice_the_longest_spell_plus_a_margin_from_three_boots_on():
    windows = {
        w.phase: w
        for w in auto_windows(
            [
                _spelled(KEY, 3, weights=(4.0, 30.0, 6.0), cuda_graph=(2.0, 1.0, 1.0), ready=(300.0,) * 3),
                _spelled(KEY, 2, compile=(90.0, 80.0)),
            ]
        )
    }
    assert windows["weights"].window_s == 2 * 30.0 + 10 and windows["weights"].boots == 3
    assert windows["weights"].longest_quiet_s == 30.0
    assert windows["cuda_graph"].window_s == 20.0  # the floor: a chatty phase still gets 20 s
    assert "compile" not in windows  # two boots are not enough to set a window
    assert "ready" not in windows  # serving keeps the fixed window


def test_auto_windows_pool_comparable_configurations_only():
    other_version = replace(KEY, engine_version="0.12.0", gpu_count=8, caches_warm=False)
    other_tp = replace(KEY, tp=2)
    assert comparable(KEY, other_version)
    assert not comparable(KEY, other_tp) and not comparable(KEY, replace(KEY, switches=("enforce-eager",)))
    pooled = auto_windows([_spelled(KEY, 2, weights=(5.0, 5.0)), _spelled(other_version, 1, weights=(40.0,))])
    assert [(w.phase, w.window_s, w.boots) for w in pooled] == [("weights", 90.0, 3)]


def test_the_launch_key_is_the_boot_key_before_what_only_the_end_knows():
    argv = ("vllm", "serve", "/m", "-tp", "2", "--enforce-eager")
    early = launch_key(argv, "vllm", model="/m", host="gpu1")
    late = boot_key(
        report(verdict(State.READY), engine="vllm"),
        argv,
        model="/m",
        model_bytes=5,
        host="gpu1",
        caches_warm=True,
    )
    assert comparable(early, late) and early.key_id != late.key_id
    assert (late.model_bytes, late.caches_warm) == (5, True) and late.switches == ("enforce-eager",)


def test_each_finished_phase_is_recorded_with_its_longest_quiet_spell():
    r = report(
        verdict(State.READY),
        phases=tuple(replace(s, quiet_s=2.5) if s.name == "weights" else s for s in READY_PHASES),
    )
    recorded = {p.phase: p.quiet_s for p in recordable(r)}
    assert recorded["weights"] == 2.5 and recorded["process_start"] is None


def test_launch_history_reads_comparable_boots_before_the_launch_and_creates_nothing(tmp_path):
    env = _env(tmp_path)
    command = ("vllm", "serve", "Qwen/Qwen3-0.6B")
    nothing = launch_history(command, "vllm", auto=True, env=env)
    assert nothing == LaunchHistory() and not (tmp_path / "state").exists()
    spelled = tuple(replace(s, quiet_s=3.0) for s in READY_PHASES)
    for n in range(3):  # another version each time: comparable all the same
        boot = report(verdict(State.READY), engine="vllm", phases=spelled, duration_s=95)
        record_history(replace(boot, environment={"vllm": f"0.1{n}.0"}), command, env)
    past = launch_history(command, "vllm", auto=True, env=env)
    assert {h.phase: h.boots for h in past.usual} == {"process_start": 3, "weights": 3, "cuda_graph": 3}
    assert {w.phase: w.window_s for w in past.windows} == {
        "process_start": 20,
        "weights": 20,
        "cuda_graph": 20,
    }
    assert launch_history(command, "vllm", auto=False, env=env).windows == ()
    other = launch_history((*command, "--enforce-eager"), "vllm", auto=True, env=env)
    assert other.usual == () and other.windows == ()
    assert (
        launch_history(("python", "-m", "hangwatch.demo.story"), "sglang", auto=True, env=env)
        == LaunchHistory()
    )
    note = auto_note(past.windows, 60)
    assert note.startswith(
        "stall window auto: process_start 20 s, weights 20 s, cuda_graph 20 s; other phases"
    )
    assert "no phase has 3 earlier boots" in auto_note((), 60)
