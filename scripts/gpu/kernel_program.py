"""GPU kernels that never end, from three libraries, and a healthy long GEMM: the cases of issue 25's kernel
naming (run by validate_kernels.py and probe_cuda_gdb.py on the GPU machine).

python kernel_program.py torch-spin    # torch's own spin_kernel (torch.cuda._sleep), host in a synchronize
python kernel_program.py cupy-spin     # a CuPy RawKernel spinning on a flag no one sets
python kernel_program.py triton-spin   # a Triton kernel spinning on a flag no one sets
python kernel_program.py gemm SECONDS  # bf16 8192^3 GEMMs back to back for SECONDS, then "GEMM DONE"

Each prints "LAUNCHED" once its kernel is queued. ``--heartbeat FILE`` starts a host thread that writes
the time every 10 ms: the longest gap while a debugger was attached is how long the process was paused.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path


def heartbeat(path: str) -> None:
    with Path(path).open("a", buffering=1) as fh:
        while True:
            fh.write(f"{time.time():.4f}\n")
            time.sleep(0.01)


def torch_spin() -> None:
    import torch

    torch.empty(1, device="cuda")
    torch.cuda._sleep(10**13)  # spin_kernel(long): an hour and more of cycles
    print("LAUNCHED", flush=True)
    torch.cuda.synchronize()


_CUPY_SRC = r"""
extern "C" __global__ void wait_for_flag(volatile int* flag) {
    while (*flag == 0) { }
}
"""


def cupy_spin() -> None:
    import cupy as cp

    flag = cp.zeros(1, dtype=cp.int32)
    kernel = cp.RawKernel(_CUPY_SRC, "wait_for_flag")
    kernel((1,), (1,), (flag,))
    print("LAUNCHED", flush=True)
    cp.cuda.Device().synchronize()


def triton_spin() -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def wait_for_flag_kernel(flag_ptr):
        v = tl.atomic_add(flag_ptr, 0)
        while v == 0:
            v = tl.atomic_add(flag_ptr, 0)

    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    wait_for_flag_kernel[(1,)](flag)
    print("LAUNCHED", flush=True)
    torch.cuda.synchronize()


def gemm(seconds: float) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    print("LAUNCHED", flush=True)
    while time.monotonic() < end:
        for _ in range(20):
            a = (a @ b) * 1e-4
        torch.cuda.synchronize()
    print("GEMM DONE", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=("torch-spin", "cupy-spin", "triton-spin", "gemm"))
    parser.add_argument("seconds", nargs="?", type=float, default=60.0)
    parser.add_argument("--heartbeat")
    args = parser.parse_args()
    if args.heartbeat:
        threading.Thread(target=heartbeat, args=(args.heartbeat,), daemon=True).start()
    {
        "torch-spin": torch_spin,
        "cupy-spin": cupy_spin,
        "triton-spin": triton_spin,
        "gemm": lambda: gemm(args.seconds),
    }[args.case]()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
