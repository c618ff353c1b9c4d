"""The py-spy boundary: stacks of every process of the tree, taken concurrently, never leaving one stopped.

One ``py-spy dump --json [--native]`` per process, all at once, each with its own deadline. Each
dumper runs in a session of its own, so a dumper stuck on a wedged target is killed with its whole
group instead of being waited on. Native frames are tried first (they name the wait inside a C++
extension: ``c10d::Work::wait`` under ``OpOverload.__call__``, ``cudaStreamSynchronize``) and a
process where they fail is dumped Python-only, now and from then on.

Native frames come from our own unwinder where it runs (``collect/unwind.py``: x86_64 with c++filt):
py-spy gives the Python frames in milliseconds and the unwinder the native ones, with every library's
tables kept across processes and rounds. Elsewhere, or where it cannot read a process, ``py-spy dump
--native`` does both, paying its symbol loading each time.

Stopped processes (state T or t) are not dumped: py-spy would ptrace-stop and resume them, and a
stopped rank is the evidence we are looking for. After each dump the state is read again and a
process the dump left stopped (py-spy #390, #416) is resumed with SIGCONT: the only signal hangwatch
ever sends in attach mode, and only to undo its own side effect.

Every failure becomes a ``DumpOutcome`` in the sample (permission, not Python, timeout, gone); py-spy's
exit codes and messages never leave this module.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

import msgspec

from hangwatch.collect import procfs
from hangwatch.collect.kernelwaits import read_waits
from hangwatch.collect.lockfiles import lock_files_of
from hangwatch.collect.sockdiag import tcp_peers
from hangwatch.collect.sockdiag import unix_peers
from hangwatch.collect.unwind import NativeFrame
from hangwatch.collect.unwind import NativeUnwinder
from hangwatch.collect.unwind import UnwindError
from hangwatch.collect.unwind import merge
from hangwatch.errors import PTRACE_HELP
from hangwatch.model.doctor import CacheFolder
from hangwatch.model.samples import ENDED_STATES
from hangwatch.model.samples import STOPPED_STATES
from hangwatch.model.samples import ProcessId
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import ProcState
from hangwatch.model.stacks import FRAME_CACHE
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.stacks import intern_frames
from hangwatch.redact import redact_argv

# SGLang gives a scheduler's dump 8 s with --native and 4 s without (docs/engine-facts.md). A native
# dump of a torch process takes 0.4-1.2 s here (symbol loading), Python-only 0.03 s: 5 s and 3 s keep
# a wedged dumper from holding a verdict back while leaving a loaded machine room.
NATIVE_DEADLINE_S = 5.0
PYTHON_DEADLINE_S = 3.0
DUMPER_NICE = -10
MAX_PARALLEL = 32  # one dumper per process, bounded so a huge tree cannot fork-bomb the host
UNWOUND_TRIES = 2  # our unwinder's dump again when a thread moved between its two readings

_HEX = re.compile(r"^0x[0-9a-f]+$")
_NATIVE_TRIM = re.compile(r"<[^<>]*>|\([^()]*\)")
_MISSING_PYTHON = ("Failed to find python version", "Failed to find a python interpreter", "not a python")
_GONE = ("No such file or directory", "No such process", "Check that the process is running")


@dataclass(frozen=True)
class DumpRun:
    """What one py-spy run gave: exit code, output, or a missed deadline."""

    rc: int | None  # None when it was killed at the deadline
    stdout: str
    stderr: str
    elapsed_s: float


Runner = Callable[[list[str], float], DumpRun]


def find_py_spy() -> str | None:
    """$HANGWATCH_PY_SPY, else py-spy beside hangwatch's Python (its wheel ships the binary), else PATH."""
    chosen = os.environ.get("HANGWATCH_PY_SPY")
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def run_dumper(argv: list[str], deadline_s: float) -> DumpRun:
    """Run one dumper in a session of its own; SIGKILL its whole group at the deadline."""
    env = {**os.environ, "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
        text=True,
        errors="replace",
    )
    with contextlib.suppress(OSError):
        # py-spy holds its target stopped while it reads (and, with --native, unwinds) it: a dumper
        # starved by a loaded machine stretches that pause from ~30 ms to seconds (docs/stacks.md).
        # Raise its priority where we may (root, CAP_SYS_NICE); otherwise it keeps the default.
        os.setpriority(os.PRIO_PROCESS, proc.pid, DUMPER_NICE)
    try:
        out, err = proc.communicate(timeout=deadline_s)
        return DumpRun(proc.returncode, out, err, time.monotonic() - started)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return DumpRun(None, out or "", err or "", time.monotonic() - started)


