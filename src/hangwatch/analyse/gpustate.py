"""Whether the GPUs spin, idle or work, from NVML's readings (GPM pipes where the GPU has them, else
utilisation, memory utilisation and power), and which GPUs a process holds memory on."""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Sequence
from dataclasses import replace

from hangwatch.model.samples import GpuActivity
from hangwatch.model.samples import GpuReading
from hangwatch.model.samples import GpuSample

# docs/gpu-signals.md (H200): a spinning kernel reads ~100 % utilisation with 0 % memory utilisation at
# 120-142 W; real work moves memory utilisation to 23-100 % and power to 400-700 W. Without GPM
# these are the fallback: utilisation high while memory utilisation stays under MEM_UTIL_WORK.
GPU_BUSY_UTIL = 90.0
MEM_UTIL_WORK = 10.0
POWER_WORK_W = 300.0
GPU_IDLE_UTIL = 5.0
# GPM: a pipe at this share or more is work (every SM spinning lifts integer to 0.65 %, the rest to 0; an
# fp16 matmul lifts tensor to 93 %, a copy DRAM to 88 %: docs/gpu-signals.md).
PIPE_WORK = 5.0


def gpu_state(
    gpu: GpuSample | None, gpm: Sequence[GpuActivity], indices: Collection[int] | None = None
) -> str:
    """ "spinning", "idle", "working" or "unknown" for the GPUs ``indices`` (every GPU when None), from
    GPM pipes where the GPU has them, else util/power. One GPU working among them makes them working:
    a host in place then may wait for real work."""
    if indices is not None:
        gpm = [g for g in gpm if g.index in indices]
        if gpu is not None:
            gpu = replace(gpu, gpus=tuple(g for g in gpu.gpus if g.index in indices))
    busy_gpm = [g for g in gpm if g.graphics_util is not None and g.graphics_util >= GPU_BUSY_UTIL]
    if busy_gpm:
        return "spinning" if all(g.pipes_idle(PIPE_WORK) for g in busy_gpm) else "working"
    if gpm and all(g.graphics_util is not None and g.graphics_util < GPU_IDLE_UTIL for g in gpm):
        return "idle"
    if gpu is None or gpu.unavailable or not gpu.gpus:
        return "unknown"
    busy = [g for g in gpu.gpus if g.util_pct is not None and g.util_pct >= GPU_BUSY_UTIL]
    if busy:
        work = any((g.mem_util_pct or 0) >= MEM_UTIL_WORK or (g.power_w or 0) >= POWER_WORK_W for g in busy)
        return "working" if work else "spinning"
    if all(g.util_pct is not None and g.util_pct < GPU_IDLE_UTIL for g in gpu.gpus):
        return "idle"
    return "unknown"


def ambiguous(g: GpuReading) -> bool:
    """Running kernels while moving little memory: a spin, or compute whose operands sit in cache; only
    GPM's pipes tell them apart (an FMA chain in registers and a spinning flag both read 100 % / 0 % on an
    H200). Any kernel time counts, not only "busy": a host that polls between chunks leaves gaps."""
    return (g.util_pct or 0) >= GPU_IDLE_UTIL and (g.mem_util_pct or 0) < MEM_UTIL_WORK


def gpus_of(gpu: GpuSample | None, pid: int) -> frozenset[int] | None:
    """The GPUs a process holds memory on (NVML's per-process view); None where NVML shows it on none."""
    if gpu is None:
        return None
    found = frozenset(p.gpu_index for p in gpu.processes if p.pid == pid)
    return found or None
