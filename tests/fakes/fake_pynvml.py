"""A stand-in for the ``pynvml`` module with the functions hangwatch calls, for machines without a GPU.

It has the same names and shapes as nvidia-ml-py (structs with ``.gpu``/``.memory``, ``.used``/``.total``,
processes with ``.pid``/``.usedGpuMemory``; errors raised as ``NVMLError`` with NVML's messages), so the
real ``NvmlGpuSource`` runs unchanged against it. The real path is validated on the GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from types import SimpleNamespace

NVML_CLOCK_SM = 1


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's spelling
    def __str__(self) -> str:
        return "Not Supported"


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_NotFound(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "Not Found"


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    util: int = 3
    mem_util: int = 0
    used: int = 76 * 2**30
    total: int = 141 * 2**30
    power_mw: int = 120_000
    sm_clock: int = 1980
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    power_supported: bool = True
    fail_util: str | None = None
    # (pid, timestamp in microseconds, SM %) samples; None: the GPU does not support per-process samples
    process_util: list[tuple[int, int, int]] | None = None


class FakeNvml:
    """Construct with GPUs, then pass the instance where the pynvml module would go."""

    NVML_CLOCK_SM = NVML_CLOCK_SM

    def __init__(self, gpus: list[FakeGpu], init_error: NVMLError | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.shutdown_called = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return h.name.encode()

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        if h.fail_util:
            raise NVMLError(h.fail_util)
        return SimpleNamespace(gpu=h.util, memory=h.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(used=h.used, total=h.total, free=h.total - h.used)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        if not h.power_supported:
            raise NVMLError_NotSupported()
        return h.power_mw

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        return h.sm_clock

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.processes]

    def nvmlDeviceGetProcessUtilization(self, h: FakeGpu, last_seen: int) -> list[SimpleNamespace]:
        """NVML's per-process samples newer than ``last_seen`` (microseconds); "Not Found" when none."""
        if h.process_util is None:
            raise NVMLError_NotSupported()
        samples = [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for pid, ts, sm in h.process_util
            if ts > last_seen
        ]
        if not samples:
            raise NVMLError_NotFound()
        return samples
