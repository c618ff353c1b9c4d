"""The cuda-gdb boundary: the kernels a live process's GPU is running, read without killing it.

``cuda-gdb -nx -p PID --batch -ex "info cuda kernels" -ex bt -ex detach`` attaches
(the target is ptrace-stopped from then on), lists the running kernels with their launch geometry, prints
the host thread's backtrace, and detaches: the target goes on, its kernel still running. Measured on the
H200 (docs/gpu-validation.md): about 14 s, most of it the debugger's start-up and symbol loading, all of it
a pause of the target's host threads (never of its GPU: the kernels run on).

``info cuda kernels`` prints a table (docs/kernel-names.md keeps a real one)::

      Kernel Parent Dev Grid Status   SMs Mask   GridDim  BlockDim Invocation
    *      0      -   0    1 Active 0x00000001 (1,1,1)   (1,1,1)  spin_kernel(cycles=100)

and a device frame of ``bt`` names a launch as CUDA writes it: ``name<<<(1,1,1),(1,1,1)>>> (...)``. Both
are read; the table wins where it parses.

Never leaves a target stopped: a stopped process is not attached to (it is evidence, as for the stack
capture), the debugger runs in a session of its own and is SIGKILLed with its group at its deadline, and
the target's state is read after it has gone; a target the debugger left stopped (a killed debugger's
pending SIGSTOP) is resumed with SIGCONT, the one signal hangwatch sends to a process it did not start,
and only to undo its own side effect.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from pathlib import Path

from hangwatch.collect import procfs
from hangwatch.collect.stacks import DumpRun
from hangwatch.collect.stacks import run_dumper
from hangwatch.model.gpukernels import KernelCapture
from hangwatch.model.gpukernels import KernelLaunch
from hangwatch.model.gpukernels import KernelOutcome
from hangwatch.model.gpukernels import KernelSample
from hangwatch.model.gpukernels import bare_name
from hangwatch.model.gpukernels import parameter_groups
from hangwatch.model.samples import ENDED_STATES
from hangwatch.model.samples import STOPPED_STATES
from hangwatch.model.samples import ProcState

# One attach measured 14 s on an idle H200 machine; a loaded host or a process with many large libraries
# takes longer. Past this the debugger is killed (and the target checked, and resumed if left stopped).
DEADLINE_S = 60.0
# Processes read at once, one debugger each (validated on one GPU: docs/gpu-validation.md).
MAX_PROCESSES = 8
COMMANDS = ("set pagination off", "info cuda kernels", "bt 12", "detach")
HOST_FRAMES = 6

INSTALL = (
    "install the CUDA toolkit's debugger (cuda-gdb, in the toolkit's bin/ or the cuda-gdb package) and "
    "put it on PATH or set CUDA_HOME"
)

_DIM = r"\((\d+),(\d+),(\d+)\)"
# A row of ``info cuda kernels``: focus mark, kernel id, parent, device, grid id, status, SM mask, grid
# and block dimensions, then the invocation (name and arguments) to the end of the line.
_ROW = re.compile(
    rf"^\s*\*?\s*(\d+)\s+(\S+)\s+(\d+)\s+(-?\d+)\s+(\w+)\s+(0x[0-9a-fA-F]+)\s+{_DIM}\s+{_DIM}\s+(.+?)\s*$"
)
# A device frame of ``bt``: "#0  0x... in NAME<<<(g),(b)>>> (args) at file:line".
_LAUNCH = re.compile(rf"(?:^#\d+\s+(?:0x[0-9a-fA-F]+\s+in\s+)?|\bin\s+)(.+?)<<<{_DIM},{_DIM}>>>")
_SOURCE = re.compile(r"\bat\s+(\S+:\d+)\s*$")
_HOST_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-fA-F]+\s+in\s+)?(.+)$")
_REFUSED = (
    "operation not permitted",
    "ptrace:",
    "could not attach",
    "cuda_error_not_permitted",
    "debugger api initialization failed",
    "another cuda-gdb",
    "lock file",
    "all cuda devices are used for display",
)
_GONE = ("no such process",)


def find_cuda_gdb(env: Mapping[str, str] | None = None) -> str | None:
    """$HANGWATCH_CUDA_GDB, else PATH, else ``$CUDA_HOME/bin``, else the newest ``/usr/local/cuda*/bin``."""
    env = os.environ if env is None else env
    chosen = env.get("HANGWATCH_CUDA_GDB")
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    found = shutil.which("cuda-gdb", path=env.get("PATH"))
    if found:
        return found
    homes = [Path(env[k]) for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)]
    homes += sorted(Path("/usr/local").glob("cuda*"), key=_version_key, reverse=True)
    for home in homes:
        candidate = home / "bin" / "cuda-gdb"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _version_key(path: Path) -> tuple[int, ...]:
    """``/usr/local/cuda-12.4`` -> (12, 4); a bare ``cuda`` (usually the newest's link) first."""
    digits = re.findall(r"\d+", path.name)
    return tuple(int(d) for d in digits) if digits else (10**6,)


def argv_for(debugger: str, pid: int) -> list[str]:
    argv = [debugger, "-nx", "-p", str(pid), "--batch"]
    for command in COMMANDS:
        argv += ["-ex", command]
    return argv


def parse_kernels(text: str) -> tuple[KernelLaunch, ...]:
    """The running kernels of a debugger's output: the table's rows, each with the full name the
    backtrace's device frame gives it; else the backtrace's launches alone.

    cuda-gdb 13.0's table writes a kernel without its parameter types (``...::spin_kernel()``) where the
    frame has them (``...::spin_kernel(long)<<<(1,1,1),(1,1,1)>>> ()``), and a Triton kernel's frame ends
    with its Python source (``at /path/kernels.py:62``)."""
    frames: dict[str, KernelLaunch] = {}
    for line in text.splitlines():
        m = _LAUNCH.search(line)
        if m is not None:
            name = kernel_name(m.group(1))
            source = _SOURCE.search(line[m.end() :])
            frames.setdefault(
                bare_name(name),
                KernelLaunch(
                    name,
                    (int(m.group(2)), int(m.group(3)), int(m.group(4))),
                    (int(m.group(5)), int(m.group(6)), int(m.group(7))),
                    None,
                    None,
                    source=source.group(1) if source else "",
                ),
            )
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if m is None:
            continue
        name = kernel_name(m.group(13))
        frame = frames.get(bare_name(name))
        rows.append(
            KernelLaunch(
                frame.name if frame is not None else name,
                (int(m.group(7)), int(m.group(8)), int(m.group(9))),
                (int(m.group(10)), int(m.group(11)), int(m.group(12))),
                int(m.group(3)),
                int(m.group(6), 16).bit_count(),
                m.group(5),
                source=frame.source if frame is not None else "",
            )
        )
    return tuple(dict.fromkeys(rows)) if rows else tuple(frames.values())


def kernel_name(invocation: str) -> str:
    """A kernel's name with its parameter types, without argument values.

    ``spin_kernel(cycles=100)`` -> ``spin_kernel``; ``at::...::spin_kernel(long)`` stays (types, not
    values); ``f(long)(cycles=1)`` -> ``f(long)``: older debuggers append the values in a group of
    their own; ``f()`` stays."""
    text = invocation.strip()
    groups = parameter_groups(text)
    while len(groups) > 1 and (groups[-1][1] == "" or "=" in groups[-1][1]):
        text = text[: groups.pop()[0]].rstrip()
    if len(groups) == 1 and "=" in groups[0][1]:
        text = text[: groups[0][0]].rstrip()
    return text


def host_frames(text: str) -> tuple[str, ...]:
    """The backtrace's frames that are not a GPU launch: the host thread's innermost, as printed."""
    frames = []
    for line in text.splitlines():
        if "<<<" in line:
            continue
        m = _HOST_FRAME.match(line.strip())
        if m is not None:
            frames.append(m.group(1).strip()[:200])
    return tuple(frames[:HOST_FRAMES])


def classify(run: DumpRun) -> tuple[KernelOutcome, str]:
    """The outcome of one debugger run that listed no kernel table, and its reason in one line."""
    if run.rc is None:
        return KernelOutcome.TIMEOUT, f"cuda-gdb did not finish in {run.elapsed_s:.0f} s: killed"
    said = f"{run.stderr}\n{run.stdout}"
    low = said.lower()
    line = _reason_line(said)
    if any(m in low for m in _GONE):
        return KernelOutcome.GONE, line
    if any(m in low for m in _REFUSED):
        return KernelOutcome.REFUSED, line
    return (KernelOutcome.OK, "") if run.rc == 0 else (KernelOutcome.FAILED, line)


def _reason_line(text: str) -> str:
    for line in text.splitlines():
        low = line.lower()
        if any(m in low for m in (*_REFUSED, *_GONE, "error", "fatal", "failed")):
            return line.strip()[:240]
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1][:240] if lines else "no output"