@dataclass
class _Tries:
    """What our unwinder's tries at one process gave: a dump, or why not; and what they cost."""

    result: ProcessStacks | None = None
    stops: int = 0  # times the main thread was stopped: py-spy's runs, and the copies that held it
    elapsed_s: float = 0.0
    why: str = ""  # why no dump (py-spy's failure, the unwinder's); "" with a moved thread (try again)
    lasting: bool = False  # the unwinder cannot read this process: py-spy's --native from now on


class StackDumper:
    """Captures one ``StackSample`` of a set of processes. ``runner`` and ``root`` are injectable;
    ``engine_caches``: the engines' cache folders (the registry's cache_folders()), where each capture
    looks for lock files no process holds."""

    def __init__(
        self,
        py_spy: str | None = None,
        *,
        # Empty: no engine's cache folder is walked (the tools' own, HOME's and TORCH_EXTENSIONS_DIR's are).
        engine_caches: Sequence[CacheFolder] = (),
        native: bool = True,
        native_deadline_s: float = NATIVE_DEADLINE_S,
        python_deadline_s: float = PYTHON_DEADLINE_S,
        runner: Runner = run_dumper,
        root: Path = procfs.PROC,
        resume: Callable[[int], None] | None = None,
        unwinder: NativeUnwinder | str | None = "auto",
    ) -> None:
        self.path = py_spy if py_spy is not None else find_py_spy()
        if unwinder == "auto":
            # Ours with the real py-spy on this machine's /proc; an injected runner or root is a test's
            # stand-in, whose py-spy answers --native itself. HANGWATCH_NATIVE_UNWINDER=py-spy keeps
            # py-spy's own (a comparison, a workaround).
            own = runner is run_dumper and root == procfs.PROC
            own = own and os.environ.get("HANGWATCH_NATIVE_UNWINDER", "") != "py-spy"
            unwinder = NativeUnwinder(root) if own else None
        assert not isinstance(unwinder, str)
        self._unwinder = unwinder if unwinder is not None and unwinder.unavailable is None else None
        self.engine_caches = tuple(engine_caches)
        self.native = native
        self._native_deadline = native_deadline_s
        self._python_deadline = python_deadline_s
        self._runner = runner
        self._root = root
        self._resume = resume or _sigcont
        self._python_only: set[ProcessId] = set()  # identities where --native failed once
        self._stops: dict[ProcessId, int] = {}  # how often our dumps stopped each process, so far
        self._unwinder_failed: set[ProcessId] = set()  # identities our unwinder cannot read: py-spy's
        self._sources: dict[str, list[str] | None] = {}

    @property
    def unavailable(self) -> str | None:
        if self.path is None:
            return "py-spy is not installed (pip install py-spy): stacks cannot be taken"
        return None

    def capture(
        self, processes: Sequence[ProcessSample], t: float, native: bool | None = None
    ) -> StackSample:
        """Dump every process at once; the round takes about as long as its slowest dump."""
        want_native = self.native if native is None else native
        started = time.monotonic()
        if not processes:
            return StackSample(t, (), 0.0)
        # Native unwinding keeps the target stopped while it runs and is CPU-bound: more native dumpers
        # than CPUs only starve each other and stretch every target's pause (measured: 30 ms per target
        # unstarved, 230 ms median with 16 dumpers on 2 CPUs; docs/stacks.md). Python-only dumps pause a
        # target for milliseconds, so they all run at once.
        parallel = MAX_PARALLEL if not want_native else max(1, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=min(len(processes), parallel)) as pool:
            results = list(pool.map(lambda p: self.dump(p, want_native), processes))
        # Only the tree's own sockets: the host's every Unix connection would swell each report.
        held = {inode for r in results if r.kernel is not None for inode in r.kernel.sockets}
        ours = self._root == procfs.PROC and bool(held)
        peers = {inode: peer for inode, peer in (unix_peers() if ours else {}).items() if inode in held}
        # A TCP connection is a wait edge only when the tree holds both ends (a peer rank, its store).
        tcp = {
            inode: peer
            for inode, peer in (tcp_peers() if ours else {}).items()
            if inode in held and peer in held
        }
        locks = {
            obj[5:].split(" ", 1)[0]
            for r in results
            if r.kernel is not None
            for w in r.kernel.threads
            for obj in w.on
            if obj.startswith("lock:")
        }
        # ...and the files members hold open, whose locks a poller keeps trying (LOCK_NB, then a sleep).
        locks |= {f.split(" ", 1)[0] for r in results if r.kernel is not None for f in r.kernel.files}
        holders = tuple(sorted(h for h in procfs.read_locks(self._root) if h[0] in locks)) if locks else ()
        members = {p.pid for p in processes}
        owners = tuple(
            (pid, _command_of(pid, self._root)) for pid in sorted({h for _, h in holders} - members)
        )
        return StackSample(
            t,
            tuple(results),
            round(time.monotonic() - started, 4),
            unix_peers=tuple(sorted(peers.items())),
            tcp_peers=tuple(sorted(tcp.items())),
            lock_holders=holders,
            lock_owners=owners,
            # Read here, when the tree has gone quiet: a poller may be waiting for one to go away.
            lock_files=lock_files_of(members, self.engine_caches, self._root),
        )

    def dump(self, p: ProcessSample, native: bool) -> ProcessStacks:
        """One process: skip it when stopped, dump it, and make sure it is not left stopped."""
        base = ProcessStacks(p.pid, p.name, p.role, p.rank, DumpOutcome.OK)
        before = procfs.read_stat(p.pid, self._root)
        if before is None or before.state in ENDED_STATES:
            return replace(base, outcome=DumpOutcome.GONE, state=before.state if before else "gone")
        if before.state in STOPPED_STATES:
            return replace(
                base,
                outcome=DumpOutcome.STOPPED,
                state=before.state,
                cpu_s=before.cpu_s,
                detail=f"stopped (state {before.state}): not dumped; a stopped process is evidence, "
                "not an error",
            )
        # Before the dump: py-spy interrupts the threads' system calls while it reads them.
        kernel = read_waits(p.pid, self._root)
        if kernel is not None:
            kernel = replace(kernel, our_stops=self._stops.get(before.identity, 0))
        if self.path is None:
            return replace(
                base,
                outcome=DumpOutcome.NO_DUMPER,
                state=before.state,
                detail=self.unavailable,
                kernel=kernel,
            )
        env = procfs.read_environ(p.pid, frozenset({"WORLD_SIZE"}), self._root)
        world = int(env["WORLD_SIZE"]) if env.get("WORLD_SIZE", "").isdigit() else None
        use_native = native and before.identity not in self._python_only
        result = self._dump_once(base, use_native, before.identity)
        if use_native and result.outcome in (DumpOutcome.FAILED, DumpOutcome.TIMEOUT):
            # Native unwinding is what fails on odd builds and stripped libraries: retry without it.
            self._python_only.add(before.identity)
            fallback = self._dump_once(base, False)
            note = f"--native failed ({_first_line(result.detail)}); Python frames only"
            result = replace(
                fallback,
                detail=note if fallback.outcome is DumpOutcome.OK else fallback.detail,
                elapsed_s=result.elapsed_s + fallback.elapsed_s,
                stops=result.stops + fallback.stops,
            )
        self._stops[before.identity] = self._stops.get(before.identity, 0) + result.stops
        after = procfs.read_stat(p.pid, self._root)
        resumed = False
        if after is not None and after.state == ProcState.STOPPED:
            # The dump left it stopped (a killed dumper, or py-spy's own bugs): undo our side effect.
            self._resume(p.pid)
            resumed = True
        cpu = after.cpu_s if after is not None else before.cpu_s
        return replace(
            result, state=before.state, cpu_s=cpu, world_size=world, resumed=resumed, kernel=kernel
        )

    def _dump_once(
        self, base: ProcessStacks, native: bool, identity: ProcessId | None = None
    ) -> ProcessStacks:
        if native and self._unwinder is not None and identity not in self._unwinder_failed:
            tries = self._dump_unwound(base, self._unwinder)
            if tries.result is not None:
                return tries.result
            if tries.lasting and identity is not None:
                self._unwinder_failed.add(identity)
            # py-spy's own --native, with what our tries cost (their stops count: a wait's wakeups).
            theirs = self._dump_py_spy(base, native)
            elapsed = round(theirs.elapsed_s + tries.elapsed_s, 4)
            return replace(theirs, stops=theirs.stops + tries.stops, elapsed_s=elapsed)
        return self._dump_py_spy(base, native)

    def _dump_unwound(self, base: ProcessStacks, unwinder: NativeUnwinder) -> _Tries:
        """Python frames from py-spy, native ones from our unwinder, merged. No result where the unwinder
        could not read the process (``lasting``: nor will it), or where a thread moved between the two
        readings twice running: py-spy's --native reads both at once then."""
        tries = _Tries()
        for _ in range(UNWOUND_TRIES):
            try:
                self._unwound_once(base, unwinder, tries)
            except Exception as exc:  # the unwinder must never take the watch down: py-spy's instead
                tries.lasting, tries.why = True, f"{type(exc).__name__}: {exc}"
            if tries.result is not None or tries.lasting or tries.why:
                break
        return tries

    def _unwound_once(self, base: ProcessStacks, unwinder: NativeUnwinder, tries: _Tries) -> None:
        assert self.path is not None
        grab = unwinder.start(base.pid)  # its interpreter starts while py-spy reads
        try:
            run = self._runner([self.path, "dump", "--pid", str(base.pid), "--json"], self._python_deadline)
            tries.elapsed_s += run.elapsed_s
            if run.rc is None:
                # A thread py-spy cannot stop (an uninterruptible sleep): --native would wait as long.
                detail = f"py-spy did not answer in {self._python_deadline:g} s"
                tries.result = replace(
                    base, outcome=DumpOutcome.TIMEOUT, detail=detail, elapsed_s=run.elapsed_s
                )
                return
            if run.rc != 0:
                tries.why = "py-spy failed"  # its own run with --native says why, as before
                return
            tries.stops += 1
            raw = decode_dump(run.stdout)
            stacks = unwinder.unwind(base.pid, [int(t.os_thread_id) for t in raw if t.os_thread_id], grab)
        except UnwindError as exc:
            tries.lasting, tries.why = True, str(exc)
            return
        finally:
            grab.cancel()  # a no-op once it answered
        # Our stops are the main thread's: its wakeups are what a poll is told by (analyse/stackwaits).
        tries.stops += base.pid in stacks.threads
        tries.elapsed_s += stacks.elapsed_s
        merged = []
        for t in raw:
            native = stacks.threads.get(int(t.os_thread_id or 0))
            frames = merge(t.frames or (), native, _raw_native) if native is not None else None
            if frames is None:
                # The thread moved between py-spy's reading and the copy (or its unwinding stopped early):
                # the whole dump is tried again, then left to py-spy's --native.
                return
            merged.append(
                _RawThread(t.thread_id, t.os_thread_id, t.thread_name, t.active, t.owns_gil, tuple(frames))
            )
        threads = convert_threads(merged, self._source_line(base.pid))
        tries.result = replace(
            base,
            outcome=DumpOutcome.OK,
            threads=threads,
            native=True,
            elapsed_s=round(tries.elapsed_s, 4),
            stops=tries.stops,
        )

    def _dump_py_spy(self, base: ProcessStacks, native: bool) -> ProcessStacks:
        assert self.path is not None
        argv = [self.path, "dump", "--pid", str(base.pid), "--json"] + (["--native"] if native else [])
        deadline = self._native_deadline if native else self._python_deadline
        run = self._runner(argv, deadline)
        base = replace(base, elapsed_s=round(run.elapsed_s, 4))
        if run.rc is None:
            return replace(
                base, outcome=DumpOutcome.TIMEOUT, detail=f"py-spy did not answer in {deadline:g} s"
            )
        if run.rc != 0:
            outcome, detail = classify_failure(run.stderr, run.stdout)
            if outcome is DumpOutcome.GONE and procfs.read_stat(base.pid, self._root) is not None:
                outcome = DumpOutcome.FAILED
            if outcome is DumpOutcome.NOT_PYTHON:
                detail += kernel_wait(base.pid, self._root)
            return replace(base, outcome=outcome, detail=detail)
        try:
            threads = parse_dump(run.stdout, self._source_line(base.pid))
        except ValueError as exc:
            detail = f"unreadable py-spy output: {exc}"
            return replace(base, outcome=DumpOutcome.FAILED, detail=detail, stops=1)
        return replace(base, outcome=DumpOutcome.OK, threads=threads, native=native, stops=1)

    def _source_line(self, pid: int) -> Callable[[str, int], str | None]:
        """Source lines as the target sees them (through /proc/PID/root, for containers)."""

        def line_of(path: str, line: int) -> str | None:
            if not path.startswith("/") or line <= 0:
                return None
            key = f"{pid}:{path}"
            if key not in self._sources:
                self._sources[key] = _read_lines(
                    self._root / str(pid) / "root" / path.lstrip("/")
                ) or _read_lines(Path(path))
            lines = self._sources[key]
            if lines is None or line > len(lines):
                return None
            return lines[line - 1].strip()[:200] or None

        return line_of


