"""Prove that every purpose-built program in this folder really behaves as its name says.

Each test starts the real program through :func:`proc_helpers.spawn` (own session, whole tree reaped
descendants first), waits on its readiness handshake or on kernel state, never on a bare sleep, and then
checks what a hang detector would see: /proc states, CPU time, I/O counters, sockets, log lines, stacks.
The few ``time.sleep`` / ``cpu_delta`` windows below are deliberate measurement periods ("CPU did not
move for 0.5 s", "rchar grew by 1 MiB in 0.5 s"), never waits for something to happen.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

# proc_helpers lives in tests/, which is not a package; make it importable however pytest was started.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from proc_helpers import cpu_delta  # noqa: E402
from proc_helpers import free_port  # noqa: E402
from proc_helpers import proc_cmdline  # noqa: E402
from proc_helpers import proc_comm  # noqa: E402
from proc_helpers import proc_cpu_seconds  # noqa: E402
from proc_helpers import proc_io  # noqa: E402
from proc_helpers import proc_state  # noqa: E402
from proc_helpers import spawn  # noqa: E402
from proc_helpers import wait_for_file  # noqa: E402
from proc_helpers import wait_until  # noqa: E402

PROGRAMS = Path(__file__).resolve().parent
REPO = PROGRAMS.parents[1]
#: Budget for a program to reach its handshake; torch programs import torch in three processes.
START_TIMEOUT = 30.0
TORCH_START_TIMEOUT = 90.0
#: A blocked process may still be charged a tick or two of CPU while we watch it.
IDLE_CPU = 0.05

pytestmark = pytest.mark.timeout(180)


@dataclass
class Running:
    """A spawned program with its output files."""

    popen: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path
    ready_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def outputs(self) -> str:
        """Both streams, for failure messages."""
        return f"\n--- stdout ---\n{self.out()}\n--- stderr ---\n{self.err()}"

    def wait_ready(self, timeout: float = START_TIMEOUT) -> str:
        try:
            return wait_for_file(self.ready_path, timeout, self.popen)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{self.outputs()}") from None

    def wait_exit(self, timeout: float = START_TIMEOUT) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s{self.outputs()}") from None

    def wait_output(
        self, text: str, count: int = 1, timeout: float = START_TIMEOUT, stream: str = "out"
    ) -> str:
        read = self.out if stream == "out" else self.err
        return wait_until(
            lambda: read() if read().count(text) >= count else "",
            timeout,
            what=f"{count} x {text!r} on std{stream}",
        )

    def launcher_pids(self) -> dict[int, int]:
        """Rank -> pid, from the launchers' ``rankR=PID`` summary line."""
        return {int(r): int(p) for r, p in re.findall(r"rank(\d+)=(\d+)", self.out())}


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    """``run(program, *args, env=None)`` starts a program from this folder; all are reaped at the end."""
    stack = contextlib.ExitStack()
    counter = iter(range(1000))

    def start(program: str | list[str], *args: str, env: dict[str, str] | None = None) -> Running:
        n = next(counter)
        out_path, err_path = tmp_path / f"{n}.out", tmp_path / f"{n}.err"
        ready = tmp_path / f"{n}.ready"
        argv = [sys.executable, str(PROGRAMS / program)] if isinstance(program, str) else list(program)
        argv += [*args]
        if "{ready}" in argv:
            argv[argv.index("{ready}")] = str(ready)
        out = stack.enter_context(out_path.open("wb"))
        err = stack.enter_context(err_path.open("wb"))
        popen = stack.enter_context(spawn(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env))
        return Running(popen, out_path, err_path, ready)

    with stack:
        yield start


