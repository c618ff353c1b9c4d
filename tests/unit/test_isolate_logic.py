"""hangwatch isolate's pure parts: edits on a command line, the matrix file, the order, the conclusion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hangwatch.engines import SGLANG
from hangwatch.engines import VLLM
from hangwatch.errors import UsageError
from hangwatch.isolate.conclude import conclude
from hangwatch.isolate.conclude import fisher_one_sided
from hangwatch.isolate.conclude import runs_to_settle
from hangwatch.isolate.matrix import parse_matrix
from hangwatch.isolate.plan import applicable
from hangwatch.isolate.plan import order
from hangwatch.isolate.plan import pairs
from hangwatch.isolate.state import IsolateState
from hangwatch.isolate.state import load_state
from hangwatch.isolate.state import resumed_options
from hangwatch.isolate.toggles import apply_edits
from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import RunResult
from hangwatch.model.isolate import Toggle
from hangwatch.model.isolate import TrialResult
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State

ARGV = ("serve", "m", "--spec", "on", "--graphs=on", "--enforce-eager", "--port", "8000")


def test_remove_takes_the_flag_and_its_value_in_both_forms() -> None:
    assert apply_edits(ARGV, (Edit(EditKind.REMOVE, "--spec"),)).argv == (
        "serve", "m", "--graphs=on", "--enforce-eager", "--port", "8000",
    )  # fmt: skip
    assert apply_edits(ARGV, (Edit(EditKind.REMOVE, "--graphs"),)).argv == (
        "serve", "m", "--spec", "on", "--enforce-eager", "--port", "8000",
    )  # fmt: skip
    # A switch: the next argument is an option, not its value.
    assert apply_edits(ARGV, (Edit(EditKind.REMOVE, "--enforce-eager"),)).argv == (
        "serve", "m", "--spec", "on", "--graphs=on", "--port", "8000",
    )  # fmt: skip


def test_remove_a_prefix_and_aliases() -> None:
    argv = ("x", "--speculative-algorithm", "EAGLE", "--speculative-num-steps=3", "--tp", "2")
    assert apply_edits(argv, (Edit(EditKind.REMOVE, "--speculative-*"),)).argv == ("x", "--tp", "2")
    tp1 = Edit(EditKind.REPLACE, "--tp-size", "1", aliases=("--tensor-parallel-size", "--tp"))
    assert apply_edits(argv, (tp1,)).argv[-2:] == ("--tp", "1")


def test_replace_keeps_the_form_and_adds_when_absent() -> None:
    assert "--graphs=off" in apply_edits(ARGV, (Edit(EditKind.REPLACE, "--graphs", "off"),)).argv
    got = apply_edits(ARGV, (Edit(EditKind.REPLACE, "--spec", "off"),)).argv
    assert got[2:4] == ("--spec", "off") and len(got) == len(ARGV)
    assert apply_edits(ARGV, (Edit(EditKind.REPLACE, "--backend", "safe"),)).argv[-2:] == (
        "--backend",
        "safe",
    )


def test_add_and_environment() -> None:
    applied = apply_edits(
        ARGV,
        (
            Edit(EditKind.ADD, "--strict"),
            Edit(EditKind.ENV, "NCCL_P2P_DISABLE", "1"),
            Edit(EditKind.UNSET_ENV, "NCCL_DEBUG"),
        ),
    )
    assert applied.argv[-1] == "--strict"
    env = applied.environment({"NCCL_DEBUG": "INFO", "PATH": "/bin"})
    assert env == {"NCCL_P2P_DISABLE": "1", "PATH": "/bin"}


MATRIX = """
[[toggle]]
name = "no-spec"
remove = ["--spec"]
[[toggle]]
name = "graphs-off"
replace = { "--graphs" = "off" }
[[toggle]]
name = "eager"
add = ["--enforce-eager"]
[[toggle]]
name = "p2p-off"
env = { NCCL_P2P_DISABLE = "1" }
unset_env = ["NCCL_DEBUG"]
"""


def test_the_issue_example_matrix_parses() -> None:
    toggles = parse_matrix(MATRIX)
    assert [t.name for t in toggles] == ["no-spec", "graphs-off", "eager", "p2p-off"]
    assert toggles[1].edits == (Edit(EditKind.REPLACE, "--graphs", "off"),)
    assert [e.kind for e in toggles[3].edits] == [EditKind.ENV, EditKind.UNSET_ENV]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[toggle]]\nname = "a"\nremove = ["--x"]\nremvoe = ["--y"]', "unknown key(s) remvoe"),
        ('[[toggle]]\nname = "a"', "no edits"),
        ('[[toggle]]\nremove = ["--x"]', "needs a name"),
        ("this is not toml {", "not valid TOML"),
        ('[[toggle]]\nname = "a"\nremove = "--x"\n[[toggle]]\nname = "a"\nadd = ["--y"]', "two toggles"),
        ('[[toggle]]\nname = "a"\nremove = ["x"]', "not a flag"),
        ('[[toggle]]\nname = "a"\nadd = ["--x"]\ncauses = ["slow"]', "unknown cause"),
        ('[toggles]\nname = "a"', "unknown top-level"),
        ("", "no [[toggle]]"),
    ],
)
def test_bad_matrix_files_say_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_matrix(text, "m.toml")
    assert says in str(info.value)
    assert info.value.exit_code == 2


def test_the_baseline_cause_orders_the_toggles() -> None:
    toggles = parse_matrix(MATRIX)
    assert [t.name for t in order(toggles, Cause.CUDA_GRAPH_CAPTURE)][:3] == [
        "no-spec",
        "graphs-off",
        "eager",
    ]
    assert [t.name for t in order(toggles, Cause.COLLECTIVE_WAIT)][:2] == ["no-spec", "p2p-off"]
    assert order(toggles, None) == toggles


def test_toggles_that_change_nothing_are_not_run() -> None:
    toggles = parse_matrix(MATRIX)
    found, notes = applicable(toggles, ("x", "--enforce-eager"), {})
    assert [c.toggle.name for c in found] == ["graphs-off", "p2p-off"]
    assert any("no-spec" in n for n in notes) and any("eager" in n for n in notes)
    found, _ = applicable(toggles, ("x",), {"NCCL_P2P_DISABLE": "1"})
    assert [c.toggle.name for c in found] == ["graphs-off", "eager"]


def test_pairs_leave_out_toggles_that_boot_alone() -> None:
    toggles = parse_matrix(MATRIX)
    got = pairs(toggles, {"graphs-off"}, ("x", "--spec", "on"), {})
    names = [c.toggle.name for c in got]
    assert "no-spec+eager" in names and "no-spec+p2p-off" in names
    assert not any("graphs-off" in n for n in names)


def test_vllm_builtin_toggles_apply_only_where_they_change_something() -> None:
    tp1 = ("vllm", "serve", "m")
    assert [t.name for t in VLLM.toggles(tp1, None)] == ["eager"]
    tp2 = ("vllm", "serve", "m", "-tp", "2", "--speculative-config", "{}", "--enforce-eager")
    names = [t.name for t in VLLM.toggles(tp2, None)]
    assert names == ["no-spec", "custom-all-reduce-off", "nccl-p2p-off", "nccl-cumem-off", "tp-1"]
    spec_off = apply_edits(tp2, next(t for t in VLLM.toggles(tp2, None) if t.name == "no-spec").edits)
    assert "--speculative-config" not in spec_off.argv and "{}" not in spec_off.argv
    tp_one = apply_edits(tp2, next(t for t in VLLM.toggles(tp2, None) if t.name == "tp-1").edits)
    assert tp_one.argv[3:5] == ("-tp", "1")


def test_sglang_graphs_off_follows_the_installed_version() -> None:
    argv = ("python", "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE")
    old = next(t for t in SGLANG.toggles(argv, "0.5.10.post1") if t.name == "graphs-off")
    assert old.edits == (Edit(EditKind.ADD, "--disable-cuda-graph"),)
    new = next(t for t in SGLANG.toggles(argv, "0.5.23") if t.name == "graphs-off")
    assert [e.name for e in new.edits] == ["--cuda-graph-backend-decode", "--cuda-graph-backend-prefill"]
    names = [t.name for t in SGLANG.toggles((*argv, "--disable-cuda-graph", "--tp", "2"), None)]
    assert "graphs-off" not in names and "tp-1" in names and "no-spec" in names


def test_fisher_one_sided() -> None:
    assert fisher_one_sided(1, 1, 0, 1) == pytest.approx(0.5)
    assert fisher_one_sided(3, 3, 0, 3) == pytest.approx(0.05)
    assert fisher_one_sided(2, 3, 1, 3) == pytest.approx(0.5)
    assert fisher_one_sided(0, 3, 3, 3) == pytest.approx(1.0)
    assert runs_to_settle(1, 1, 0, 1) == 3
    assert runs_to_settle(2, 3, 2, 3) is None


def _verdict(state: State, cause: Cause | None = None) -> Verdict:
    return Verdict(state, cause, "cuda_graph (capturing CUDA graphs)", f"{state.value}: x", (), ())


def _trial(index: int, name: str, states: list[State], cause: Cause | None = None) -> TrialResult:
    runs = tuple(_verdict(s, cause if s is not State.READY else None) for s in states)
    fail = [v for v in runs if v.state is not State.READY]
    return TrialResult(
        index=index,
        name=name,
        toggles=(name,) if index else (),
        why=f"{name} off",
        edits=(),
        command=("x",),
        verdict=fail[0] if fail else runs[0],
        runs=runs,
        durations_s=tuple(1.0 for _ in runs),
        run_dirs=tuple("d" for _ in runs),
        booted=sum(v.state is State.READY for v in runs),
        repeat=len(runs),
    )


R, S = State.READY, State.STALLED


def test_conclusion_names_a_culprit_with_its_confidence() -> None:
    base = _trial(0, "baseline", [S, S, S], Cause.CUDA_GRAPH_CAPTURE)
    c = conclude(base, (_trial(1, "p2p-off", [S, S, S]), _trial(2, "no-spec", [R, R, R])))
    assert c.culprit_toggles == ("no-spec",)
    assert c.confidence == "high"
    assert "3 of 3 booted with it, 0 of 3 without" in c.summary and "p = 0.05" in c.summary
    assert "cuda-graph-capture" in c.summary
    one = conclude(_trial(0, "baseline", [S]), (_trial(1, "no-spec", [R]),))
    assert one.culprit_toggles == ("no-spec",) and one.confidence == "medium"
    assert "--repeat 3" in one.summary


def test_weak_evidence_is_inconclusive_with_counts_and_runs_to_settle() -> None:
    c = conclude(_trial(0, "baseline", [S, R, S]), (_trial(1, "p2p-off", [R, S, R]),))
    assert c.culprit_toggles == ()
    assert c.confidence == "none"
    assert c.summary.startswith("inconclusive: 2 of 3 booted with it, 1 of 3 without")
    assert c.runs_to_settle is not None and c.runs_to_settle > 3
    assert f"about {c.runs_to_settle} runs each" in c.summary


def test_a_baseline_that_boots_has_nothing_to_isolate() -> None:
    c = conclude(_trial(0, "baseline", [R]), ())
    assert "no failure to isolate" in c.summary and c.culprit_toggles == ()


def test_state_round_trip(tmp_path: Path) -> None:
    toggle = Toggle(
        "no-spec", (Edit(EditKind.REMOVE, "--spec", aliases=("-s",)),), "spec off", (Cause.STOPPED,)
    )
    state = IsolateState(tmp_path / "isolate-state.json", ("prog", "--spec", "on"), 2, (toggle,))
    run = RunResult(_verdict(S, Cause.CUDA_GRAPH_CAPTURE), 3.5, str(tmp_path / "trial-00"), ("a [1]",), 0.4)
    state.add("baseline", (), run)
    back = load_state(tmp_path, None)
    assert back.command == state.command and back.repeat == 2 and back.toggles == (toggle,)
    assert back.done("baseline", ()) == [run]
    assert back.done("no-spec", toggle.edits) == []
    with pytest.raises(UsageError, match="another command"):
        load_state(tmp_path, ("prog", "--spec", "off"))


def test_a_command_with_secrets_is_not_kept(tmp_path: Path) -> None:
    state = IsolateState(tmp_path / "isolate-state.json", ("prog", "--api-key", "sk-secret123456"), 1, ())
    state.save()
    assert "sk-secret123456" not in (tmp_path / "isolate-state.json").read_text()
    with pytest.raises(UsageError, match="held secrets"):
        load_state(tmp_path, None)
    assert load_state(tmp_path, state.command).command == state.command


SAVED = {"stall_after": 3.0, "ready_pattern": "listening", "run_all": True, "budget": 600.0, "grace": 2.0}


def test_resume_keeps_every_option_and_uses_the_saved_ones(tmp_path: Path) -> None:
    """Issue 24 item 6: --resume forgot --stall-after, --ready-pattern and --all."""
    state = IsolateState(tmp_path / "isolate-state.json", ("prog",), 1, (), options=dict(SAVED))
    state.save()
    back = load_state(tmp_path, None)
    assert back.options == SAVED
    defaults = {"stall_after": 60.0, "ready_pattern": None, "run_all": False, "grace": 10.0, "interval": 1.0}
    merged = resumed_options(tmp_path, back.options or {}, {}, defaults)
    assert merged["stall_after"] == 3.0 and merged["ready_pattern"] == "listening" and merged["run_all"]
    assert merged["interval"] == 1.0  # not kept by the earlier run: the default
    # The same values given again, and a new --budget (this invocation's time): accepted.
    again = resumed_options(tmp_path, SAVED, {"stall_after": 3.0, "run_all": True, "budget": 60.0}, defaults)
    assert again["budget"] == 60.0


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"stall_after": 60.0}, "--stall-after 60 given, but that isolate ran with --stall-after 3"),
        ({"ready_pattern": "ready now"}, "--ready-pattern 'ready now' given, but that isolate ran with "
                                         "--ready-pattern listening"),
        ({"pairs": True}, "--pairs given, but that isolate ran with no --pairs"),
    ],
)  # fmt: skip
def test_resume_refuses_options_that_differ_from_the_saved_ones(
    tmp_path: Path, given: dict[str, object], says: str
) -> None:
    with pytest.raises(UsageError) as e:
        resumed_options(tmp_path, SAVED, given, {})
    text = str(e.value)
    assert says in text and "leave --" in text and "\n" not in text and not e.value.help_text


def test_an_old_state_file_without_options_still_loads(tmp_path: Path) -> None:
    state = IsolateState(tmp_path / "isolate-state.json", ("prog",), 1, ())
    state.save()
    data = json.loads(state.path.read_text())
    del data["options"]
    state.path.write_text(json.dumps(data))
    assert load_state(tmp_path, None).options is None


def test_trial_numbers_in_progress_are_the_table_s(tmp_path: Path) -> None:
    """The table and the run directories number the baseline 0 (trial-00); progress said 'trial 1 of N'."""
    from hangwatch.isolate.session import IsolateOptions
    from hangwatch.isolate.session import Isolation
    from hangwatch.render.isolate_progress import Progress
    from hangwatch.supervise.plan import WatchOptions

    options = IsolateOptions(
        command=("prog",), watch=WatchOptions(None, None, None, (), 3.0, None, 1.0, None, True, 1.0), grace=1.0, run_dir=tmp_path, repeat=1, budget_s=None,
        run_all=False, pairs=False, toggles=(),
    )  # fmt: skip
    isolation = Isolation(options, IsolateState(tmp_path / "s.json", ("prog",), 1, ()), Progress(print))
    isolation.planned = 4  # the baseline and three changes
    assert isolation.label(0, "baseline") == "trial 0 (baseline)"
    assert isolation.label(3, "graphs-off") == "trial 3 of 3 (graphs-off)"