class _RawFrame(msgspec.Struct, frozen=True, gc=False):
    """One frame as py-spy prints it (``locals``, ``is_entry`` and the like are skipped unread). Frozen,
    so a thread's frames hash: equal stacks of many ranks are converted once (``FrameCache.parsed``)."""

    name: str | None = None
    filename: str | None = None
    module: str | None = None
    short_filename: str | None = None
    line: int | None = None
    # Which frame each C-level call of the eval loop begins with (3.11+): what merges native frames in.
    is_entry: bool | None = None
    is_shim_entry: bool | None = None


class _RawThread(msgspec.Struct, gc=False):
    thread_id: int | None = None
    os_thread_id: int | None = None
    thread_name: str | None = None
    active: bool | None = None
    owns_gil: bool | None = None
    frames: tuple[_RawFrame, ...] | None = None


# Typed decoding straight into these structs is what makes a dump cheap to read (docs/stacks.md, "Where
# the time goes"); strict=False takes py-spy's numbers and booleans however they are spelled.
_DUMP_DECODER = msgspec.json.Decoder(list[_RawThread], strict=False)


def parse_dump(
    text: str, source_line: Callable[[str, int], str | None] | None = None
) -> tuple[ThreadStack, ...]:
    """py-spy's ``--json`` output (threads, frames leaf first) to threads with frames outermost first."""
    return convert_threads(decode_dump(text), source_line)