def _sigcont(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGCONT)


Runner = Callable[[list[str], float], DumpRun]


class KernelReader:
    """Reads the running kernels of a few processes at once. ``runner``, ``root`` and ``resume`` are
    injectable (tests: a stand-in debugger; the GPU machine: the real one)."""

    def __init__(
        self,
        debugger: str | None = None,
        runner: Runner = run_dumper,
        root: Path = procfs.PROC,
        resume: Callable[[int], None] = _sigcont,
        deadline_s: float = DEADLINE_S,
    ) -> None:
        self.debugger = debugger if debugger is not None else find_cuda_gdb()
        self._runner = runner
        self._root = root
        self._resume = resume
        self.deadline_s = deadline_s

    @property
    def unavailable(self) -> str | None:
        if self.debugger is None:
            return f"cuda-gdb not found (PATH, CUDA_HOME, /usr/local/cuda*/bin): {INSTALL}"
        return None

    def capture(self, pids: Iterable[int], t: float) -> KernelSample:
        chosen = list(dict.fromkeys(pids))[:MAX_PROCESSES]
        started = time.monotonic()
        if self.debugger is None:
            detail = self.unavailable or ""
            captures = tuple(KernelCapture(pid, KernelOutcome.NO_DEBUGGER, detail=detail) for pid in chosen)
            return KernelSample(t, captures, None, 0.0)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(chosen))) as pool:
            captures = tuple(pool.map(self.read_one, chosen))
        return KernelSample(t, captures, self.debugger, round(time.monotonic() - started, 3))

    def read_one(self, pid: int) -> KernelCapture:
        """One process: skip it when stopped or gone, attach, and make sure it is not left stopped."""
        assert self.debugger is not None
        before = procfs.read_stat(pid, self._root)
        if before is None or before.state in ENDED_STATES:
            return KernelCapture(pid, KernelOutcome.GONE, detail="ended before the debugger came")
        if before.state in STOPPED_STATES:
            detail = f"stopped (state {before.state}): not attached to; a stopped process is evidence"
            return KernelCapture(pid, KernelOutcome.STOPPED, detail=detail, state_after=before.state)
        run = self._runner(argv_for(self.debugger, pid), self.deadline_s)
        after = procfs.read_stat(pid, self._root)
        resumed = False
        if after is not None and after.state == ProcState.STOPPED:
            self._resume(pid)  # the debugger's pending stop, not the target's own: undo it
            resumed = True
            after = procfs.read_stat(pid, self._root) or after
        text = f"{run.stdout}\n{run.stderr}"
        kernels = parse_kernels(run.stdout)
        outcome, detail = (KernelOutcome.OK, "") if kernels else classify(run)
        if outcome is KernelOutcome.OK and run.rc is None:
            outcome, detail = classify(run)  # it listed them, then hung in the detach: say so
        return KernelCapture(
            pid,
            outcome,
            kernels,
            paused_s=round(run.elapsed_s, 3),
            detail=detail,
            state_after=after.state if after is not None else "gone",
            resumed=resumed,
            host_frames=host_frames(text) if kernels or outcome is KernelOutcome.OK else (),
        )
