"""The ptrace boundary: copy the registers and used stack of some threads of a process, holding them for
milliseconds. Run as a script of its own (``python -I -S ptracegrab.py WAIT_S PID``, then the thread
ids as one line on stdin), standard library only.

Why a process of its own: a thread stuck in an uninterruptible sleep (a GPU driver call, a dead NFS mount)
does not stop when asked, and a tracer that waits for it would hang the watch. The caller gives this
script a deadline and kills it past that: when a tracer ends, the kernel detaches its tracees and they run
on. ``PTRACE_SEIZE`` sends no SIGSTOP, so nothing is left stopped even then (``PTRACE_ATTACH`` would leave
a pending SIGSTOP behind a killed tracer).

Every thread is asked to stop first, then each one that stopped is read (its registers, its stack from
the stack pointer to the top of its stack mapping, capped), then all are let go: the process is held only
while its stacks are copied. Unwinding happens later, in the caller, from the copy.

Output on stdout, per thread: a header ``<iiQI`` (tid, status, stack address, stack length), the 27
registers of ``user_regs_struct`` (only when status is 0), then the stack bytes. Status: 0 read,
1 gone, 2 not permitted, 3 did not stop in time, 4 unreadable.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
import time
from pathlib import Path

PTRACE_GETREGS = 12
PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000
NREGS = 27  # x86_64 user_regs_struct
RSP_INDEX = 19
STACK_CAP = 1 << 21  # 2 MiB a thread: deeper than any Python program's native stack we need the top of
RED_ZONE = 128  # the System V ABI lets a leaf function use 128 bytes below the stack pointer

OK, GONE, DENIED, NOT_STOPPED, UNREADABLE = range(5)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    return libc


def _mappings(pid: int) -> list[tuple[int, int]]:
    spans = []
    with Path(f"/proc/{pid}/maps").open() as f:
        for line in f:
            lo, hi = line.split(" ", 1)[0].split("-")
            spans.append((int(lo, 16), int(hi, 16)))
    return spans


def grab(pid: int, tids: list[int], wait_s: float) -> list[tuple[int, int, tuple[int, ...], int, bytes]]:
    libc = _libc()
    status: dict[int, int] = {}
    # Read before any thread is held: a CUDA process maps thousands of regions.
    try:
        spans = _mappings(pid)
    except OSError:
        spans = []
    seized = []
    for tid in tids:
        if not Path(f"/proc/{pid}/task/{tid}").exists():
            status[tid] = GONE  # never a thread of another process: only this one's are touched
            continue
        if libc.ptrace(PTRACE_SEIZE, tid, None, None) == 0:
            seized.append(tid)
        else:
            status[tid] = GONE if ctypes.get_errno() == errno.ESRCH else DENIED
    for tid in seized:
        libc.ptrace(PTRACE_INTERRUPT, tid, None, None)
    signals = _wait_stopped(seized, wait_s, status)
    stopped = [t for t in seized if t not in status]
    try:
        out = _read(libc, pid, stopped, status, spans)
    finally:
        for tid in stopped:
            # A signal that arrived while we held the thread is given back as we let it go.
            libc.ptrace(PTRACE_DETACH, tid, None, ctypes.c_void_p(signals.get(tid, 0) or None))
    out.extend((tid, status[tid], (), 0, b"") for tid in tids if tid in status)
    return out


def _wait_stopped(seized: list[int], wait_s: float, status: dict[int, int]) -> dict[int, int]:
    """Wait (polling, never blocking) until each thread has stopped; those still running by ``wait_s``
    get NOT_STOPPED. Returns the signals that stopped threads instead of our interrupt."""
    signals: dict[int, int] = {}
    pending = set(seized)
    deadline = time.monotonic() + wait_s
    while pending:
        for tid in list(pending):
            try:
                got, st = os.waitpid(tid, os.WNOHANG | WALL)
            except ChildProcessError:
                status[tid] = GONE
                pending.discard(tid)
                continue
            if got == 0:
                continue
            pending.discard(tid)
            if not os.WIFSTOPPED(st):
                status[tid] = GONE
            elif st >> 16 != PTRACE_EVENT_STOP:
                signals[tid] = os.WSTOPSIG(st)
        if pending and time.monotonic() > deadline:
            status.update(dict.fromkeys(pending, NOT_STOPPED))
            break
        if pending:
            time.sleep(0.0005)
    return signals


def _read(
    libc: ctypes.CDLL, pid: int, stopped: list[int], status: dict[int, int], spans: list[tuple[int, int]]
) -> list[tuple[int, int, tuple[int, ...], int, bytes]]:
    """Each stopped thread's registers and its stack from just below the stack pointer to its top."""
    try:
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        status.update(dict.fromkeys(stopped, UNREADABLE))
        return []
    out = []
    try:
        regs_buf = (ctypes.c_ulonglong * NREGS)()
        for tid in stopped:
            if libc.ptrace(PTRACE_GETREGS, tid, None, ctypes.addressof(regs_buf)) != 0:
                status[tid] = UNREADABLE
                continue
            regs = tuple(regs_buf)
            rsp = regs[RSP_INDEX]
            span = next(((lo, hi) for lo, hi in spans if lo <= rsp < hi), (rsp, rsp))
            start = max(rsp - RED_ZONE, span[0])
            try:
                stack = os.pread(mem, min(span[1] - start, STACK_CAP), start) if span[1] > start else b""
            except OSError:
                stack = b""
            out.append((tid, OK, regs, start, stack))
    finally:
        os.close(mem)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: ptracegrab.py WAIT_S PID, then a line of thread ids on stdin\n")
        return 2
    wait_s, pid = float(argv[1]), int(argv[2])
    # Started ahead and told the threads when the caller is ready: the copy is then taken within a
    # millisecond or two of py-spy's reading of the same threads, not after an interpreter's start.
    line = sys.stdin.readline()
    tids = [int(a) for a in line.split()]
    if not tids:
        return 0
    write = sys.stdout.buffer.write
    for tid, st, regs, start, stack in grab(pid, tids, wait_s):
        write(struct.pack("<iiQI", tid, st, start, len(stack)))
        if st == OK:
            write(struct.pack(f"<{NREGS}Q", *regs))
            write(stack)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
