"""Native stacks of a process's Python threads, unwound here from a copy of their stacks, with every ELF
file's tables kept across processes and rounds; and their merge with py-spy's Python frames.

``py-spy dump --native`` costs 0.1-2 s a process, nearly all of it loading symbol tables, and it keeps
nothing from one process or round to the next (docs/stacks.md, "Native frames"). Here a capture is:

1. ``py-spy dump --json`` without ``--native`` (milliseconds): the Python frames, and which of them each
   C-level call of the interpreter's eval loop runs (``is_entry``);
2. ``ptracegrab.py`` (a process of its own, under a deadline): the threads' registers and used stack,
   copied while they are held for milliseconds;
3. here: each stack unwound with the DWARF call-frame information of ``.eh_frame`` (``collect/elf.py``),
   function names looked up by the start address the unwinding found, names demangled by ``c++filt``
   once each;
4. ``merge``: py-spy's own rule (``native_stack_trace.rs``): each ``_PyEval_EvalFrameDefault`` in the
   native stack is replaced by the Python frames it runs, the interpreter's other functions are dropped
   (a few, like ``time_sleep`` and ``lock_PyThread_acquire_lock``, are kept), everything else stays.

Supported where it is measured: x86_64 with ``c++filt`` on PATH. Anything else (another architecture, a
thread whose copy cannot be unwound or merged) says why, and the caller falls back to py-spy's own
``--native`` for that process.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import platform
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from typing import TypeVar

from hangwatch.collect import procfs
from hangwatch.collect.elf import RA
from hangwatch.collect.elf import RSP
from hangwatch.collect.elf import ElfError
from hangwatch.collect.elf import ElfFile
from hangwatch.collect.elf import Row
from hangwatch.collect.elf import evaluate

GRAB_SCRIPT = Path(__file__).with_name("ptracegrab.py")
# Threads are asked to stop and given this long to do so; the grabber itself gets the rest of the deadline.
STOP_WAIT_S = 0.5
GRAB_DEADLINE_S = 3.0
GRABBER_NICE = -10  # as py-spy's dumpers (collect/stacks.py)
MAX_FRAMES = 256
MAX_FILES = 512  # ELF files kept open: a large server maps a few hundred libraries
_NREGS = 27
_HEADER = struct.Struct("<iiQI")
_REGS = struct.Struct(f"<{_NREGS}Q")
# user_regs_struct's order, as DWARF register numbers (rax 0, rdx 1, rcx 2, rbx 3, rsi 4, rdi 5, rbp 6,
# rsp 7, r8-r15 8-15, the return address 16).
_DWARF_OF_USER = {10: 0, 12: 1, 11: 2, 5: 3, 13: 4, 14: 5, 4: 6, 19: 7, 9: 8, 8: 9, 7: 10, 6: 11}
_DWARF_OF_USER.update({3: 12, 2: 13, 1: 14, 0: 15, 16: RA})
# The System V ABI's callee-saved registers: the only ones whose values hold in a caller's frame.
_CALLEE_SAVED = frozenset({3, 6, RSP, 12, 13, 14, 15})
_GRAB_STATUS = {1: "the thread ended", 2: "not permitted", 3: "did not stop in time", 4: "unreadable"}

# py-spy's merge (native_stack_trace.rs, get_merge_strategy): functions of the interpreter kept as frames.
_KEPT_INTERPRETER = frozenset(
    {"time", "sys", "gc", "os", "unicode", "thread", "stringio", "sre", "PyGilState", "PyThread", "lock"}
)
_TOKENS = re.compile(r"[^_.]+")
# The compiler's clones of a function (``select_select_impl.constprop.0``, c++filt's ``f() [clone .cold]``)
# carry its name: debug information, and py-spy reading it, name the function itself.
_CLONE = re.compile(
    r"(?:\.(?:isra|constprop|part|cold|lto_priv|localalias|llvm)(?:\.\d+)*| \[clone [^\]]*\])+$"
)


# py-spy's Cython handling (cython.rs): the call helpers Cython generates are left out, and a function's
# mangled name (``__pyx_pw_13cupy_backends_4cuda_3api_7runtime_27deviceSynchronize``) loses its prefix and
# its module and class parts (``deviceSynchronize``).
_CYTHON_HELPERS = frozenset(
    {
        "__Pyx_PyFunction_FastCallDict",
        "__Pyx_PyObject_CallOneArg",
        "__Pyx_PyObject_Call",
        "__pyx_FusedFunction_call",
    }
)
_CYTHON_PREFIXES = (
    "__pyx_fuse_1_0__pyx_pw",
    "__pyx_fuse_0__pyx_f",
    "__pyx_fuse_1__pyx_f",
    "__pyx_pf",
    "__pyx_pw",
    "__pyx_f",
    "___pyx_f",
    "___pyx_pw",
)
_LENGTH = re.compile(r"_(\d+)")


def cython_name(name: str) -> str:
    """py-spy's ``cython::demangle``: past the prefix, each ``_<n>`` names a part of ``n`` characters (the
    module's, the class's); the last part is the function."""
    prefix = next((p for p in _CYTHON_PREFIXES if name.startswith(p)), None)
    if prefix is None:
        return name
    current = rest = name[len(prefix) :]
    while (m := _LENGTH.match(rest)) is not None:
        current = rest[m.end() :]
        if int(m.group(1)) + m.end() >= len(current):
            break
        rest = rest[int(m.group(1)) + m.end() :]
    return current


class UnwindError(Exception):
    """This process cannot be unwound here; the message says why (the caller falls back to py-spy)."""


@dataclass(frozen=True)
class NativeFrame:
    """One native frame, leaf first in a stack. ``name``: the demangled function name, None where the file
    has no symbol there; ``interpreter``: the frame is in the Python binary or libpython."""

    pc: int
    module: str
    name: str | None
    interpreter: bool


@dataclass(frozen=True)
class NativeStacks:
    """A process's unwound threads (tid -> frames, leaf first) and the threads left out, with why."""

    threads: dict[int, tuple[NativeFrame, ...]]
    missing: dict[int, str]
    elapsed_s: float