def decode_dump(text: str) -> list[_RawThread]:
    try:
        return _DUMP_DECODER.decode(text)
    except msgspec.ValidationError as exc:
        raise ValueError(f"expected a list of threads: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from None


def convert_threads(
    data: Sequence[_RawThread], source_line: Callable[[str, int], str | None] | None = None
) -> tuple[ThreadStack, ...]:
    threads = []
    for item in data:
        raw = item.frames or ()
        # Ranks in one wait print the same frames: the conversion (names shortened, unknown addresses
        # collapsed) is done once per distinct stack, and every rank shares its interned tuple.
        frames, python_at, path = FRAME_CACHE.parsed(raw, _convert)
        if source_line is not None and python_at >= 0:
            f = frames[python_at]
            code = source_line(path, f.line)
            if code is not None:
                frames = FRAME_CACHE.parsed((raw, code), _with_code)
        threads.append(
            ThreadStack(
                tid=int(item.os_thread_id or item.thread_id or 0),
                name=item.thread_name,
                active=bool(item.active),
                owns_gil=bool(item.owns_gil),
                frames=frames,
            )
        )
    return tuple(threads)


def _raw_native(f: NativeFrame) -> _RawFrame:
    """An unwound frame as py-spy's JSON gives a native one (an unknown function by its address)."""
    return _RawFrame(f.name or f"0x{f.pc:x}", f.module, f.module, None, 0, True, True)


def _convert(raw: tuple[_RawFrame, ...]) -> tuple[tuple[Frame, ...], int, str]:
    """A thread's raw frames (leaf first) to its interned frames (outermost first), with the index of its
    innermost Python frame (-1: none) and that frame's full path, where its source line is read from."""
    frames = _collapse_unknown([_frame(f) for f in reversed(raw)])
    for i in range(len(frames) - 1, -1, -1):
        f = frames[i]
        if not f.native:
            path = next(
                (str(r.filename) for r in raw if r.name == f.name and int(r.line or 0) == f.line),
                "",
            )
            return intern_frames(frames), i, path
    return intern_frames(frames), -1, ""


def _with_code(key: tuple[tuple[_RawFrame, ...], str]) -> tuple[Frame, ...]:
    """A thread's frames with the source line on its innermost Python frame, interned: once per distinct
    stack and line, as the frames themselves."""
    raw, code = key
    frames, at, _ = FRAME_CACHE.parsed(raw, _convert)
    f = frames[at]
    return intern_frames([*frames[:at], Frame(f.name, f.file, f.line, False, code), *frames[at + 1 :]])


def _frame(raw: _RawFrame) -> Frame:
    native = (
        raw.module is not None
        or str(raw.filename or "").endswith((".so", ".so.6"))
        or ".so." in str(raw.short_filename or "")
    )
    name = str(raw.name or "??")
    short = str(raw.short_filename or raw.filename or "")
    if native:
        short = Path(short).name
        name = "??" if _HEX.match(name) else short_native_name(name)
        return Frame(name, short, 0, True)
    return Frame(name, short, int(raw.line or 0), False)


def short_native_name(name: str) -> str:
    """``f<T, U>(int)::{lambda(x)#1}::_FUN`` -> ``f::{lambda#1}::_FUN``: templates and arguments dropped."""
    previous = None
    while previous != name:
        previous = name
        name = _NATIVE_TRIM.sub("", name)
    return name[:160]


def _collapse_unknown(frames: list[Frame]) -> list[Frame]:
    """Unsymbolised addresses differ per process (ASLR): keep one ``??`` per library run."""
    out: list[Frame] = []
    for f in frames:
        if (
            f.native
            and f.name == "??"
            and out
            and out[-1].native
            and out[-1].name == "??"
            and out[-1].file == f.file
        ):
            continue
        out.append(f)
    return out


def kernel_wait(pid: int, root: Path = procfs.PROC) -> str:
    """Where the kernel has a process py-spy cannot read (a C++ server, ``sleep``): its wait channel, and
    the innermost frames of its kernel stack where readable (root)."""
    parts = []
    wchan = procfs.read_wchan(pid, root)
    if wchan and wchan != "0":
        parts.append(f"in the kernel at {wchan}")
    try:
        lines = (root / str(pid) / "stack").read_text().splitlines()
    except OSError:
        lines = []
    frames = [line.split("] ", 1)[-1].split("+", 1)[0] for line in lines[:4] if line.strip()]
    if frames:
        parts.append("kernel stack " + " < ".join(frames))
    return f"; {', '.join(parts)}" if parts else ""


def classify_failure(stderr: str, stdout: str = "") -> tuple[DumpOutcome, str]:
    """py-spy's error text to an outcome and a reason a person can act on."""
    text = (stderr or stdout).strip()
    first = _first_line(text) or "py-spy failed without a message"
    if "Permission" in text or "permission" in text or "Operation not permitted" in text:
        return DumpOutcome.DENIED, f"permission denied ({first}). {PTRACE_HELP}"
    if any(m in text for m in _MISSING_PYTHON):
        return DumpOutcome.NOT_PYTHON, "not a Python process (py-spy found no interpreter in it)"
    if any(m in text for m in _GONE):
        return DumpOutcome.GONE, "the process ended during the dump"
    return DumpOutcome.FAILED, first


def _first_line(text: str | None) -> str:
    for raw in (text or "").splitlines():
        line = raw.strip()
        if line and not line.startswith("Stack backtrace"):
            return line[:300]
    return ""


def _read_lines(path: Path) -> list[str] | None:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return fh.read(2_000_000).splitlines()
    except OSError:
        return None


def _sigcont(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGCONT)


def _command_of(pid: int, root: Path) -> str:
    """A process outside the tree, in words for a verdict: its command line, redacted and cut (read, never
    signalled: hangwatch names such a holder and leaves it alone)."""
    argv = procfs.read_cmdline(pid, root)
    return " ".join(redact_argv(argv))[:200] if argv else f"[{pid}]"
