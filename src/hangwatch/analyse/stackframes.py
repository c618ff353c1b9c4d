"""The frames of a thread worth looking at, and where it waits.

Native frames that only say how the interpreter got there (``??``, ``pybind11::``, ``_PyEval``) are
dropped; native frames below the innermost Python frame are kept: they name the wait
(``c10d::Work::wait``). Every result is computed once per frames tuple (``memo``: the one
``model.stacks.FRAME_CACHE``; the py-spy boundary interns equal stacks into one tuple).
"""

from __future__ import annotations

import re

from hangwatch.model.stacks import FRAME_CACHE
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ThreadStack

_GLUE = re.compile(
    r"^(?:\?\?|0x[0-9a-f]+|_?Py[A-Z_]\w*|pybind11|thread_run$|start_thread$|clone3?$|__libc_|_start$)"
)
_STDLIB = frozenset(
    {
        "threading.py",
        "queue.py",
        "selectors.py",
        "socket.py",
        "subprocess.py",
        "socketserver.py",
        "ssl.py",
        "multiprocessing",
        "asyncio",
        "concurrent",
        "selectors",
        "contextlib.py",
    }
)


# ``compute(frames)``, once per kind and frames tuple object (identical stacks share one tuple).
memo = FRAME_CACHE.memo


def significant_frames(thread: ThreadStack) -> tuple[Frame, ...]:
    """The frames worth merging and showing: Python frames, and native frames inside or below them."""
    return significant(thread.frames)


def significant(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """``significant_frames`` of a thread's frames tuple, memoised."""
    return memo("significant", frames, _significant)


def signature(thread: ThreadStack) -> tuple[tuple[str, str, int], ...]:
    """``ThreadStack.signature``, memoised: identity over time (Python frames and their lines)."""
    return memo("signature", thread.frames, lambda _: thread.signature())


def _significant(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    first_python = next((i for i, f in enumerate(frames) if not f.native), None)
    if first_python is None:
        return tuple(f for f in frames if not _GLUE.match(f.name))
    return tuple(f for f in frames[first_python:] if not (f.native and _GLUE.match(f.name)))


def is_stdlib(f: Frame) -> bool:
    """A frame of the standard library's waiting machinery (threading, queues, pipes, selectors)."""
    return f.file.split("/", 1)[0] in _STDLIB or f.file in _STDLIB


def wait_point(thread: ThreadStack) -> str:
    """Where a thread is, short: its innermost own frame, then what it waits in.

    ``all_reduce > c10d::Work::wait``; ``CudaGraphRunner.capture > Event.wait``;
    ``rank_main > Queue.get`` (the standard library's waiting machinery below is left out).
    """
    return memo("wait-point", thread.frames, lambda _: _wait_point(significant_frames(thread)))


def _wait_point(frames: tuple[Frame, ...]) -> str:
    python = [i for i, f in enumerate(frames) if not f.native]
    if not python:
        return frames[-1].name if frames else "?"
    leaf = python[-1]
    owner = next((i for i in reversed(python) if not is_stdlib(frames[i])), leaf)
    if owner == leaf:
        return frames[leaf].name + (f" > {frames[leaf + 1].name}" if leaf + 1 < len(frames) else "")
    below = next((i for i in python if i > owner), leaf)
    return f"{frames[owner].name} > {frames[below].name}"
