"""A small CUDA program for validating hangwatch's NVML path on a real GPU (run by validate_nvml.py).

python gpu_program.py alloc-then-ready   # 4 x 1 GiB with a line each, then "ALLOCATED", then idles
python gpu_program.py alloc-then-hang    # 2 GiB, one line, then silent forever (GPU idle)
python gpu_program.py silent-growth      # 1 GiB every 2 s for 20 s, no output, low CPU, then "GREW"
python gpu_program.py serve STUB-ARGS...  # 4 GiB, then the OpenAI stub (tests/programs/stub_openai.py) in
                                          # the same process: a "server" that holds GPU memory
"""

from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

import torch


def main(mode: str) -> None:
    held = []
    if mode == "alloc-then-ready":
        for i in range(4):
            held.append(torch.empty(2**30, dtype=torch.uint8, device="cuda"))
            torch.cuda.synchronize()
            print(f"allocated {i + 1} GiB", flush=True)
            time.sleep(1)
        print("ALLOCATED", flush=True)
    elif mode == "alloc-then-hang":
        held.append(torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        print("allocated 2 GiB; now waiting forever", flush=True)
    elif mode == "serve":
        held.append(torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        print("allocated 4 GiB; serving", flush=True)
        stub = Path(__file__).resolve().parents[2] / "tests" / "programs" / "stub_openai.py"
        sys.path.insert(0, str(stub.parent))  # its helper module _util
        sys.argv = [str(stub), *sys.argv[2:]]
        runpy.run_path(str(stub), run_name="__main__")
    elif mode == "silent-growth":
        print("growing silently", flush=True)
        for _ in range(10):
            time.sleep(2)
            held.append(torch.empty(2**30, dtype=torch.uint8, device="cuda"))
            torch.cuda.synchronize()
        print("GREW", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1])
