"""The NVML boundary (``nvidia-ml-py``): per-GPU utilisation, memory, power, clock, and memory per process.

No NVML library, no driver, or no GPU gives one ``unavailable: <reason>`` and the rest of
hangwatch goes on. A call that fails on one tick is recorded as that tick's ``error``: a
driver that stops answering while a GPU is wedged is evidence, not a crash. ``pynvml``'s own
exceptions never leave this module. The module object is injectable so tests can drive this
exact code with a fake that has the same functions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any
from typing import Protocol
from typing import TypeVar

from hangwatch.model.samples import GpuProcessMemory
from hangwatch.model.samples import GpuReading
from hangwatch.model.samples import GpuSample

T = TypeVar("T")


class GpuSource(Protocol):
    def read(self) -> GpuSample: ...

    def close(self) -> None: ...


class NvmlGpuSource:
    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._names: list[str] = []
        self.unavailable: str | None = None
        try:
            self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        except ImportError as exc:
            self.unavailable = f"the NVML bindings are not installed ({exc}); pip install nvidia-ml-py"
            return
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - pynvml raises NVMLError subclasses made at run time
            self.unavailable = f"NVML could not start: {_nvml_reason(exc)}"
            return
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._names = [_text(self._nvml.nvmlDeviceGetName(h)) for h in self._handles]
        except Exception as exc:  # noqa: BLE001
            self.unavailable = f"NVML could not list GPUs: {_nvml_reason(exc)}"
            return
        if not self._handles:
            self.unavailable = "NVML sees no GPU on this machine"

    def read(self) -> GpuSample:
        if self.unavailable is not None:
            return GpuSample(unavailable=self.unavailable)
        nvml = self._nvml
        readings: list[GpuReading] = []
        processes: list[GpuProcessMemory] = []
        errors: list[str] = []
        for index, handle in enumerate(self._handles):
            util = self._query(lambda h=handle: nvml.nvmlDeviceGetUtilizationRates(h), errors)
            memory = self._query(lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h), errors)
            power_mw = self._query(lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h), errors)
            clock = self._query(lambda h=handle: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM), errors)
            readings.append(
                GpuReading(
                    index=index,
                    name=self._names[index],
                    util_pct=float(util.gpu) if util is not None else None,
                    mem_util_pct=float(util.memory) if util is not None else None,
                    mem_used_bytes=int(memory.used) if memory is not None else None,
                    mem_total_bytes=int(memory.total) if memory is not None else None,
                    power_w=power_mw / 1000.0 if power_mw is not None else None,
                    sm_clock_mhz=int(clock) if clock is not None else None,
                )
            )
            running = self._query(lambda h=handle: nvml.nvmlDeviceGetComputeRunningProcesses(h), errors) or []
            for proc in running:
                used = getattr(proc, "usedGpuMemory", None)
                processes.append(GpuProcessMemory(int(proc.pid), index, int(used) if used is not None else None))
        return GpuSample(
            gpus=tuple(readings),
            processes=tuple(processes),
            error="; ".join(sorted(set(errors))) or None,
        )

    def _query(self, call: Callable[[], T], errors: list[str]) -> T | None:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001
            reason = _nvml_reason(exc)
            if "Not Supported" not in reason:  # unsupported fields are simply absent (None)
                errors.append(reason)
            return None

    def close(self) -> None:
        if self._nvml is not None and self.unavailable is None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001, S110 - shutting down; nothing to report
                pass


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _nvml_reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if "Driver Not Loaded" in text or "LibraryNotFound" in type(exc).__name__ or "not found" in text.lower():
        return f"{text} (no NVIDIA driver on this machine?)"
    return text
