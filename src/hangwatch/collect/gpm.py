"""The NVML GPM boundary (Hopper and newer): what the GPU's pipes did between two stack captures.

NVML utilisation counts a kernel spinning on a flag as 100 % busy. GPM tells it apart: graphics
utilisation 100 % with tensor, DRAM and arithmetic pipes near 0 is a spin; real work lifts at least
one of them (docs/gpu-signals.md). A GPM sample is taken at each stack capture and the metrics are
computed against the previous one, so the interval is the few seconds between captures and costs
nothing extra. GPUs without GPM (or no NVML at all) give ``unavailable`` and the rules fall back to
utilisation and power. ``nvml`` is injectable (the fake in tests/fakes has the same functions).

The watch loop keeps a second source of its own for ticks: every tick it reads the GPUs the tree holds
that run kernels while moving little memory (``gpustate.ambiguous``; a read with its metrics took 1.78 ms a
GPU on an H200), so that compute whose operands stay in cache (NVML's memory utilisation under 10 %) is
still seen as work whatever the host does.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Collection
from types import ModuleType
from typing import Any

from hangwatch.model.samples import GpuActivity

# pynvml's NVML_GPM_METRIC_* identifiers, by the GpuActivity field they fill.
METRICS = {
    "graphics_util": 1,
    "sm_util": 2,
    "integer_util": 4,
    "tensor_util": 5,
    "dram_bw_util": 10,
    "fp32_util": 12,
    "fp16_util": 13,
}


class GpmSource:
    def __init__(self, nvml: ModuleType | Any | None = None, clock: Any = time.monotonic) -> None:
        self.unavailable: str | None = None
        self._nvml: Any = None
        self._clock = clock
        self._handles: list[tuple[int, Any]] = []
        self._previous: dict[int, tuple[float, Any]] = {}
        try:
            self._nvml = nvml if nvml is not None else importlib.import_module("pynvml")
            self._nvml.nvmlInit()
            count = int(self._nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self.unavailable = f"NVML unavailable ({exc})"
            self._nvml = None
            return
        for index in range(count):
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                if self._nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                    self._handles.append((index, handle))
            except Exception:  # noqa: S112 - no GPM on this GPU (pre-Hopper, or an old driver)
                continue
        if not self._handles:
            self.unavailable = "no GPU here supports NVML GPM metrics (Hopper or newer needed)"

    def read(
        self, indices: Collection[int] | None = None, max_interval_s: float | None = None
    ) -> tuple[GpuActivity, ...]:
        """Metrics since the previous call for each GPM-capable GPU (``indices``: those only), empty on the
        first call. ``max_interval_s``: a previous sample older than that is only replaced (an average
        over a gap in which nobody read would blur work before it into what the GPU does now)."""
        if self.unavailable is not None:
            return ()
        out = []
        now = self._clock()
        for index, handle in self._handles:
            if indices is not None and index not in indices:
                continue
            try:
                sample = self._nvml.nvmlGpmSampleAlloc()
                self._nvml.nvmlGpmSampleGet(handle, sample)
            except Exception:  # noqa: S112 - a failed read this round: no metrics for this GPU
                continue
            previous = self._previous.get(index)
            self._previous[index] = (now, sample)
            if previous is None:
                continue
            if max_interval_s is not None and now - previous[0] > max_interval_s:
                self._free(previous[1])
                continue
            values = self._metrics(previous[1], sample)
            self._free(previous[1])
            out.append(GpuActivity(index=index, interval_s=round(now - previous[0], 3), **values))
        return tuple(out)

    def _metrics(self, first: Any, second: Any) -> dict[str, float | None]:
        nvml = self._nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(METRICS)
        request.sample1 = first
        request.sample2 = second
        for i, metric_id in enumerate(METRICS.values()):
            request.metrics[i].metricId = metric_id
        try:
            nvml.nvmlGpmMetricsGet(request)
        except Exception:
            return dict.fromkeys(METRICS)
        values: dict[str, float | None] = {}
        for i, name in enumerate(METRICS):
            m = request.metrics[i]
            values[name] = round(float(m.value), 2) if int(getattr(m, "nvmlReturn", 0)) == 0 else None
        return values

    def _free(self, sample: Any) -> None:
        with contextlib.suppress(Exception):  # freeing: nothing to report
            self._nvml.nvmlGpmSampleFree(sample)

    def close(self) -> None:
        for _, sample in self._previous.values():
            self._free(sample)
        self._previous.clear()
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
