"""Phase history end to end: two real boots under ``hangwatch run``, the second's report against the first,
``hangwatch history`` listing and forgetting them; a damaged database set aside by the command.

The state folder is this test's (conftest's ``state_dir``: $XDG_STATE_HOME in a temporary folder).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from hwrun import hangwatch_argv
from hwrun import program
from proc_helpers import free_port

pytestmark = pytest.mark.timeout(180)


def _boot(hw, tmp_path, n: int):
    port = free_port()
    return hw(
        "run", "--until-ready", "--quiet", "--no-doctor", "--no-own-request", "--engine", "vllm",
        "--report-html", str(tmp_path / f"report{n}.html"), "--report-md", str(tmp_path / f"report{n}.md"),
        "--interval", "0.25", "--ready-pattern", "READY to serve", "--run-dir", str(tmp_path / f"run{n}"),
        "--", *program("phase_boot", "--pause", "1.0", "--port", str(port)),
        env=_cold_caches(tmp_path),
    )  # fmt: skip


def _cold_caches(tmp_path) -> dict[str, str]:
    """Compile caches of the test's own, empty: the key's "caches warm" is the same for both boots."""
    caches = tmp_path / "caches"
    names = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH")
    env = {name: str(caches / name.lower()) for name in names}
    env["FLASHINFER_WORKSPACE_BASE"] = str(caches / "flashinfer")
    return env


def _history(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hangwatch_argv("history", *args), capture_output=True, text=True, timeout=60, check=False
    )


def test_two_boots_the_second_against_the_first_then_listed_and_forgotten(hw, tmp_path, state_dir):
    first = _boot(hw, tmp_path, 1)
    assert first.rc == 0, first.stderr
    h1 = first.report["phase_history"]
    assert h1["earlier_boots"] == 0 and h1["lines"] == [] and h1["recorded"] is True
    assert (state_dir / "history.sqlite3").is_file()

    second = _boot(hw, tmp_path, 2)
    assert second.rc == 0, second.stderr
    h2 = second.report["phase_history"]
    assert h2["key_id"] == h1["key_id"] and h2["earlier_boots"] == 1
    lines = {line["phase"]: line for line in h2["lines"]}
    assert {"process_start", "weights", "model_loaded"} <= set(lines)
    first_phases = {p["name"]: p["end"] - p["start"] for p in first.report["phases"] if p["end"] is not None}
    weights = lines["weights"]
    # The usual range is the first boot's duration exactly: read before the second was added.
    assert weights["usual"]["boots"] == 1
    assert weights["usual"]["lo_s"] == pytest.approx(first_phases["weights"], abs=0.01)
    assert weights["finished"] is True and weights["standing"] == "within"
    assert "ready" not in lines  # serving is not a boot phase
    # The verdict a person reads says the same, in the block under the next steps.
    shown = second.stdout + second.stderr
    assert f"history: 1 earlier boot of this configuration, recorded (id {h2['key_id']}" in shown, shown
    assert "    - weights: " in shown and "(usual " in shown
    page = (tmp_path / "report2.html").read_text()
    assert "<h2>Phase history</h2>" in page and "1 earlier boot of this configuration" in page
    assert "weights: " in page.split("<h2>Phase history</h2>", 1)[1]
    md = (tmp_path / "report2.md").read_text()
    assert f"History: 1 earlier boot of this configuration, recorded (id `{h2['key_id']}`" in md

    listed = _history("--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["schema"] == "hangwatch.history/1"
    [config] = data["configurations"]
    assert config["key_id"] == h1["key_id"] and config["boots"] == 2
    assert config["key"]["engine"] == "vllm" and config["key"]["program"].endswith("phase_boot.py")
    assert [p["phase"] for p in config["phases"]] == ["process_start", "weights", "model_loaded"]
    assert all(p["boots"] == 2 for p in config["phases"])

    text = _history()
    assert text.returncode == 0
    assert h1["key_id"] in text.stdout and "weights: usual" in text.stdout

    wrong = _history("--forget", "ffffffffffff" if not h1["key_id"].startswith("f") else "000000000000")
    assert wrong.returncode == 2
    assert len(wrong.stderr.strip().splitlines()) == 1 and "no configuration" in wrong.stderr

    gone = _history("--forget", h1["key_id"][:6])
    assert gone.returncode == 0, gone.stderr
    assert f"forgot configuration {h1['key_id']} (2 boots)" in gone.stdout
    assert json.loads(_history("--json").stdout)["configurations"] == []


def test_history_sets_a_damaged_database_aside_in_one_line(state_dir):
    state_dir.mkdir(parents=True)
    (state_dir / "history.sqlite3").write_bytes(b"not sqlite at all\n" * 100)
    out = _history()
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "kept as history.sqlite3.bad-" in notes[0], out.stdout
    [aside] = state_dir.glob("history.sqlite3.bad-*")
    assert aside.read_bytes() == b"not sqlite at all\n" * 100  # kept, never lost


def test_no_history_yet_is_said_and_creates_nothing(state_dir):
    out = _history()
    assert out.returncode == 0
    assert "0 configurations" in out.stdout and "none yet" in out.stdout
    assert not (state_dir / "history.sqlite3").exists()


def _auto_boot(hw, tmp_path, n: int, *extra: str, stall: str = "auto", interval: str = "0.25"):
    port = free_port()
    return hw(
        "run", "--until-ready", "--quiet", "--no-doctor", "--no-own-request", "--no-stacks", "--engine", "vllm",
        "--stall-after", stall, "--interval", interval, "--ready-pattern", "READY to serve",
        "--run-dir", str(tmp_path / f"auto{n}"),
        "--", *program("phase_boot", "--pause", "0.5", "--port", str(port), *extra),
        env=_cold_caches(tmp_path),
    )  # fmt: skip


def test_stall_after_auto_draws_each_phase_window_from_the_boots_before(hw, tmp_path, state_dir):
    """Three real boots time each phase's quiet spells; the fourth, under --stall-after auto, hangs in a
    phase whose spells were short and is called stalled at that phase's window (the 20 s floor), not at
    the fixed 60 s; a fifth of another configuration (a switch) has no history and keeps 60 s."""
    # The first boot has no history: every phase keeps the fixed window, and the note says why.
    first = _auto_boot(hw, tmp_path, 0)
    assert first.rc == 0, first.stderr
    assert first.report["stall_windows"] == []
    assert any("stall window auto: no phase has 3 earlier boots" in n for n in first.report["notes"])
    for n in (1, 2):
        assert _auto_boot(hw, tmp_path, n).rc == 0
    spells = json.loads(_history("--json").stdout)["configurations"]
    assert len(spells) == 1 and spells[0]["boots"] == 3

    hung = _auto_boot(hw, tmp_path, 3, "--hang-in", "model_loaded")
    assert hung.rc == 3, hung.stdout + hung.stderr
    windows = {w["phase"]: w for w in hung.report["stall_windows"]}
    assert {"process_start", "weights", "model_loaded"} <= set(windows)
    loaded = windows["model_loaded"]
    assert loaded["boots"] == 3 and loaded["longest_quiet_s"] < 5 and loaded["window_s"] == 20
    verdict = hung.report["verdict"]
    assert verdict["state"] == "stalled" and hung.report["stall_after_s"] == 20
    entered = next(p["start"] for p in hung.report["phases"] if p["name"] == "model_loaded")
    # Stalled at the phase's own window (20 s of quiet, a tick or two after), well before the fixed 60 s.
    assert 20 <= hung.report["duration_s"] - entered < 40, hung.report["duration_s"] - entered
    shown = hung.stdout + hung.stderr
    assert "stall window auto: " in shown and "model_loaded 20 s" in shown
    # The hung phase is not recorded: a hang's quiet is not how long the phase's spells last.
    assert json.loads(_history("--json").stdout)["configurations"][0]["boots"] == 4

    # A switch makes another configuration: none of those boots set its windows.
    other = _auto_boot(hw, tmp_path, 4, "--enforce-eager")
    assert other.rc == 0, other.stderr
    assert other.report["stall_windows"] == []


def test_stall_after_auto_is_refused_where_no_boot_is_timed(hw):
    out = hw("attach", "--pid", "1", "--window", "5", "--stall-after", "auto")
    assert out.rc == 2 and "only for run and isolate" in out.stderr, out.stderr
    bad = hw("run", "--stall-after", "soon", "--", "true")
    assert bad.rc == 2 and "--stall-after auto" in bad.stderr, bad.stderr
