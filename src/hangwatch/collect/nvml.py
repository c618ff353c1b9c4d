"""The NVML boundary (``nvidia-ml-py``): per-GPU utilisation, memory, power, clock, and memory per process.

No NVML library, no driver, or no GPU gives one ``unavailable: <reason>`` and the rest of
hangwatch goes on. A call that fails on one tick is recorded as that tick's ``error``: a
driver that stops answering while a GPU is wedged is evidence, not a crash. ``pynvml``'s own
exceptions never leave this module. The module object is injectable so tests can drive this
exact code with a fake that has the same functions.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any
from typing import Protocol
from typing import TypeVar

from hangwatch.model.doctor import GpuFacts
from hangwatch.model.doctor import GpuInventory
from hangwatch.model.samples import GpuProcessMemory
from hangwatch.model.samples import GpuReading
from hangwatch.model.samples import GpuSample

T = TypeVar("T")


class GpuSource(Protocol):
    def read(self) -> GpuSample: ...

    def close(self) -> None: ...


class NvmlGpuSource:
    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._handles: list[Any] = []
        self._names: list[str] = []
        self._uuids: list[str | None] = []
        self._process_util_supported = True
        self._util_seen: dict[int, int] = {}  # GPU index -> newest per-process sample timestamp read
        self._nvml: Any
        self.unavailable: str | None
        self._nvml, self.unavailable = start(nvml)
        if self.unavailable is not None:
            return
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._names = [_text(self._nvml.nvmlDeviceGetName(h)) for h in self._handles]
            self._uuids = [self._uuid(h) for h in self._handles]
        except Exception as exc:
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
            util = query(errors, nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = query(errors, nvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = query(errors, nvml.nvmlDeviceGetPowerUsage, handle)
            clock = query(errors, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
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
                    uuid=self._uuids[index] if index < len(self._uuids) else None,
                )
            )
            running = running_processes(nvml, handle, index, errors)
            sm_util = self._process_sm_util(index, handle, errors)
            processes += [
                replace(p, sm_util_pct=sm_util.get(p.pid, 0.0)) if sm_util is not None else p for p in running
            ]
        return GpuSample(
            gpus=tuple(readings),
            processes=tuple(processes),
            error="; ".join(sorted(set(errors))) or None,
        )

    def _uuid(self, handle: Any) -> str | None:
        """Read once: a GPU's UUID does not change (a driver or fake without it: none)."""
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(handle))
        except Exception:
            return None

    def _process_sm_util(self, index: int, handle: Any, errors: list[str]) -> dict[int, float] | None:
        """pid -> the highest SM share of its samples since the last reading; None where unsupported.

        NVML keeps a short ring of per-process samples and returns those newer than the timestamp we
        pass; "Not Found" means no process ran a kernel since then (every process read 0).
        """
        if not self._process_util_supported:
            return None
        call = getattr(self._nvml, "nvmlDeviceGetProcessUtilization", None)
        if call is None:
            self._process_util_supported = False
            return None
        try:
            samples = call(handle, self._util_seen.get(index, 0))
        except Exception as exc:
            reason = _nvml_reason(exc)
            if "Not Found" in reason:
                return {}
            if "Not Supported" in reason or "No Permission" in reason:
                self._process_util_supported = False
                return None
            errors.append(reason)
            return None
        found: dict[int, float] = {}
        for sample in samples:
            pid = int(sample.pid)
            found[pid] = max(found.get(pid, 0.0), float(sample.smUtil))
            self._util_seen[index] = max(self._util_seen.get(index, 0), int(sample.timeStamp))
        return found

    def close(self) -> None:
        if self._nvml is not None and self.unavailable is None:
            with contextlib.suppress(Exception):  # shutting down; nothing to report
                self._nvml.nvmlShutdown()


def start(nvml: ModuleType | Any | None = None) -> tuple[Any, str | None]:
    """The NVML module imported (``nvml``: a fake with its functions) and initialised; or None, and why."""
    try:
        lib = nvml if nvml is not None else importlib.import_module("pynvml")
    except ImportError as exc:
        return None, f"the NVML bindings are not installed ({exc}); pip install nvidia-ml-py"
    try:
        lib.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses made at run time
        if _no_driver(exc):
            # The common case on a CPU machine, said on every run: short.
            return None, "no NVIDIA driver (NVML's library not found)"
        return None, f"NVML could not start: {_nvml_reason(exc)}"
    return lib, None


