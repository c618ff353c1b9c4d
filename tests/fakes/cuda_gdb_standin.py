"""A stand-in for ``cuda-gdb`` (no GPU, nor CUDA toolkit, on this machine): what the kernel reader calls,
``cuda-gdb -nx -p PID --batch -ex ... -ex detach``, acting on the real target where the real one would.

``$HW_CUDA_GDB_MODE`` says what it does:

* ``print`` (default): prints ``$HW_CUDA_GDB_OUTPUT`` (a file the real debugger printed on the GPU machine,
  tests/fixtures/cuda_gdb/) and exits 0, as a clean attach and detach does;
* ``refuse``: prints what the real one prints when ptrace is not allowed, exits 1;
* ``stop-and-hang``: stops the target with SIGSTOP (the stop a killed debugger leaves pending), then
  hangs until it is killed at its deadline.

Every call appends its argv to ``$HW_CUDA_GDB_LOG`` (one JSON list a line) when set.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    log = os.environ.get("HW_CUDA_GDB_LOG")
    if log:
        with Path(log).open("a") as fh:
            fh.write(json.dumps(argv) + "\n")
    pid = int(argv[argv.index("-p") + 1])
    mode = os.environ.get("HW_CUDA_GDB_MODE", "print")
    if mode == "refuse":
        print("No CUDA kernels.\nNo stack.\nThe program is not being run.")
        print("ptrace: Operation not permitted.", file=sys.stderr)
        return 1
    if mode == "stop-and-hang":
        os.kill(pid, signal.SIGSTOP)
        while True:
            time.sleep(60)
    sys.stdout.write(Path(os.environ["HW_CUDA_GDB_OUTPUT"]).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