def http_status(port: int, path: str = "/health", timeout: float = 2.0) -> int:
    """Status code of GET http://127.0.0.1:port/path."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def thread_states(pid: int) -> list[str]:
    """Scheduler state of every thread of ``pid``."""
    return [proc_state(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def all_sleeping(pids: list[int]) -> bool:
    """Every thread of every pid is in interruptible sleep (S)."""
    return all(set(thread_states(pid)) == {"S"} for pid in pids)


def worker_children(pid: int) -> list[int]:
    """Children of ``pid`` minus multiprocessing's resource tracker (spawn starts one per launcher)."""
    kids = sorted(psutil.Process(pid).children(), key=lambda kid: kid.pid)
    return [kid.pid for kid in kids if "multiprocessing.resource_tracker" not in proc_cmdline(kid.pid)]


def py_spy() -> str | None:
    """The py-spy binary next to this interpreter or on PATH, if any."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def stacks_of(*pids: int) -> list[str] | None:
    """``py-spy dump`` of each pid, or None when py-spy is missing or may not ptrace here.

    Stack checks are a bonus on top of the /proc checks, so they are skipped quietly, not failed.
    """
    binary = py_spy()
    if binary is None:
        return None
    dumps = []
    for pid in pids:
        done = subprocess.run(
            [binary, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False
        )
        if done.returncode != 0:
            return None
        dumps.append(done.stdout)
    return dumps


def last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


# --------------------------------------------------------------------------------------------------
# 1. healthy_server.py
# --------------------------------------------------------------------------------------------------


def test_healthy_server_refuses_while_loading_then_serves_health(run) -> None:
    port = free_port()
    args = f"--port {port} --load-seconds 1.5 --health-after 1.5 --ready-file {{ready}}"
    prog = run("healthy_server.py", *args.split())
    prog.wait_output("Loading weights")
    with pytest.raises(ConnectionRefusedError):  # the port is bound only after the load phase
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    prog.wait_ready()
    assert http_status(port) == 503  # inside the --health-after window
    wait_until(lambda: http_status(port) == 200, 10, what="/health -> 200")
    assert http_status(port, "/v1/models") == 404
    lines = prog.out().splitlines()
    loaded = next(i for i, line in enumerate(lines) if line.startswith("Weights loaded"))
    assert lines.index("Loading weights") < loaded
    assert lines[-1] == f"Server ready on port {port}"
    assert prog.popen.poll() is None


# --------------------------------------------------------------------------------------------------
# 2. silent_compile.py
# --------------------------------------------------------------------------------------------------


def test_silent_compile_burns_cpu_with_no_output_and_no_io(run) -> None:
    prog = run("silent_compile.py", "--seconds", "60", "--ready-file", "{ready}")
    prog.wait_ready()
    out_before, io_before, cpu_before = prog.out(), proc_io(prog.pid), proc_cpu_seconds(prog.pid)
    # However busy the machine is, a spinning process keeps adding CPU time: wait for a full second.
    wait_until(lambda: proc_cpu_seconds(prog.pid) - cpu_before >= 1.0, 30, what="1 CPU s burnt")
    io_after = proc_io(prog.pid)
    assert proc_state(prog.pid) == "R"
    assert prog.out() == out_before == "compile begin\n"
    assert prog.err() == ""
    for key in ("rchar", "wchar", "syscr", "syscw"):
        assert io_after[key] == io_before[key], key


def test_silent_compile_workers_burn_while_parent_waits(run) -> None:
    prog = run("silent_compile.py", "--seconds", "60", "--workers", "2", "--ready-file", "{ready}")
    prog.wait_ready()
    workers = [
        kid.pid
        for kid in psutil.Process(prog.pid).children()
        if proc_comm(kid.pid).startswith("compile_worker")
    ]
    assert len(workers) == 2
    parent_before = proc_cpu_seconds(prog.pid)
    for worker in workers:
        start = proc_cpu_seconds(worker)
        wait_until(
            lambda w=worker, s=start: proc_cpu_seconds(w) - s >= 0.5, 30, what=f"worker {worker} burning"
        )
    assert proc_cpu_seconds(prog.pid) - parent_before <= IDLE_CPU
    assert proc_state(prog.pid) == "S"
    assert prog.out() == "compile begin\n"


def test_silent_compile_finishes_then_serves(run) -> None:
    port = free_port()
    prog = run("silent_compile.py", "--seconds", "0.5", "--port", str(port), "--ready-file", "{ready}")
    prog.wait_output(f"Server ready on port {port}")
    assert prog.out().splitlines()[:2] == ["compile begin", "compile done"]
    assert http_status(port) == 200


# --------------------------------------------------------------------------------------------------
# 3. slow_loader.py
# --------------------------------------------------------------------------------------------------


def test_slow_loader_rchar_rises_steadily_with_low_cpu_and_no_output(run) -> None:
    prog = run("slow_loader.py", "--size-mb", "8", "--seconds", "60", "--ready-file", "{ready}")
    prog.wait_ready()
    out_before = prog.out()
    cpu0, samples = proc_cpu_seconds(prog.pid), [proc_io(prog.pid)["rchar"]]
    for _ in range(4):
        time.sleep(0.5)  # measurement window: 4 MiB/s means about 2 MiB per sample
        samples.append(proc_io(prog.pid)["rchar"])
    steps = [b - a for a, b in itertools.pairwise(samples)]
    assert all(step >= 1024 * 1024 for step in steps), steps
    assert proc_cpu_seconds(prog.pid) - cpu0 < 0.3
    assert prog.out() == out_before and out_before.startswith("loading weights from ")
    assert prog.err() == ""


def test_slow_loader_finishes_and_removes_its_file(run) -> None:
    prog = run("slow_loader.py", "--size-mb", "2", "--seconds", "0.5")
    assert prog.wait_exit() == 0
    first, last = prog.out().splitlines()[0], last_line(prog.out())
    assert last.startswith("weights loaded (")
    assert not Path(first.removeprefix("loading weights from ")).exists()


# --------------------------------------------------------------------------------------------------
# 4. crash_traceback.py, 5. cuda_oom.py, 6. port_in_use.py
# --------------------------------------------------------------------------------------------------


def test_crash_traceback_exits_1_with_a_real_traceback(run) -> None:
    prog = run("crash_traceback.py")
    assert prog.wait_exit() == 1
    err = prog.err()
    assert err.startswith("Traceback (most recent call last):\n")
    assert "in load_weights\n" in err
    assert last_line(err).startswith("RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM")
    assert prog.out().splitlines() == ["Init engine begin.", "Loading weights"]


def test_crash_traceback_in_child_leaves_the_parent_waiting_forever(run) -> None:
    prog = run("crash_traceback.py", "--in-child", "--ready-file", "{ready}")
    prog.wait_ready()
    err = prog.err()
    assert "Process engine-core:\nTraceback (most recent call last):" in err
    assert last_line(err).startswith("RuntimeError: Error(s) in loading state_dict")
    assert worker_children(prog.pid) == []  # the child is dead and reaped
    wait_until(lambda: proc_state(prog.pid) == "S", 5, what="parent asleep")
    assert cpu_delta(prog.pid, 0.5) <= IDLE_CPU
    assert prog.popen.poll() is None


def test_cuda_oom_prints_the_torch_oom_line(run) -> None:
    prog = run("cuda_oom.py")
    assert prog.wait_exit() == 1
    err = prog.err()
    assert err.startswith("Traceback (most recent call last):\n")
    assert last_line(err).startswith(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.19 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has"
    )
    assert last_line(err).endswith("(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    assert importlib.util.find_spec("torch") is None or "site-packages" not in err  # no torch frames


def test_port_in_use_fails_with_errno_98(run) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        prog = run("port_in_use.py", "--port", str(port))
        assert prog.wait_exit() == 1
    err = prog.err()
    assert err.startswith("Traceback (most recent call last):\n")
    assert last_line(err) == "OSError: [Errno 98] Address already in use"
    assert prog.out() == f"Starting server on 127.0.0.1:{port}\n"


# --------------------------------------------------------------------------------------------------
# 7. dead_peer.py, 8. self_stop.py
# --------------------------------------------------------------------------------------------------


def test_dead_peer_victim_is_gone_and_peer_sleeps_without_error(run) -> None:
    prog = run("dead_peer.py", "--ranks", "3", "--victim", "1", "--delay", "0.3", "--ready-file", "{ready}")
    prog.wait_ready()
    pids = prog.launcher_pids()
    assert sorted(pids) == [0, 1, 2]
    # Not reaped by the launcher (it only joins the survivors): a zombie, or gone.
    wait_until(lambda: proc_state(pids[1]) in ("Z", ""), 10, what="victim dead")
    peers = [pids[0], pids[2], prog.pid]
    wait_until(lambda: all_sleeping(peers), 5, what="peers and launcher asleep")
    for pid in peers:
        assert cpu_delta(pid, 0.3) <= IDLE_CPU
    assert proc_comm(pids[0]) == "dead_peer:r0"
    assert "Traceback" not in prog.err()
    assert "[rank 1] sending SIGKILL to myself" in prog.out()
    assert prog.popen.poll() is None


def test_self_stop_victim_is_stopped_and_sigcont_releases_everyone(run) -> None:
    prog = run("self_stop.py", "--ranks", "3", "--victim", "2", "--delay", "0.2", "--ready-file", "{ready}")
    prog.wait_ready()
    pids = prog.launcher_pids()
    wait_until(lambda: proc_state(pids[2]) == "T", 10, what="victim stopped")
    waiters = [pids[0], pids[1], prog.pid]
    wait_until(lambda: all_sleeping(waiters), 5, what="peers and launcher asleep")
    for pid in waiters:
        assert cpu_delta(pid, 0.3) <= IDLE_CPU
    assert proc_state(pids[2]) == "T"
    os.kill(pids[2], signal.SIGCONT)  # proves the others were waiting for exactly this rank
    assert prog.wait_exit(15) == 0
    assert "launcher: all ranks finished" in prog.out()


# --------------------------------------------------------------------------------------------------
# 9. accept_no_answer.py
# --------------------------------------------------------------------------------------------------


def test_accept_no_answer_accepts_and_never_sends(run) -> None:
    port = free_port()
    prog = run("accept_no_answer.py", "--port", str(port), "--ready-file", "{ready}")
    prog.wait_ready()
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        prog.wait_output("accepted connection from 127.0.0.1:")
        conn.settimeout(2.0)
        with pytest.raises(TimeoutError):
            conn.recv(1)
    assert prog.out().startswith(f"listening on 127.0.0.1:{port}\n")


# --------------------------------------------------------------------------------------------------
# 11. lock_deadlock.py
# --------------------------------------------------------------------------------------------------

_FUTEX = {"x86_64": 202, "aarch64": 98}


def test_lock_deadlock_three_threads_asleep_in_futex(run) -> None:
    prog = run("lock_deadlock.py", "--ready-file", "{ready}")
    assert prog.wait_ready() == "deadlocked\n"
    tids = os.listdir(f"/proc/{prog.pid}/task")
    assert len(tids) == 3
    wait_until(lambda: all_sleeping([prog.pid]), 5, what="all threads asleep")
    futex = _FUTEX.get(platform.machine())
    if futex is not None:

        def in_futex() -> bool:
            with contextlib.suppress(PermissionError):
                return all(
                    Path(f"/proc/{prog.pid}/task/{tid}/syscall").read_text().split()[0] == str(futex)
                    for tid in tids
                )
            return True  # /proc/PID/syscall needs ptrace rights; the states above must do

        wait_until(in_futex, 5, what="every thread in futex()")
    assert cpu_delta(prog.pid, 0.5) <= IDLE_CPU
    assert "got both locks" not in prog.out()


# --------------------------------------------------------------------------------------------------
# 12. progress_then_hang.py
# --------------------------------------------------------------------------------------------------


def test_progress_then_hang_goes_silent(run) -> None:
    prog = run("progress_then_hang.py", "--seconds", "1", "--interval", "0.25", "--ready-file", "{ready}")
    prog.wait_ready()
    assert prog.out().splitlines() == [f"progress step {i}/4" for i in range(1, 5)]
    wait_until(lambda: proc_state(prog.pid) == "S", 5, what="asleep")
    assert cpu_delta(prog.pid, 0.6) <= IDLE_CPU
    assert prog.out().count("\n") == 4


def test_progress_then_hang_prints_waiting_lines_while_hung(run) -> None:
    line = "No available shared memory broadcast block found in 60 seconds."
    args = ["--seconds", "0.5", "--interval", "0.25", "--waiting-every", "0.2", "--ready-file", "{ready}"]
    prog = run("progress_then_hang.py", *args, "--waiting-line", line)
    prog.wait_ready()
    prog.wait_output(line, count=3, timeout=10)
    lines = prog.out().splitlines()
    assert lines[:2] == ["progress step 1/2", "progress step 2/2"]
    assert set(lines[2:]) == {line}


# --------------------------------------------------------------------------------------------------
# 10. gloo programs (torch)
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def torch_ok() -> None:
    pytest.importorskip("torch")


@pytest.mark.torch
def test_gloo_missing_collective_waiters_and_culprit_block(run, torch_ok) -> None:
    prog = run("gloo_missing_collective.py", "--world-size", "2", "--culprit", "1", "--ready-file", "{ready}")
    prog.wait_ready(TORCH_START_TIMEOUT)
    pids = prog.launcher_pids()
    assert f"rank0={pids[0]} in all_reduce" in prog.out()
    assert f"rank1={pids[1]} in rank_busy_elsewhere" in prog.out()
    wait_until(lambda: all_sleeping([pids[0], pids[1], prog.pid]), 10, what="ranks asleep")
    for pid in pids.values():
        assert cpu_delta(pid, 0.5) <= IDLE_CPU
    assert "all_reduce returned" not in prog.out()
    if stacks := stacks_of(pids[0], pids[1]):
        assert "all_reduce" in stacks[0]
        assert "rank_busy_elsewhere" in stacks[1]


@pytest.mark.torch
def test_gloo_missing_rank_blocks_in_init(run, torch_ok) -> None:
    prog = run("gloo_missing_rank.py", "--world-size", "3", "--ready-file", "{ready}")
    prog.wait_ready(TORCH_START_TIMEOUT)
    pids = prog.launcher_pids()
    assert sorted(pids) == [0, 1]
    wait_until(lambda: all_sleeping([*pids.values(), prog.pid]), 10, what="ranks asleep")
    for pid in pids.values():
        assert cpu_delta(pid, 0.5) <= IDLE_CPU
    assert "init_process_group done" not in prog.out()
    if stacks := stacks_of(pids[1]):
        assert "init_process_group" in stacks[0]


@pytest.mark.torch
def test_gloo_graph_capture_culprit_in_capture_others_in_barrier(run, torch_ok) -> None:
    prog = run("gloo_graph_capture.py", "--world-size", "2", "--culprit", "0", "--ready-file", "{ready}")
    prog.wait_ready(TORCH_START_TIMEOUT)
    pids = prog.launcher_pids()
    wait_until(lambda: all_sleeping([*pids.values(), prog.pid]), 10, what="ranks asleep")
    for pid in pids.values():
        assert cpu_delta(pid, 0.5) <= IDLE_CPU
    out = prog.out()
    assert "Capturing batches (bs=8 avail_mem=1.23 GB)" in out
    assert "Capturing batches (bs=4" not in out
    assert "Capture cuda graph end." not in out
    if stacks := stacks_of(pids[0], pids[1]):
        assert re.search(r"capture \(.*cuda_graph_runner\.py:\d+\)", stacks[0]), stacks[0]
        assert "barrier" in stacks[1]


@pytest.mark.torch
def test_gloo_dead_rank_peer_errors_at_once(run, torch_ok) -> None:
    prog = run("gloo_dead_rank.py", "--world-size", "2", "--delay", "0.3", "--ready-file", "{ready}")
    prog.wait_ready(TORCH_START_TIMEOUT)
    started = time.monotonic()
    assert prog.wait_exit(30) == 1
    # The kill comes --delay after ready; the peer's error follows immediately, not after the 1 h timeout.
    assert time.monotonic() - started < 10
    assert "Connection closed by peer" in prog.err()
    assert "This is typically caused by a remote worker crashing" in prog.err()
    out = prog.out()
    assert "launcher: rank 0 exited with 1" in out
    assert "launcher: rank 1 exited with -9" in out


@pytest.mark.torch
def test_gloo_stopped_rank_peer_blocks_until_sigcont(run, torch_ok) -> None:
    prog = run("gloo_stopped_rank.py", "--world-size", "2", "--delay", "0.2", "--ready-file", "{ready}")
    prog.wait_ready(TORCH_START_TIMEOUT)
    pids = prog.launcher_pids()
    wait_until(lambda: proc_state(pids[1]) == "T", 10, what="victim stopped")
    wait_until(lambda: all_sleeping([pids[0], prog.pid]), 10, what="peer asleep")
    assert cpu_delta(pids[0], 1.0) <= IDLE_CPU
    assert prog.popen.poll() is None and "Traceback" not in prog.err()
    os.kill(pids[1], signal.SIGCONT)
    assert prog.wait_exit(30) == 0
    assert prog.out().count("all_reduce returned") == 2


@pytest.mark.torch
def test_gloo_stopped_rank_times_out_with_a_short_group_timeout(run, torch_ok) -> None:
    args = ["--world-size", "2", "--delay", "0.1", "--timeout-s", "3", "--ready-file", "{ready}"]
    prog = run("gloo_stopped_rank.py", *args)
    prog.wait_ready(TORCH_START_TIMEOUT)
    pids = prog.launcher_pids()
    prog.wait_output("Timed out waiting 3000ms for recv operation to complete", timeout=30, stream="err")
    assert proc_state(pids[1]) == "T"  # the victim is still frozen; only the peer gave up
    prog.wait_output("launcher: rank 0 exited with 1")


def test_gloo_programs_exit_2_without_torch(run, tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "torch.py").write_text("raise ImportError('torch hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": str(hide)}
    prog = run("gloo_missing_rank.py", env=env)
    assert prog.wait_exit() == 2
    assert "needs torch" in prog.err()


# --------------------------------------------------------------------------------------------------
# hangwatch.demo.story
# --------------------------------------------------------------------------------------------------

_SGLANG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: TP(\d+))?\] (.*)$")


def _demo_env(extra_path: Path | None = None) -> dict[str, str]:
    paths = [str(REPO / "src")]
    if extra_path is not None:
        paths.insert(0, str(extra_path))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _story(run, env: dict[str, str], weights_seconds: str = "1.5") -> Running:
    args = f"--ranks 2 --weights-seconds {weights_seconds} --draft-seconds 0.3 --shard-mb 4".split()
    return run([sys.executable, "-m", "hangwatch.demo.story"], *args, env=env)


def test_demo_story_loads_then_deadlocks_silently(run) -> None:
    prog = _story(run, _demo_env(), weights_seconds="2")
    prog.wait_output("Load weight begin.", count=2, stream="err")
    schedulers = worker_children(prog.pid)
    assert len(schedulers) == 2
    before = {pid: proc_io(pid)["rchar"] for pid in schedulers}
    time.sleep(0.5)  # measurement window inside the 2 s weight load
    for pid in schedulers:
        assert proc_io(pid)["rchar"] - before[pid] >= 2 * 1024 * 1024  # 16 MiB/s per rank
    assert all(proc_comm(pid) == "sglang::schedul" for pid in schedulers)

    err = prog.wait_output("Capture cuda graph begin.", count=2, stream="err")
    wait_until(lambda: all_sleeping([*schedulers, prog.pid]), 10, what="schedulers and launcher asleep")
    for pid in schedulers:
        assert cpu_delta(pid, 0.5) <= IDLE_CPU
    assert prog.err() == err and prog.popen.poll() is None

    lines = err.splitlines()
    assert all(_SGLANG_LINE.match(line) for line in lines), lines
    assert lines[0].split("] ", 1)[1].startswith("server_args=ServerArgs(model_path='deepseek-ai/")
    for rank in ("0", "1"):
        mine = [m.group(2) for line in lines if (m := _SGLANG_LINE.match(line)) and m.group(1) == rank]
        assert [re.sub(r"[=\s][\d.]+", "", msg)[:22] for msg in mine] == [
            "Init torch distributed",
            "Init torch distributed",
            "Load weight begin. ava",
            "Load weight end. elaps",
            "Load weight begin. ava",
            "Load weight end. elaps",
            "Capture cuda graph beg",
        ]
        assert "type=DeepseekV3ForCausalLM, avail mem=" in mine[3]
        assert "type=LlamaForCausalLMEagle3, avail mem=" in mine[5]
        assert mine[-1].startswith("Capture cuda graph begin. This can take up to several minutes. avail mem")

    if importlib.util.find_spec("setproctitle") is not None:
        titles = sorted(proc_cmdline(pid) for pid in schedulers)
        assert titles == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
        assert proc_cmdline(prog.pid).startswith("python3 -m sglang.launch_server --model-path")
        assert proc_comm(prog.pid) != "python3 -m sgla"  # the interpreter's own comm is kept
    if stacks := stacks_of(*schedulers):
        # The odd rank out (the last) waits in a different collective than its peers.
        culprits = [dump for dump in stacks if "broadcast_draft_buffers" in dump]
        peers = [dump for dump in stacks if "tensor_model_parallel_all_reduce" in dump]
        assert len(culprits) == 1 and len(peers) == 1, stacks
        assert all(re.search(r"capture \(.*story\.py:\d+\)", dump) for dump in stacks), stacks
        if importlib.util.find_spec("setproctitle") is not None:  # py-spy's header shows the title
            assert "sglang::scheduler_TP1" in culprits[0]

    os.kill(prog.pid, signal.SIGTERM)  # the launcher takes its schedulers down with it
    assert prog.wait_exit(15) == 128 + signal.SIGTERM
    for pid in schedulers:
        wait_until(lambda pid=pid: proc_state(pid) in ("", "Z"), 10, what=f"scheduler {pid} gone")


def test_demo_story_names_schedulers_through_comm_without_setproctitle(run, tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "setproctitle.py").write_text("raise ImportError('setproctitle hidden by the test')\n")
    prog = _story(run, _demo_env(hide), weights_seconds="0.3")
    prog.wait_output("Capture cuda graph begin.", count=2, stream="err")
    schedulers = worker_children(prog.pid)
    assert [proc_comm(pid) for pid in schedulers] == ["sglang::schedul"] * 2
    assert all("spawn_main" in proc_cmdline(pid) for pid in schedulers)
    assert "hangwatch.demo.story" in proc_cmdline(prog.pid)


def test_demo_story_reports_a_dead_scheduler_like_sglang(run) -> None:
    prog = _story(run, _demo_env(), weights_seconds="30")
    prog.wait_output("Load weight begin.", count=2, stream="err")
    victim = worker_children(prog.pid)[0]
    os.kill(victim, signal.SIGKILL)
    assert prog.wait_exit(20) == 1  # found by the next 5 s poll round
    assert "scheduler died during initialization (exit code: -9)" in prog.err()
