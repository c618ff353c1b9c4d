"""Did a thread's code move between two stack captures? The behaviour the spin rule stands on.

CPU time alone does not say that a process works: a rank waiting for a peer in a collective that
spins, a host thread polling a flag, an idle event loop that polls, all burn a core while nothing
moves. What shows work is the code moving: a stack that changes between captures. So a thread is
*in place* when every capture finds it in the same place, whatever its frames are called:

- the same Python frames, outermost first, with the same lines, down to one frame (the loop) whose
  line may vary, and at most ``POLL_DEPTH`` frames below it that may vary too: a poll loop
  ``while not ready(): pass`` is caught at the ``while`` line, in the body, or inside ``ready()``;
- where two or more captures have native frames, the same native calls below the innermost Python
  frame, each capture's a prefix of the deepest one's, or all parting only at their last frame below
  one that a capture ends in (a poll loop is caught between its calls or inside one of them, and
  innermost frames in the C library do not count: a C poll loop is caught inside or outside
  ``sched_yield``), so that a long native call whose inner code moves (a GEMM's kernels and packing
  routines, the compiler inside ``compile()``) is not in place.

Names are used only on the other side, as a guard: a native call into a compute library (BLAS,
oneDNN, MKL) is work even when two captures happen to find the same kernel, because a kernel that
dominates a long GEMM is caught at the same symbol most of the time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hangwatch.analyse.stackframes import significant_frames
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ThreadStack

# How deep a poll loop's helpers reach below the loop frame (``ready()`` > ``Event.is_set``).
POLL_DEPTH = 2

# The C library and the kernel: where every poll loop ends (sched_yield, nanosleep, futex, poll).
_SYSTEM_LIB = re.compile(r"^(?:libc[.-]|libpthread|ld-linux|linux-vdso|\[vdso\]|\[kernel)")
# Compute libraries: a thread inside them executes arithmetic, not a wait.
_COMPUTE = re.compile(
    r"gemm|gemv|\bblas|cblas_|openblas|mkl_|dnnl|onednn|xsmm|lapack|at::native::cpublas"
    r"|at::native::\w*(?:conv|matmul|addmm|bmm|baddbmm)",
    re.IGNORECASE,
)


def native_tail(thread: ThreadStack) -> tuple[tuple[str, str], ...]:
    """The named native calls below the innermost Python frame, system-library leaves trimmed."""
    frames = significant_frames(thread)
    last_py = max((i for i, f in enumerate(frames) if not f.native), default=-1)
    tail = [f for f in frames[last_py + 1 :] if f.native]
    while tail and _SYSTEM_LIB.match(tail[-1].file):
        tail.pop()
    return tuple((f.name, f.file) for f in tail)


def in_compute(thread: ThreadStack) -> bool:
    """A native frame of a compute library below the innermost Python frame."""
    return any(_COMPUTE.search(name) or _COMPUTE.search(file) for name, file in native_tail(thread))


def in_place(stacks: Sequence[ThreadStack], native: Sequence[ThreadStack] = ()) -> bool:
    """The same thread, captured two or more times, found in the same place every time.

    ``native``: the captures of it that were real native dumps (a Python-only capture may carry
    native frames borrowed from an earlier one, which prove nothing about the native code moving).
    """
    if len(stacks) < 2:
        return False
    if not _python_in_place([t.python_frames for t in stacks]):
        return False
    tails = [native_tail(t) for t in native]
    if not tails:
        return True
    # A poll loop is caught between calls or inside one: each tail is a prefix of the deepest.
    deepest = max(tails, key=len)
    if all(deepest[: len(tail)] == tail for tail in tails):
        return True
    # ...or inside either of the calls it makes in turn, once it was also caught in the loop frame itself:
    # the tails part only at their last frame, below a frame one capture ends in. vLLM's CPU all-reduce
    # waits for a peer in ``wait_for_one``, which reads ``get_curr_stamp`` then ``get_ready_stamp``: five
    # captures over 32 s found it in one, the other or between, and the rank spinning there for a peer
    # that had left was not in place (vllm-tp2-TP1-compile-raise-run). A driver whose time goes into its
    # callees (a GEMM's kernels and packing) is seldom caught in itself, and code whose callers move too
    # (a compiler, a kernel's loop nest) parts higher up.
    common = _shared_length(tails)
    return any(len(tail) == common for tail in tails) and all(len(tail) <= common + 1 for tail in tails)


def walks_helpers(stacks: Sequence[ThreadStack]) -> bool:
    """Captures that find the loop frame calling different functions: a loop walking through several
    helpers (a recursion, then a sort, then a table build) works, where a poll loop re-reads one
    condition (``while not ready(): pass`` is found in the loop frame, in ``ready`` or below it, never in
    another function beside ``ready``). Within ``POLL_DEPTH`` both shapes look in place; which helpers
    the captures found is what tells them apart (2026-12-04: a rank of torch.multiprocessing.spawn
    building tables while its peer waited in the all-reduce, caught in its sort, its dict build and its
    sort, touched no fresh memory inside a process whose allocator kept its pages, and was stalled
    as a spin at an 8 s window)."""
    keys = [[(f.name, f.file) for f in t.python_frames] for t in stacks]
    common = _shared_length(keys)
    helpers = {k[common] for k in keys if len(k) > common}
    return len(helpers) >= 2


def apart_at_the_leaf(stacks: Sequence[ThreadStack], native: Sequence[ThreadStack] = ()) -> bool:
    """The same Python frames, and native calls that part only at their last frame: the two calls of a
    poll loop caught one in each (``wait_for_one`` reading ``get_curr_stamp``, then
    ``get_ready_stamp``), which ``in_place`` accepts only once a capture is in the loop frame itself.
    Not a proof of a loop on its own (a GEMM's driver caught in two kernels parts there too); only
    where later captures already hold the thread in place, as the same loop. Never inside a compute
    library: that is work, whichever kernel two captures catch."""
    if len(stacks) < 2 or not _python_in_place([t.python_frames for t in stacks]):
        return False
    if any(in_compute(t) for t in native):
        return False
    tails = [native_tail(t) for t in native]
    if not tails:
        return True
    common = _shared_length(tails)
    return all(len(tail) <= common + 1 for tail in tails)


def _shared_length(paths: Sequence[Sequence[tuple[str, str]]]) -> int:
    """How many frames, outermost first, every path shares."""
    common = 0
    shortest = min(len(path) for path in paths)
    while common < shortest and all(path[common] == paths[0][common] for path in paths):
        common += 1
    return common


def _python_in_place(stacks: Sequence[tuple[Frame, ...]]) -> bool:
    keys = [[(f.name, f.file) for f in frames] for frames in stacks]
    common = _shared_length(keys)
    if common == 0:
        return all(not k for k in keys)  # no Python frames at all: the native frames decide
    if any(len(k) - common > POLL_DEPTH for k in keys):
        return False
    # A function on the common path met again below it is a recursion caught at another depth: the
    # descent moves (a parser, a tree walk, Dynamo's frame evaluation). A poll loop's helpers are
    # other functions than the ones that lead to the loop.
    on_path = set(keys[0][:common])
    if any(key in on_path for k in keys for key in k[common:]):
        return False
    # A loop frame that is itself a step of a recursion is in place only when every capture found the
    # very same frames and lines: a descent's depth and leaves change all the time, and three captures of
    # one that agree to within a helper are a coincidence (1 triple in 80 for tests/programs'
    # compile_like), while a spin inside a recursion stays at one depth.
    # Frames compared by place only: a capture that borrowed an earlier dump's native frames carries
    # that dump's source lines too (vllm-tp2-TP1-compile-raise-run, 2026-12-04: TP0's op call, met twice
    # on its path, was "moving" once the spell's last capture was enriched).
    places = [[(f.name, f.file, f.line) for f in frames] for frames in stacks]
    if keys[0][common - 1] in keys[0][: common - 1] and any(place != places[0] for place in places[1:]):
        return False
    # Above the loop frame the lines must agree: the caller has not moved on.
    return all(all(frames[i].line == stacks[0][i].line for frames in stacks[1:]) for i in range(common - 1))