def query(errors: list[str], call: Callable[..., T], *args: Any) -> T | None:
    """``call(*args)``, or None when NVML refuses: the reason goes to ``errors``, except "Not Supported"
    (a field the GPU lacks is simply absent). No NVMLError leaves this module."""
    try:
        return call(*args)
    except Exception as exc:  # any NVMLError: recorded, never raised
        reason = _nvml_reason(exc)
        if "Not Supported" not in reason:
            errors.append(reason)
        return None


def running_processes(lib: Any, handle: Any, index: int, errors: list[str]) -> list[GpuProcessMemory]:
    """The compute processes on one GPU and the memory each holds (None where NVML does not say)."""
    out = []
    for proc in query(errors, lib.nvmlDeviceGetComputeRunningProcesses, handle) or []:
        used = getattr(proc, "usedGpuMemory", None)
        out.append(GpuProcessMemory(int(proc.pid), index, int(used) if used is not None else None))
    return out


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _no_driver(exc: BaseException) -> bool:
    return "LibraryNotFound" in type(exc).__name__ or "shared library not found" in str(exc).lower()


def _nvml_reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if "Driver Not Loaded" in text or "LibraryNotFound" in type(exc).__name__ or "not found" in text.lower():
        return f"{text} (no NVIDIA driver on this machine?)"
    return text


# NVML's topology levels (nvmlGpuTopologyLevel_t) in nvidia-smi topo's words; PHB and beyond
# cross a PCIe host bridge or the CPU interconnect (where peer-to-peer hangs live: docs/gpu-signals.md).
_TOPOLOGY = {0: "SELF", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def read_inventory(nvml: ModuleType | Any | None = None, max_link_gpus: int = 8) -> GpuInventory:
    """The machine's GPUs once, for doctor: capability, memory, driver and CUDA versions, processes, links.

    Same error rules as :class:`NvmlGpuSource`: no library or driver gives ``unavailable``; a
    query that fails is an entry of ``errors`` and an absent field.
    """
    lib, unavailable = start(nvml)
    if unavailable is not None:
        return GpuInventory(unavailable=unavailable)
    errors: list[str] = []

    try:
        driver_raw = query(errors, lib.nvmlSystemGetDriverVersion)
        driver = _text(driver_raw) if driver_raw is not None else None
        cuda = query(errors, lib.nvmlSystemGetCudaDriverVersion_v2)
        count = int(query(errors, lib.nvmlDeviceGetCount) or 0)
        gpus: list[GpuFacts] = []
        processes: list[GpuProcessMemory] = []
        handles = []
        for index in range(count):
            handle = query(errors, lib.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                continue
            handles.append((index, handle))
            cap = query(errors, lib.nvmlDeviceGetCudaComputeCapability, handle)
            memory = query(errors, lib.nvmlDeviceGetMemoryInfo, handle)
            util = query(errors, lib.nvmlDeviceGetUtilizationRates, handle)
            name = query(errors, lib.nvmlDeviceGetName, handle)
            uuid = query(errors, lib.nvmlDeviceGetUUID, handle)
            gpus.append(
                GpuFacts(
                    index=index,
                    name=_text(name) if name is not None else "?",
                    capability=(int(cap[0]), int(cap[1])) if cap else None,
                    mem_used_bytes=int(memory.used) if memory is not None else None,
                    mem_total_bytes=int(memory.total) if memory is not None else None,
                    util_pct=float(util.gpu) if util is not None else None,
                    uuid=_text(uuid) if uuid is not None else None,
                    nvlinks=_active_nvlinks(lib, handle),
                )
            )
            processes += running_processes(lib, handle, index, errors)
        links = []
        for a, (ia, ha) in enumerate(handles[:max_link_gpus]):
            for ib, hb in handles[a + 1 : max_link_gpus]:
                level = query(errors, lib.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
                if level is not None:
                    links.append((ia, ib, _TOPOLOGY.get(int(level), str(level))))
    finally:
        with contextlib.suppress(Exception):  # shutting down; nothing to report
            lib.nvmlShutdown()
    return GpuInventory(
        driver_version=driver,
        cuda_driver_version=divmod(int(cuda) // 10, 100) if cuda else None,
        gpus=tuple(gpus),
        processes=tuple(processes),
        links=tuple(links),
        errors=tuple(sorted(set(errors))),
        unavailable=None if gpus else "NVML sees no GPU on this machine",
    )


def _active_nvlinks(lib: Any, handle: Any, max_links: int = 18) -> int:
    """Active NVLinks of a GPU; 0 for PCIe-only cards (NVML answers Not Supported or an invalid link)."""
    active = 0
    for link in range(max_links):
        try:
            active += int(lib.nvmlDeviceGetNvLinkState(handle, link) == 1)
        except Exception:  # the first link the GPU lacks ends the count
            break
    return active