@dataclass(frozen=True)
class _Grab:
    tid: int
    regs: tuple[int, ...]
    start: int
    stack: bytes


@dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    path: str
    elf: ElfFile
    bias: int
    interpreter: bool


class Grab:
    """One grabber, started ahead: it waits for the thread ids, so the interpreter's start (20-30 ms)
    overlaps py-spy's run and the copy follows py-spy's reading within a millisecond or two."""

    def __init__(self, argv: list[str], deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        with contextlib.suppress(OSError):
            # It holds its target's threads while it copies them: as py-spy's dumpers, it is not left to
            # starve on a loaded machine where we may raise its priority (collect/stacks.py).
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, GRABBER_NICE)

    def run(self, tids: Sequence[int]) -> tuple[int | None, bytes, str]:
        """The threads' copies: (exit code, output, error text); None as the code past the deadline, when
        its whole group is killed (its tracees run on: the kernel detaches them)."""
        try:
            out, err = self.proc.communicate(" ".join(map(str, tids)).encode() + b"\n", self.deadline_s)
            return self.proc.returncode, out, err.decode(errors="replace")
        except subprocess.TimeoutExpired:
            self.cancel()
            return None, b"", f"the stack grabber did not answer in {self.deadline_s:g} s"

    def cancel(self) -> None:
        """Kill it unless it already ended (and was reaped: its pid may be another process's now)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ValueError, OSError):
            self.proc.communicate()


class NativeUnwinder:
    """Unwinds native stacks; keeps each ELF file's tables and every demangled name for its lifetime (one
    collector, one watch), so a library is read once however many processes and rounds map it."""

    def __init__(
        self,
        root: Path = procfs.PROC,
        *,
        # Words before the grabber's command (a test runs it as another user).
        prefix: Sequence[str] = (),
        deadline_s: float = GRAB_DEADLINE_S,
        cxxfilt: str | None = None,  # None: c++filt from PATH; "": none
        machine: str | None = None,
    ) -> None:
        self._root = root
        self._prefix = list(prefix)
        self._deadline = deadline_s
        self._cxxfilt = cxxfilt if cxxfilt is not None else shutil.which("c++filt")
        self._machine = machine if machine is not None else platform.machine()
        # Most recently used last; dropped, never closed, when full: a thread may still read one.
        self._files: OrderedDict[tuple[int, int, int, int], ElfFile | None] = OrderedDict()
        self._files_lock = threading.Lock()  # a capture unwinds its processes in parallel threads
        self._demangled: dict[str, str] = {}
        self._vdso_image: bytes | None = None  # ours, read at the first target that maps one
        self._vdso_elf: ElfFile | None = None

    @property
    def unavailable(self) -> str | None:
        if self._machine not in ("x86_64", "AMD64"):
            return f"our native unwinder reads x86_64 only (this is {self._machine})"
        if not self._cxxfilt:
            return "c++filt (binutils) is not on PATH: C++ names could not be demangled"
        return None

    def start(self, pid: int) -> Grab:
        """Start a grabber for this process; ``unwind`` gives it the threads."""
        argv = [*self._prefix, sys.executable, "-I", "-S", str(GRAB_SCRIPT), f"{STOP_WAIT_S:g}", str(pid)]
        return Grab(argv, self._deadline)

    def unwind(self, pid: int, tids: Sequence[int], grab: Grab | None = None) -> NativeStacks:
        """Copy the threads' stacks and unwind them. Raises ``UnwindError`` when nothing could be read."""
        started = time.monotonic()
        grab = grab or self.start(pid)
        maps = procfs.read_maps(pid, self._root)
        if maps is None:
            grab.cancel()
            raise UnwindError(f"/proc/{pid}/maps is not readable")
        rc, out, err = grab.run(tids)
        if rc != 0:
            raise UnwindError(err.strip().splitlines()[-1] if err.strip() else f"the grabber exited {rc}")
        grabs, missing = _parse_grabs(out)
        if not grabs:
            raise UnwindError("; ".join(sorted(set(missing.values()))) or "no thread was read")
        mappings = self._mappings(pid, maps)
        starts = [m.start for m in mappings]
        raw: dict[int, list[tuple[int, _Mapping | None, int | None]]] = {}
        for g in grabs:
            raw[g.tid] = _unwind_one(g, mappings, starts)
        names = self._names(raw)
        threads = {
            tid: tuple(
                NativeFrame(
                    pc,
                    m.path if m is not None else "?",
                    names.get((id(m.elf), fstart)) if m is not None and fstart is not None else None,
                    m.interpreter if m is not None else False,
                )
                for pc, m, fstart in frames
            )
            for tid, frames in raw.items()
        }
        return NativeStacks(threads, missing, round(time.monotonic() - started, 4))

    def _mappings(self, pid: int, maps: list[tuple[int, int, str, int, int, str]]) -> list[_Mapping]:
        exe = procfs.read_exe(pid, self._root)
        out = []
        for start, end, perms, offset, inode, path in maps:
            if "x" not in perms:
                continue
            clean = path.removesuffix(" (deleted)")
            elf = self._vdso(end - start) if clean == "[vdso]" else self._file(pid, clean, start, end, inode)
            if elf is None:
                continue
            bias = elf.bias_for(offset, start)
            if bias is None:
                continue
            interpreter = clean == exe or "libpython" in Path(clean).name
            out.append(_Mapping(start, end, clean, elf, bias, interpreter))
        return out

    def _vdso(self, size: int) -> ElfFile | None:
        """The kernel's vDSO (``clock_gettime``, ``gettimeofday``), which a thread polling the clock is
        often caught in (a CUDA synchronize spins on it): in memory only, never a file. Every 64-bit
        process of this kernel maps the same image, so it is read from our own mapping, once; a target's
        of another size is not that image."""
        if self._vdso_image is None:
            self._vdso_image = _own_vdso()
        image = self._vdso_image
        if not image or len(image) != size:
            return None
        if self._vdso_elf is None:
            try:
                self._vdso_elf = ElfFile(image)
            except Exception:  # an image we cannot read is one without frames, never a crash
                self._vdso_image = b""
                return None
        return self._vdso_elf

    def _file(self, pid: int, path: str, start: int, end: int, inode: int) -> ElfFile | None:
        """The mapped file, read once. Through the process's root (a container sees its own /usr); where
        the file at that path is not the one mapped (deleted, or replaced by an upgrade under a running
        server: another inode), through the mapping itself (root only)."""
        proc = self._root / str(pid)
        for candidate in (proc / "root" / path.lstrip("/"), proc / "map_files" / f"{start:x}-{end:x}"):
            try:
                st = candidate.stat()
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or (inode and st.st_ino != inode):
                continue
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            with self._files_lock:
                if key in self._files:
                    self._files.move_to_end(key)
                    return self._files[key]
            try:
                elf: ElfFile | None = ElfFile(candidate)
            except Exception:  # any file we cannot read is one without frames, never a crash
                elf = None
            with self._files_lock:
                self._files[key] = elf
                while len(self._files) > MAX_FILES:
                    self._files.popitem(last=False)
            return elf
        return None

    def _names(
        self, raw: dict[int, list[tuple[int, _Mapping | None, int | None]]]
    ) -> dict[tuple[int, int], str]:
        wanted: dict[int, tuple[ElfFile, set[int]]] = {}
        for frames in raw.values():
            for _, m, fstart in frames:
                if m is not None and fstart is not None:
                    wanted.setdefault(id(m.elf), (m.elf, set()))[1].add(fstart)
        found: dict[tuple[int, int], str] = {}
        for key, (elf, fstarts) in wanted.items():
            for fstart, name in elf.names_for(fstarts).items():
                if name is not None:
                    found[(key, fstart)] = name
        self._demangle({n for n in found.values() if n.startswith("_Z")})
        return {k: cython_name(_CLONE.sub("", self._demangled.get(v, v))) for k, v in found.items()}

    def _demangle(self, mangled: set[str]) -> None:
        todo = sorted(n for n in mangled if n not in self._demangled and "\n" not in n)
        if not todo or not self._cxxfilt:
            return
        try:
            done = subprocess.run(
                [self._cxxfilt, "-p"],  # no parameters and no return types, as py-spy demangles
                input="\n".join(todo) + "\n",
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return
        lines = done.stdout.splitlines()
        if done.returncode == 0 and len(lines) == len(todo):
            self._demangled.update(zip(todo, lines, strict=True))


def _own_vdso() -> bytes:
    """This process's vDSO image ("" where it has none or it cannot be read)."""
    try:
        for start, end, _, _, _, path in procfs.parse_maps(Path("/proc/self/maps").read_text()):
            if path == "[vdso]":
                with Path("/proc/self/mem").open("rb", buffering=0) as mem:
                    mem.seek(start)
                    return mem.read(end - start)
    except (OSError, ValueError, OverflowError):
        pass
    return b""


def _parse_grabs(out: bytes) -> tuple[list[_Grab], dict[int, str]]:
    grabs: list[_Grab] = []
    missing: dict[int, str] = {}
    pos = 0
    while pos + _HEADER.size <= len(out):
        tid, status, start, length = _HEADER.unpack_from(out, pos)
        pos += _HEADER.size
        if status != 0:
            missing[tid] = _GRAB_STATUS.get(status, f"status {status}")
            continue
        if pos + _REGS.size + length > len(out):
            missing[tid] = "the grabber's answer was cut short"
            break
        regs = _REGS.unpack_from(out, pos)
        pos += _REGS.size
        grabs.append(_Grab(tid, regs, start, out[pos : pos + length]))
        pos += length
    return grabs, missing


def _unwind_one(
    g: _Grab, mappings: list[_Mapping], starts: list[int]
) -> list[tuple[int, _Mapping | None, int | None]]:
    """One thread's frames, leaf first: (pc, its mapping, its function's start as a file address)."""
    regs = {dwarf: g.regs[user] for user, dwarf in _DWARF_OF_USER.items()}
    pc = regs.pop(RA)
    frames: list[tuple[int, _Mapping | None, int | None]] = []
    stack, base = g.stack, g.start

    def read(addr: int) -> int:
        at = addr - base
        if at < 0 or at + 8 > len(stack):
            raise ElfError(f"{addr:#x} is outside the copied stack")
        value: int = struct.unpack_from("<Q", stack, at)[0]
        return value

    exact = True  # the leaf's pc, and a pc a signal interrupted, are exact
    for _ in range(MAX_FRAMES):
        # A caller's pc is a return address: the call itself is the byte before it (it may end a function).
        lookup = pc if exact else pc - 1
        i = bisect.bisect_right(starts, lookup) - 1
        m = mappings[i] if i >= 0 and lookup < mappings[i].end else None
        if m is None:
            frames.append((pc, None, None))
            break
        row = m.elf.row_at(lookup - m.bias) if m.elf.can_unwind else None
        frames.append((pc, m, row.start if row is not None else None))
        if row is None:
            break
        try:
            nxt = _step(row, {**regs, RA: pc}, read)  # rip is register 16 to an expression (PLT stubs)
        except (ElfError, IndexError, KeyError, struct.error):
            break
        if nxt is None:
            break
        pc, new = nxt
        if new[RSP] <= regs[RSP] or pc == 0:
            break  # no progress up the stack: a corrupt or hand-written frame
        regs = new
        exact = row.signal
    return frames


def _step(row: Row, regs: dict[int, int], read: Callable[[int], int]) -> tuple[int, dict[int, int]] | None:
    """The caller's pc and registers, or None at the outermost frame (its return address is undefined)."""
    if row.cfa_expr:
        cfa = evaluate(row.cfa_expr, regs, read)
    else:
        cfa = (regs[row.cfa_reg] + row.cfa_offset) & 0xFFFFFFFFFFFFFFFF
    new = {r: v for r, v in regs.items() if r in _CALLEE_SAVED}  # RA is not: it is what we look for
    ra: int | None = None
    for reg, rule in row.rules:
        if rule.kind == "offset":
            value = read(cfa + rule.value)
        elif rule.kind == "val_offset":
            value = cfa + rule.value
        elif rule.kind == "register":
            value = regs[rule.value]
        elif rule.kind == "expression":
            value = read(evaluate(rule.expr, regs, read, push_cfa=cfa))
        elif rule.kind == "val_expression":
            value = evaluate(rule.expr, regs, read, push_cfa=cfa)
        else:  # undefined
            new.pop(reg, None)
            if reg == RA:
                return None
            continue
        if reg == RA:
            ra = value
        else:
            new[reg] = value
    if ra is None:
        return None
    new[RSP] = cfa
    return ra, new


class PythonFrame(Protocol):
    @property
    def is_entry(self) -> bool | None: ...

    @property
    def is_shim_entry(self) -> bool | None: ...


F = TypeVar("F", bound=PythonFrame)


def merge(
    python: Sequence[F], native: Sequence[NativeFrame], make: Callable[[NativeFrame], F]
) -> list[F] | None:
    """py-spy's merge of one thread's Python frames (leaf first) into its native stack (leaf first); None
    when they disagree by more than py-spy allows (the two were read at different moments)."""
    merged: list[F] = []
    at = 0
    for f in native:
        if f.interpreter:
            tokens = _TOKENS.findall(f.name or "")
            if not tokens:
                continue
            if tokens[0] == "PyEval" and len(tokens) > 1 and tokens[1] in ("EvalFrameDefault", "EvalFrameEx"):
                # The Python frames this C-level call of the eval loop runs: up to its entry frame.
                while at < len(python):
                    merged.append(python[at])
                    if python[at].is_entry or python[at].is_shim_entry:
                        break
                    at += 1
                at += 1
                continue
            if tokens[0] not in _KEPT_INTERPRETER:
                continue
        if _ignored(f):
            continue
        merged.append(make(f))
    if at == 0:
        merged.extend(python)  # no eval frame found (the unwinding stopped early): Python frames below
    elif at not in (len(python), len(python) + 1):
        return None
    return merged


def _ignored(f: NativeFrame) -> bool:
    """The frames py-spy leaves out: the process's and threads' start in libc, Cython's call helpers."""
    name = f.name or ""
    return (
        (name in ("__libc_start_main", "__clone") and "/libc" in f.module)
        or (name == "start_thread" and "/libpthread" in f.module)
        or name in _CYTHON_HELPERS
    )
