"""GPU waits and slow GPU phases for validating hangwatch on a real GPU (run by validate_gpu_waits.py).

    python gpu_waits.py ipc --host-wait sync|poll|sleep [--absent wait|spin] [--arrive --seconds S]
        A custom-all-reduce-like barrier across two processes that share one flag buffer through CUDA
        IPC (CuPy only, no torch). Each rank's kernel sets its own flag, then spins on the GPU until
        every flag is set. Without --arrive, rank 1 never launches its kernel: it parks in a Python
        wait (``--absent wait``) or spins on the CPU (``--absent spin``), and rank 0's host waits for
        its spinning kernel in CuPy's cudaDeviceSynchronize (``sync``), in a Python loop polling a CuPy
        event (``poll``: 100 % of a core on frames no rule names), or in a loop that polls and sleeps
        (``sleep``). With --arrive both ranks run barriers and GEMMs for S seconds, silently, then
        print DONE (the healthy shape of the same code).
    python gpu_waits.py gpu-work --host-wait poll|launch --seconds S
        Tensor-core GEMMs for S seconds, silently: on a side stream with the host polling each chunk's
        completion event between 5 ms sleeps (``poll``), or launched back to back with the host blocked
        in the launch once the queue is full (``launch``); then DONE. GPU work that must never be stalled.
    python gpu_waits.py cache-work --kind fma|small-gemm --seconds S
        Compute that moves almost no memory, for S seconds, silently, the host polling each chunk's
        completion event between 5 ms sleeps: a CuPy kernel whose every thread runs a long FMA chain in
        registers (``fma``), or a CUDA graph of 2,000 small bf16 GEMMs whose operands fit in L2
        (``small-gemm``); then DONE. NVML reads ~100 % utilisation and under 10 % memory utilisation,
        as for a spin: only GPM's pipes tell it is work.
    python gpu_waits.py compile --seconds S
        torch.compile(mode="max-autotune") of a small MLP into a fresh Inductor cache (Triton autotuning,
        compile workers in child processes), its output sent to /dev/null, then DONE.
    python gpu_waits.py capture --seconds S
        CUDA graph capture of a Llama-shaped decoder (our own, random weights) for the decode batch sizes
        an engine captures, silently, repeated for S seconds, then DONE.

Every mode prints one line when it starts its interesting part and writes --ready-file then. The ranks
carry RANK and WORLD_SIZE, as torchrun's do, so hangwatch sees them as peers; with --unranked they carry
none (a producer and a consumer sharing GPU memory), and only the GPU says who waits for whom.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BARRIER_KERNEL = r"""
extern "C" __global__ void flag_barrier(volatile int *flags, int rank, int world, int epoch) {
    // One thread: announce this rank, then wait on the GPU for every peer, as a custom all-reduce's
    // start barrier does (it spins on flags only its peers can set).
    flags[rank] = epoch;
    __threadfence_system();
    for (int r = 0; r < world; ++r) {
        while (flags[r] < epoch) { }
    }
}
"""
WORLD = 2


def launch_ipc(args: argparse.Namespace) -> None:
    """The launcher: two rank processes (torchrun-like), then wait for them."""
    workdir = Path(tempfile.mkdtemp(prefix="gpu-ipc-"))
    children = []
    for rank in range(WORLD):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD)}
        if args.unranked:
            # A producer and a consumer, not a group: nothing in their environment says they are peers.
            env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        argv = [sys.executable, __file__, "ipc-rank", "--dir", str(workdir), "--host-wait", args.host_wait]
        argv += ["--rank", str(rank)]
        argv += ["--absent", args.absent, "--seconds", str(args.seconds)]
        argv += ["--arrive"] if args.arrive else []
        argv += ["--log"] if args.log else []
        argv += ["--ready-file", args.ready_file] if args.ready_file and rank == 0 else []
        children.append(subprocess.Popen(argv, env=env))
    for child in children:
        child.wait()
    print("DONE", flush=True)
    while True:
        time.sleep(3600)


def ipc_rank(args: argparse.Namespace) -> None:
    import cupy as cp

    rank = args.rank
    handle_file = Path(args.dir) / "flags.handle"
    if rank == 0:
        flags = cp.zeros(WORLD + 1, dtype=cp.int32)  # + the healthy shape's last epoch
        cp.cuda.runtime.deviceSynchronize()
        handle = cp.cuda.runtime.ipcGetMemHandle(flags.data.ptr)
        tmp = handle_file.with_suffix(".tmp")
        tmp.write_bytes(bytes(handle))
        tmp.rename(handle_file)
    else:
        while not handle_file.exists():
            time.sleep(0.05)
        ptr = cp.cuda.runtime.ipcOpenMemHandle(handle_file.read_bytes())
        memory = cp.cuda.UnownedMemory(ptr, (WORLD + 1) * 4, owner=None)
        flags = cp.ndarray((WORLD + 1,), dtype=cp.int32, memptr=cp.cuda.MemoryPointer(memory, 0))
    barrier = cp.RawKernel(BARRIER_KERNEL, "flag_barrier")
    a = cp.random.rand(4096, 4096, dtype=cp.float32)
    b = cp.random.rand(4096, 4096, dtype=cp.float32)
    print(f"rank {rank}: flags shared through CUDA IPC", flush=True)
    if args.arrive:
        arrive_until(flags, barrier, rank, args.seconds, a, b, log=args.log)
        return
    if args.ready_file:
        Path(args.ready_file).write_text("ready\n")
    if rank != 0:
        never_arrive(args.absent)
    if args.log:
        threading.Thread(target=watchdog, args=(rank,), daemon=True).start()
    barrier((1,), (1,), (flags, cp.int32(rank), cp.int32(WORLD), cp.int32(1)))
    host_wait(args.host_wait)


def watchdog(rank: int) -> None:
    """A wait that logs: the same words every 2 s, only its counts new (an NCCL watchdog's or a retry
    loop's), while the main thread waits for the GPU."""
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        waited = time.monotonic() - started
        print(f"rank {rank}: still waiting for the barrier (attempt {attempt}, {waited:.0f} s)", flush=True)
        time.sleep(2)


def arrive_until(
    flags: Any, barrier: Any, rank: int, seconds: float, a: Any, b: Any, *, log: bool = False
) -> None:
    """The healthy shape: GEMMs and a barrier per epoch until rank 0's deadline; with ``log``, a
    training loop's "step N" line about once a second (its host in cudaDeviceSynchronize between).

    The ranks must agree on the last epoch, or one waits for a peer that has left: rank 0 writes it
    into the shared buffer's last slot before it enters the epoch before it, so a peer that has passed
    that epoch's barrier reads it in time.
    """
    import cupy as cp

    deadline = time.monotonic() + seconds
    epoch, stop = 0, 0
    said = time.monotonic()
    while not stop or epoch < stop:
        epoch += 1
        if log and time.monotonic() - said >= 1.0:
            said = time.monotonic()
            print(f"rank {rank}: step {epoch}", flush=True)
        for _ in range(8):
            a = cp.tanh(a @ b)
        barrier((1,), (1,), (flags, cp.int32(rank), cp.int32(WORLD), cp.int32(epoch)))
        cp.cuda.runtime.deviceSynchronize()
        if rank == 0 and not stop and time.monotonic() >= deadline:
            stop = epoch + 1
            flags[WORLD] = stop
        elif rank != 0:
            stop = int(flags[WORLD].get())


def never_arrive(how: str) -> None:
    """The rank that never reaches the collective: parked in a Python wait, or busy on the CPU."""
    if how == "wait":
        threading.Event().wait()
    spins = 0
    while True:
        spins += 1


def host_wait(how: str) -> None:
    """Rank 0's host waits for its kernel, which waits for rank 1: it never returns."""
    import cupy as cp

    if how == "sync":
        cp.cuda.runtime.deviceSynchronize()  # CuPy's runtime wrapper, not torch
        return
    done = cp.cuda.Event(disable_timing=True)
    done.record()
    if how == "poll":
        while not done.done:  # a host poll no rule names: 100 % of a core in one place
            pass
    else:
        while not done.done:
            time.sleep(0.002)


def gpu_work(host: str, seconds: float, ready_file: str | None) -> None:
    """Tensor-core GEMMs for ``seconds``, silently, the host never in a synchronize until the end.

    ``poll``: the GEMMs run on a side stream in chunks, and the host polls each chunk's completion
    event in a Python loop with 5 ms sleeps (a few percent of a core, frames no rule names).
    ``launch``: the host launches GEMMs back to back on the default stream with no synchronize, so it
    spends its time blocked in the launch call once the GPU's queue is full.
    """
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    torch.cuda.synchronize()
    print(f"gpu work begins ({host})", flush=True)
    if ready_file:
        Path(ready_file).write_text("ready\n")
    end = time.monotonic() + seconds
    side = torch.cuda.Stream()
    while time.monotonic() < end:
        if host == "poll":
            with torch.cuda.stream(side):
                for _ in range(200):
                    torch.matmul(a, b, out=c)
                done = torch.cuda.Event()
                done.record(side)
            while not done.query():
                time.sleep(0.005)
        else:
            for _ in range(200):
                torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    print("DONE", flush=True)


FMA_KERNEL = r"""
extern "C" __global__ void fma_chain(float *out, long long steps) {
    // A long dependent FMA chain per thread, in registers: FP32 pipes busy, no memory traffic but the
    // one store at the end (compiler cannot fold it: each step depends on the last).
    float a = threadIdx.x * 1e-3f, b = 1.000001f, c = 1e-7f;
    for (long long i = 0; i < steps; ++i) { a = fmaf(a, b, c); }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a;
}
"""


def cache_work(kind: str, seconds: float, ready_file: str | None) -> None:
    """Compute in registers or L2 for ``seconds``, the host polling each chunk's event between sleeps."""
    if kind == "fma":
        import cupy as cp

        kernel = cp.RawKernel(FMA_KERNEL, "fma_chain")
        out = cp.zeros(132 * 8 * 1024, dtype=cp.float32)

        def chunk() -> Any:
            kernel((132 * 8,), (1024,), (out, cp.int64(4_000_000)))
            done = cp.cuda.Event()
            done.record()
            return done

        def finished(done: Any) -> bool:
            return bool(done.done)
    else:
        import torch

        a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up before capture, as torch's graph docs ask
                torch.matmul(a, b, out=c)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(2000):
                torch.matmul(a, b, out=c)

        def chunk() -> Any:
            for _ in range(20):
                graph.replay()
            done = torch.cuda.Event()
            done.record()
            return done

        def finished(done: Any) -> bool:
            return bool(done.query())

    print(f"cache work begins ({kind})", flush=True)
    if ready_file:
        Path(ready_file).write_text("ready\n")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        done = chunk()
        while not finished(done):
            time.sleep(0.005)
    print("DONE", flush=True)


def compile_autotune(seconds: float, ready_file: str | None) -> None:
    """max-autotune into a fresh cache: minutes of Triton benchmarking with every line silenced."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-")
    import torch

    keep = os.dup(1)
    say = os.fdopen(keep, "w", buffering=1)
    say.write("compile: starting max-autotune, silently\n")
    if ready_file:
        Path(ready_file).write_text("ready\n")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)  # the autotune tables go to stderr: nothing of the compile shows in the log

    deadline = time.monotonic() + seconds
    width = 1024
    while True:
        model = (
            torch.nn.Sequential(
                torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
            )
            .cuda()
            .half()
        )
        compiled = torch.compile(model, mode="max-autotune", dynamic=False)
        for batch in (16, 48, 80):
            x = torch.randn(batch, width, device="cuda", dtype=torch.half)
            compiled(x)
        torch.cuda.synchronize()
        if time.monotonic() >= deadline:
            break
        width += 256  # new shapes: another round of autotuning, not a cache hit
    say.write("DONE\n")


class Decoder:
    """A Llama-shaped decoder step (RMSNorm, attention over a static KV cache, SwiGLU MLP)."""

    def __init__(self, layers: int, hidden: int, heads: int, context: int, max_batch: int) -> None:
        import torch

        self.torch = torch
        self.heads, self.head_dim = heads, hidden // heads
        opts = {"device": "cuda", "dtype": torch.half}

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, **opts) * shape[-1] ** -0.5

        self.layers = [
            {
                "qkv": w(3 * hidden, hidden),
                "o": w(hidden, hidden),
                "up": w(2 * 4 * hidden, hidden),
                "down": w(hidden, 4 * hidden),
                "k": torch.randn(max_batch, heads, context, hidden // heads, **opts),
                "v": torch.randn(max_batch, heads, context, hidden // heads, **opts),
            }
            for _ in range(layers)
        ]

    def step(self, x: Any) -> Any:  # torch is imported lazily: the ipc ranks run without it
        torch = self.torch
        f = torch.nn.functional
        batch = x.shape[0]
        for layer in self.layers:
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            q, _, _ = (h @ layer["qkv"].t()).view(batch, 3, self.heads, self.head_dim).unbind(1)
            att = f.scaled_dot_product_attention(
                q.unsqueeze(2), layer["k"][:batch], layer["v"][:batch]
            ).reshape(batch, -1)
            x = x + att @ layer["o"].t()
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            gate, up = (h @ layer["up"].t()).chunk(2, dim=-1)
            x = x + (f.silu(gate) * up) @ layer["down"].t()
        return x


def capture_decoder(seconds: float, ready_file: str | None) -> None:
    import torch

    sizes = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)
    model = Decoder(layers=16, hidden=4096, heads=32, context=1024, max_batch=max(sizes))
    print("capture: CUDA graphs of a 16-layer decoder, silently", flush=True)
    if ready_file:
        Path(ready_file).write_text("ready\n")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pool = torch.cuda.graph_pool_handle()
        graphs = []
        for bs in reversed(sizes):  # largest first, as vLLM and SGLang capture
            static = torch.randn(bs, 4096, device="cuda", dtype=torch.half)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    model.step(static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                model.step(static)
            graph.replay()
            torch.cuda.synchronize()
            graphs.append(graph)
            if time.monotonic() >= deadline:
                break
        del graphs
    print("DONE", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["ipc", "ipc-rank", "compile", "capture", "gpu-work", "cache-work"])
    parser.add_argument(
        "--kind", choices=["fma", "small-gemm"], default="fma", help="(cache-work) what computes"
    )
    parser.add_argument("--host-wait", choices=["sync", "poll", "sleep", "launch"], default="sync")
    parser.add_argument("--absent", choices=["wait", "spin"], default="wait")
    parser.add_argument("--arrive", action="store_true", help="both ranks arrive: the healthy shape")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--dir", help="(ipc-rank) where rank 0 leaves its IPC handle")
    parser.add_argument("--rank", type=int, default=0, help="(ipc-rank) which side of the barrier it is")
    parser.add_argument(
        "--unranked", action="store_true", help="(ipc) the two processes carry no RANK/WORLD_SIZE: not peers"
    )
    parser.add_argument("--ready-file")
    parser.add_argument(
        "--log",
        action="store_true",
        help="ranks log: 'step N' about once a second when healthy, rank 0 'still waiting' every 2 s if hung",
    )
    args = parser.parse_args()
    if args.mode == "ipc":
        launch_ipc(args)
    elif args.mode == "ipc-rank":
        ipc_rank(args)
    elif args.mode == "compile":
        compile_autotune(args.seconds, args.ready_file)
    elif args.mode == "gpu-work":
        gpu_work("launch" if args.host_wait == "launch" else "poll", args.seconds, args.ready_file)
    elif args.mode == "cache-work":
        cache_work(args.kind, args.seconds, args.ready_file)
    else:
        capture_decoder(args.seconds, args.ready_file)
    if args.mode in ("compile", "capture", "gpu-work", "cache-work"):
        while True:  # stay up after DONE, as a server would; hangwatch ends the tree
            time.sleep(3600)


if __name__ == "__main__":
    main()
