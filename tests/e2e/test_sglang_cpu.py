"""End-to-end: real SGLang 0.5.23 (CPU engine) on a tiny random Llama, under `hangwatch run` and `cleanup`.

Measured on the 2-core CI machine (docs/sglang-cpu.md): /health answers 200 20-45 s after launch, nearly all
of it imports (each scheduler re-imports sglang); load, KV allocation and warm-up take under 2 s at TP=1.
Every run leaves a 16 KB /dev/shm/sglang_loads_*.shm behind (TP=2 also sgl_shm_mq_*), even after a clean
SIGTERM, and a scheduler hung before it is ready survives a SIGTERM of the launcher: the tests check that
hangwatch stops such a tree completely and that `hangwatch cleanup` removes those segments.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hangwatch_run import HangwatchRun
from hangwatch_run import describe
from hangwatch_run import load_report
from hangwatch_run import mapped_shm
from hangwatch_run import report_pids
from sglang_env import sglang_server_cmd
from sglang_env import sglang_server_env
from sglang_hold_scheduler import HELD_LINE

from hwrun import hangwatch_argv
from proc_helpers import spawn
from proc_helpers import tree_of
from proc_helpers import wait_until

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

# hangwatch's own --timeout: far above a measured boot (20-45 s) so only a real regression reaches it, and
# below the pytest timeout so hangwatch (not pytest) reports what it saw.
BOOT_TIMEOUT_S = 300
# Imports keep a core busy for 10-30 s without a log line; that must not read as a stall.
STALL_AFTER_S = 45
LOADS_SHM = "/dev/shm/sglang_loads_"
MQ_SHM = "/dev/shm/sgl_shm_mq_"
LAUNCHER_MARK = "sglang.launch_server"
HOLD_HOOK = Path(__file__).resolve().with_name("sglang_hold_scheduler.py")
# How long the orphaned scheduler is watched after its launcher exited (a PDEATHSIG would act at once).
ORPHAN_WATCH_S = 3.0


def run_args(report: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "--until-ready",
        "--stall-after", str(STALL_AFTER_S),
        "--timeout", str(BOOT_TIMEOUT_S),
        "--report-json", str(report),
        "--run-dir", str(run_dir),
        *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def boot_to_ready(
    python: Path,
    model: Path,
    port: int,
    env: dict[str, str],
    tmp_path: Path,
    *,
    tp: int,
    engine_args: list[str],
) -> Iterator[tuple[dict[str, Any], HangwatchRun]]:
    """`hangwatch run --until-ready` on the server; asserts ready and a fully stopped tree; yields the report.

    On the way out (whatever failed) every process of the tree is killed and its /dev/shm files removed.
    """
    report_path = tmp_path / "report.json"
    args = [
        *engine_args,
        *run_args(report_path, tmp_path / "run"),
        "--",
        *sglang_server_cmd(python, model, port, tp=tp),
    ]
    run = HangwatchRun(args, sglang_server_env(env, tp=tp), tmp_path / "hangwatch.log", watch_shm=True)
    try:
        rc = run.wait(BOOT_TIMEOUT_S + 90)
        assert rc is not None, f"hangwatch still running after {BOOT_TIMEOUT_S + 90} s\n{run.tail()}"
        report = load_report(report_path, run)
        context = describe(report, run)
        assert rc == 0, f"exit {rc}, expected 0 (ready)\n{context}"
        assert report["engine"] == "sglang", f"engine {report['engine']!r}\n{context}"
        assert report["verdict"]["state"] == "ready", context

        names = [p["name"] for p in report["phases"]]
        # The phases SGLang 0.5.23 logs on the CPU engine, in order; each rank logs them, and a later rank
        # must neither move the phase back nor open it "again".
        expected = [
            "args",
            "dist_init",
            "weights",
            "weights_loaded",
            "kv_alloc",
            "scheduler_ready",
            "http_up",
            "ready",
        ]
        # Exactly these: no draft_weights (there is no draft model), no cuda_graph (none on CPU).
        assert names == ["process_start", *expected], f"phases {names}\n{context}"
        # /health: refused until every scheduler is ready (uvicorn starts after them), 503 during the warm-up.
        # hangwatch usually ends on the "fired up" line before a probe sees the 200 that follows it.
        statuses = {p.get("status") for p in report["probes"] if p.get("outcome") == "http"}
        assert statuses <= {200, 503}, f"/health answered {statuses}\n{context}"
        assert any(p.get("outcome") == "refused" for p in report["probes"]), (
            f"probes never refused\n{context}"
        )

        survivors = run.survivors(report_pids(report))
        assert not survivors, "processes outlived hangwatch:\n" + "\n".join(survivors)
        assert any(p.startswith(LOADS_SHM) for p in run.shm_seen), (
            f"the tree mapped no {LOADS_SHM}*: {run.shm_seen}"
        )
        yield report, run
    finally:
        run.kill_all()


def roles(report: dict[str, Any]) -> set[tuple[str | None, str | None]]:
    return {(p.get("role"), p.get("rank")) for p in report["processes"]}


@pytest.mark.timeout(600, func_only=True)  # func_only: the first session's venv build is not a boot
def test_tp1_boot_reaches_ready(
    sglang_python: Path,
    sglang_tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    # No --engine and no --ready-url: the SGLang profile is detected from the command line, and /health is
    # derived from its --host/--port.
    with boot_to_ready(
        sglang_python, sglang_tiny_model, free_port, hangwatch_env, tmp_path, tp=1, engine_args=[]
    ) as (report, run):
        context = describe(report, run)
        found = roles(report)
        # At TP=1 the scheduler's title has no rank suffix: sglang::scheduler.
        assert {("main", None), ("scheduler", None), ("detokenizer", None)} <= found, (
            f"roles {found}\n{context}"
        )
        probe_urls = {p.get("url") for p in report["probes"]}
        assert f"http://127.0.0.1:{free_port}/health" in probe_urls, f"probes {probe_urls}\n{context}"


@pytest.mark.timeout(600, func_only=True)
def test_tp2_boot_reaches_ready_with_ranked_schedulers(
    sglang_python: Path,
    sglang_tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    with boot_to_ready(
        sglang_python,
        sglang_tiny_model,
        free_port,
        hangwatch_env,
        tmp_path,
        tp=2,
        engine_args=["--engine", "sglang"],
    ) as (report, run):
        context = describe(report, run)
        found = roles(report)
        # sglang::scheduler_TP0 / sglang::scheduler_TP1 (comm is cut to "sglang::schedul": the title is
        # read from cmdline).
        assert {("scheduler", "TP0"), ("scheduler", "TP1"), ("detokenizer", None)} <= found, (
            f"roles {found}\n{context}"
        )
        assert ("scheduler", None) not in found, f"a scheduler without its rank: {found}\n{context}"
        assert any(p.startswith(MQ_SHM) for p in run.shm_seen), f"no {MQ_SHM}* mapped at TP=2: {run.shm_seen}"


def get_status(url: str, timeout: float) -> int | None:
    """The HTTP status of GET url; None when nothing answers (SGLang binds its port only when ready)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, TimeoutError):
        return None


