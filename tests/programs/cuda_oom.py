"""A server that dies of a CUDA out-of-memory error, exactly as PyTorch reports it, without torch.

Prints phase lines, then raises an uncaught ``OutOfMemoryError`` whose ``__module__`` is ``torch``, so
Python's own traceback printer ends with the line a real PyTorch CUDA OOM ends with::

    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity
    of 79.19 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has 77.96 GiB
    memory in use. Of the allocated memory 75.81 GiB is allocated by PyTorch, and 1.12 GiB is reserved
    by PyTorch but unallocated. If reserved but unallocated memory is large try setting
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for
    Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)

(one line; the message follows c10/cuda/CUDACachingAllocator.cpp, double spaces included). Exit status 1.
No module named torch is created, so a real torch next to this file is never shadowed.
``--ready-file`` is written just before the raise.

Example::

    python tests/programs/cuda_oom.py --tried-gib 2
"""

from __future__ import annotations

import argparse
import time

from _util import add_ready_file_arg
from _util import log
from _util import write_ready


class OutOfMemoryError(RuntimeError):
    """Stand-in for ``torch.OutOfMemoryError`` (a RuntimeError subclass in torch too)."""


# Python prints an uncaught exception as ``{__module__}.{__qualname__}: message``.
OutOfMemoryError.__module__ = "torch"


def oom_message(tried_gib: float, total_gib: float, free_gib: float, device: int = 0) -> str:
    """Build the message the CUDA caching allocator raises, with self-consistent numbers."""
    in_use = total_gib - free_gib
    reserved_unallocated = 1.12
    allocated = in_use - reserved_unallocated - 1.03  # the rest is CUDA context / non-PyTorch memory
    return (
        f"CUDA out of memory. Tried to allocate {tried_gib:.2f} GiB. GPU {device} has a total capacity of "
        f"{total_gib:.2f} GiB of which {free_gib:.2f} GiB is free. Including non-PyTorch memory, this "
        f"process has {in_use:.2f} GiB memory in use. Of the allocated memory {allocated:.2f} GiB is "
        f"allocated by PyTorch, and {reserved_unallocated:.2f} GiB is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def convert(message: str) -> None:
    """Where torch's ``Module._apply`` moves one tensor to the GPU and the allocator gives up."""
    raise OutOfMemoryError(message)


def _apply(message: str) -> None:
    convert(message)


def load_model(message: str, ready_file: str | None) -> None:
    """Print the phases and fail moving the model to the GPU."""
    log("Loading weights")
    time.sleep(0.2)
    log("Weights loaded")
    log("Moving model to cuda:0")
    write_ready(ready_file)
    _apply(message)


def main() -> None:
    """Parse arguments and die of an OOM."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tried-gib", type=float, default=2.0, help="size of the failing allocation")
    parser.add_argument("--total-gib", type=float, default=79.19, help="GPU capacity in the message")
    parser.add_argument("--free-gib", type=float, default=1.23, help="free GPU memory in the message")
    add_ready_file_arg(parser)
    args = parser.parse_args()
    load_model(oom_message(args.tried_gib, args.total_gib, args.free_gib), args.ready_file)


if __name__ == "__main__":
    main()
