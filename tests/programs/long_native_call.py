"""Slow phases that are real work and must never be called stalled: no log line, the Python stack
unchanged or nearly, CPU busy.

``--what matmul``: one CPU matrix multiplication of ``--size`` (default 8000, about 10 s on one core
here): a single native call, the Python stack on one line throughout, the native frames in MKL's
kernels. ``--what compile``: a real ``torch.compile`` (Inductor, C++ code generation and a compiler
run in a child process) into a fresh cache, so that it really compiles. Both print ``work begin``,
then ``work done`` when finished, and then wait like a server that is up (until killed). torch (the
CPU build) is needed.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from _util import block_forever
from _util import log
from _util import require_torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--what", choices=("matmul", "compile"), required=True)
    parser.add_argument("--size", type=int, default=8000)
    args = parser.parse_args()
    require_torch()
    import torch

    torch.set_num_threads(1)
    if args.what == "matmul":
        a, b = torch.randn(args.size, args.size), torch.randn(args.size, args.size)
        log("work begin")
        (a @ b).sum()
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="hangwatch-inductor-")

        def f(x: torch.Tensor) -> torch.Tensor:
            for _ in range(6):
                x = torch.nn.functional.gelu(x @ x.T) + torch.sin(x).cumsum(0)
            return x.softmax(-1)

        log("work begin")
        torch.compile(f, backend="inductor", mode="max-autotune-no-cudagraphs")(torch.randn(64, 64))
    log("work done")
    block_forever()


if __name__ == "__main__":
    main()