def wait_healthy(url: str, server: subprocess.Popen[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, (
            f"the server exited with {server.returncode} before /health answered 200"
        )
        # Each /health runs a one-token generation; give it SGLang's own 20 s health timeout.
        if get_status(url, timeout=25) == 200:
            return
        time.sleep(1)
    raise AssertionError(f"{url} did not answer 200 within {timeout:.0f} s")


@pytest.mark.timeout(600, func_only=True)
def test_cleanup_by_port_removes_the_tree_and_its_shm_segments(
    sglang_python: Path,
    sglang_tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """A TP=2 server started outside hangwatch, named by its port: every process and both shm segments go."""
    env = sglang_server_env(hangwatch_env, tp=2)
    log = (tmp_path / "server.log").open("w")
    cmd = sglang_server_cmd(sglang_python, sglang_tiny_model, free_port, tp=2)
    segments: set[str] = set()
    try:
        with spawn(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT) as server:
            wait_healthy(f"http://127.0.0.1:{free_port}/health", server, BOOT_TIMEOUT_S)
            tree = tree_of(server.pid)
            members = {(p.pid, p.create_time()) for p in tree}
            segments = mapped_shm(tree)
            loads = {p for p in segments if p.startswith(LOADS_SHM)}
            mq = {p for p in segments if p.startswith(MQ_SHM)}
            assert loads and mq, f"expected {LOADS_SHM}* and {MQ_SHM}* among the tree's segments: {segments}"
            assert len(members) >= 4, f"launcher, 2 schedulers, detokenizer expected: {tree}"

            out = subprocess.run(
                hangwatch_argv("cleanup", "--port", str(free_port), "--grace", "10"),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                env=hangwatch_env,
            )
            text = out.stdout + out.stderr
            assert out.returncode == 0, f"cleanup exited {out.returncode}\n{text}"
            left = [pid for pid, created in members if _alive(pid, created)]
            assert not left, f"cleanup left {left}\n{text}"
            for path in sorted(loads | mq):
                assert not os.path.exists(path), f"{path} still there\n{text}"
                assert f"shm {path}: removed" in text, text
            server.wait(timeout=10)  # our child: reap it (cleanup leaves that to the parent)
    finally:
        log.close()
        for path in segments:  # if cleanup failed: what the dead tree left
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _gone_or_zombie(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _alive(pid: int, created: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - created) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.timeout(600, func_only=True)
def test_scheduler_hung_before_ready_outlives_the_launcher_but_not_hangwatch(
    sglang_python: Path,
    sglang_tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """A scheduler held at the start of its process target (sglang_hold_scheduler.py, chained from the
    shims' sitecustomize) has not yet set PR_SET_PDEATHSIG: when the launcher gets SIGTERM and exits, the
    scheduler does not. hangwatch must still end with no process of the tree left."""
    env = sglang_server_env(hangwatch_env)
    env["HANGWATCH_EXTRA_SITECUSTOMIZE"] = str(HOLD_HOOK)
    report_path = tmp_path / "report.json"
    args = [
        "--engine", "sglang",
        *run_args(report_path, tmp_path / "run"),
        "--",
        *sglang_server_cmd(sglang_python, sglang_tiny_model, free_port),
    ]  # fmt: skip
    run = HangwatchRun(args, env, tmp_path / "hangwatch.log", watch_shm=True)
    try:
        line = run.wait_for_line(HELD_LINE, timeout=BOOT_TIMEOUT_S)
        assert line is not None, f"the scheduler was never held ({HELD_LINE!r})\n{run.tail()}"
        scheduler = psutil.Process(int(line.rsplit(" ", 1)[1]))
        launcher = next(
            (
                p
                for p in run.descendants()
                if p.ppid() == run.proc.pid and LAUNCHER_MARK in " ".join(p.cmdline())
            ),
            None,
        )
        assert launcher is not None, f"no launcher child of hangwatch\n{run.tail()}"
        assert scheduler.ppid() == launcher.pid, f"held pid {scheduler.pid} is not the launcher's child"

        # hangwatch is held stopped meanwhile: it would stop the whole tree the moment its root exits, and
        # then nobody could see what the launcher's SIGTERM alone leaves behind.
        os.kill(run.proc.pid, signal.SIGSTOP)
        try:
            launcher.send_signal(signal.SIGTERM)
            wait_until(
                lambda: _gone_or_zombie(launcher), 30, interval=0.2, what="the launcher to exit on SIGTERM"
            )
            # The fact this test is about: the held scheduler outlives its launcher, reparented to the
            # subreaper (hangwatch); without one it would go to PID 1 and nobody would account for it.
            deadline = time.monotonic() + ORPHAN_WATCH_S
            while time.monotonic() < deadline:
                assert not _gone_or_zombie(scheduler), (
                    f"the held scheduler died with its launcher: this test no longer tests an orphan\n{run.tail()}"
                )
                time.sleep(0.2)
            assert scheduler.ppid() == run.proc.pid, (
                f"the orphan's parent is {scheduler.ppid()}, not hangwatch"
            )
        finally:
            os.kill(run.proc.pid, signal.SIGCONT)

        rc = run.wait(120)
        assert rc is not None, f"hangwatch still running 120 s after the launcher exited\n{run.tail()}"
        report = load_report(report_path, run)
        context = describe(report, run)
        assert report["verdict"]["state"] != "ready", context
        survivors = run.survivors([*report_pids(report), scheduler.pid])
        assert not survivors, "processes outlived hangwatch:\n" + "\n".join(survivors) + f"\n{context}"
    finally:
        run.kill_all()


@pytest.mark.timeout(600, func_only=True)
@pytest.mark.parametrize("sleep_on_idle", [True, False], ids=["sleep-on-idle", "spinning-idle"])
def test_an_idle_tp2_server_is_waiting_for_work_not_in_a_collective_wait(
    sleep_on_idle: bool,
    sglang_python: Path,
    sglang_tiny_model: Path,
    free_port: int,
    hangwatch_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Between requests TP1 waits in the broadcast of TP0's next requests while TP0 sleeps in its request
    poll: read as a collective wait with TP0 the culprit until the rule for a group waiting for work.

    Without ``--sleep-on-idle`` both schedulers spin through their event loop at 100 % of a core, TP0
    broadcasting its (empty) requests to TP1 every turn: the bytes flowing show both moving."""
    env = sglang_server_env(hangwatch_env, tp=2)
    log = (tmp_path / "server.log").open("w")
    cmd = sglang_server_cmd(sglang_python, sglang_tiny_model, free_port, tp=2, sleep_on_idle=sleep_on_idle)
    report = tmp_path / "stacks.json"
    segments: set[str] = set()
    try:
        with spawn(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT) as server:
            wait_healthy(f"http://127.0.0.1:{free_port}/health", server, BOOT_TIMEOUT_S)
            segments = mapped_shm(tree_of(server.pid))
            out = subprocess.run(
                hangwatch_argv(
                    "stacks", "--pid", str(server.pid), "--samples", "2", "--every", "1",
                    "--report-json", str(report),
                ),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                env=hangwatch_env,
            )  # fmt: skip
            text = out.stdout + out.stderr
            assert out.returncode == 0, f"stacks exited {out.returncode}\n{text}"
            diagnosis = json.loads(report.read_text())["diagnosis"]
            assert diagnosis["culprits"] == [], text
            if not sleep_on_idle and diagnosis["cause"] == "unknown":
                # Both schedulers turn through their loop, moving data: where TP0 was not caught in its
                # request poll (inside the broadcast it feeds, or in the loop's body), no wait is named.
                assert "no rule matched" in diagnosis["explanation"], text
                return
            assert diagnosis["cause"] == "idle", text
            assert "TP1 waiting in broadcast" in diagnosis["explanation"], text
            assert "no client request waits for an answer" in diagnosis["explanation"], text
    finally:
        log.close()
        for path in segments:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
