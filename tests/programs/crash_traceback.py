"""A server that crashes during startup with a real, uncaught Python traceback (exit status 1).

Prints a few phase lines, then raises ``RuntimeError`` from inside ``load_weights`` (message settable
with ``--message``); Python prints the traceback on stderr and exits 1.

With ``--in-child`` the crash happens in a ``spawn`` child process instead (multiprocessing prints
``Process SpawnProcess-1:`` and the traceback on stderr, the child exits 1), while the parent keeps
waiting forever on a ``Queue.get()`` for a message the child never sends: the process tree stays up
with a dead child, which is what a naive launcher does. ``--ready-file`` is written by the parent once
the child has exited (the parent is then blocked), or just before the raise without ``--in-child``.

Example::

    python tests/programs/crash_traceback.py --in-child
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from multiprocessing.queues import Queue

from _util import add_ready_file_arg
from _util import log
from _util import write_ready

DEFAULT_MESSAGE = (
    "Error(s) in loading state_dict for LlamaForCausalLM: size mismatch for lm_head.weight: "
    "copying a param with shape torch.Size([128256, 4096]) from checkpoint, "
    "the shape in current model is torch.Size([32000, 4096])."
)


def load_weights(message: str) -> None:
    """Fail the way a bad checkpoint does."""
    raise RuntimeError(message)


def start_engine(message: str, ready_file: str | None) -> None:
    """Print the phases, then crash in the weight loader."""
    log("Init engine begin.")
    log("Loading weights")
    time.sleep(0.2)
    write_ready(ready_file)
    load_weights(message)


def child_main(message: str, results: Queue[str]) -> None:
    """The child: crash before ever putting ``ready`` on the queue."""
    start_engine(message, None)
    results.put("ready")


def main() -> None:
    """Crash here, or in a child while this process waits forever."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--message", default=DEFAULT_MESSAGE, help="text of the RuntimeError")
    parser.add_argument(
        "--in-child",
        action="store_true",
        help="crash in a child process while the parent waits forever on a queue",
    )
    add_ready_file_arg(parser)
    args = parser.parse_args()

    if not args.in_child:
        start_engine(args.message, args.ready_file)
        return
    ctx = mp.get_context("spawn")
    results: Queue[str] = ctx.Queue()
    child = ctx.Process(target=child_main, args=(args.message, results), name="engine-core")
    child.start()
    log(f"waiting for engine core (pid {child.pid})")
    # The readiness handshake for tests: once the child is dead, the parent is about to block forever.
    # join() also reaps the child, so it is gone rather than a zombie.
    child.join()
    write_ready(args.ready_file)
    results.get()  # never returns: nobody will ever put anything


if __name__ == "__main__":
    main()
