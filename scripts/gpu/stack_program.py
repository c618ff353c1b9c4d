"""GPU hang shapes for validating hangwatch's stacks on a real GPU (run by validate_stacks.py).

    python stack_program.py spin           # a kernel spins on a flag never set; host in cuda.synchronize
    python stack_program.py stream-wait    # a stream waits (cuStreamWaitValue32) for a value never written:
                                           # GPU idle, host in Stream.synchronize
    python stack_program.py graph-capture  # captures CUDA graphs of growing batch sizes for --seconds,
                                           # silently, then prints DONE (a real capture that progresses)
    python stack_program.py matmul         # fp16 matmuls for --seconds, silently, host in synchronize; DONE

Every mode prints one line when it reaches its interesting state and writes --ready-file then. Needs torch
with CUDA; ``spin`` also needs CuPy (for a raw kernel).
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import torch

SPIN_KERNEL = r"""
extern "C" __global__ void spin_on_flag(volatile int *flag) {
    while (*flag == 0) { }
}
"""


def spin_until_flag() -> None:
    """One block spins on a device flag nobody sets (docs/gpu-signals.md: 100 % util at ~120 W)."""
    import cupy as cp

    flag = cp.zeros(1, dtype=cp.int32)
    kernel = cp.RawKernel(SPIN_KERNEL, "spin_on_flag")
    kernel((1,), (1,), (flag,))
    torch.cuda.synchronize()  # never returns: the host spins in cudaDeviceSynchronize


def wait_on_value() -> None:
    """The stream waits for a 32-bit value that is never written: no kernel runs, the GPU idles."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    wait = getattr(libcuda, "cuStreamWaitValue32_v2", None) or libcuda.cuStreamWaitValue32
    wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    rc = wait(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(word.data_ptr()), 1, 0)  # GEQ 1
    if rc != 0:
        raise RuntimeError(f"cuStreamWaitValue32 failed with CUresult {rc}")
    stream.synchronize()  # never returns


def capture_graphs(seconds: float) -> None:
    """Real CUDA graph capture of a small MLP for growing batch sizes, with no output while it runs."""
    model = (
        torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096))
        .cuda()
        .half()
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # one round: every batch size, one pool, as the engines capture
        capture_round(model, deadline)


def capture_round(model: torch.nn.Module, deadline: float) -> None:
    graphs: list[tuple[torch.cuda.CUDAGraph, torch.Tensor]] = []
    pool = torch.cuda.graph_pool_handle()
    for bs in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512):
        if time.monotonic() >= deadline:
            return
        static = torch.randn(bs, 4096, device="cuda", dtype=torch.half)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm up on a side stream, as the engines do before capture
                model(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            model(static)
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        graphs.append((graph, static))


def matmul_loop(seconds: float) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.half)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.half)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(20):
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["spin", "stream-wait", "graph-capture", "matmul"])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--ready-file")
    args = parser.parse_args()
    torch.zeros(1, device="cuda")  # create the context before saying anything
    print(f"{args.mode}: starting", flush=True)
    if args.ready_file:
        Path(args.ready_file).write_text("ready\n")
    if args.mode == "spin":
        spin_until_flag()
    elif args.mode == "stream-wait":
        wait_on_value()
    elif args.mode == "graph-capture":
        capture_graphs(args.seconds)
    else:
        matmul_loop(args.seconds)
    print("DONE", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
