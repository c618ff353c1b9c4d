"""The NVML boundary, driven through a fake with pynvml's interface (the real one runs on the GPU machine)."""

from __future__ import annotations

from fakes.fake_pynvml import FakeGpu
from fakes.fake_pynvml import FakeNvml
from fakes.fake_pynvml import NVMLError_LibraryNotFound
from hangwatch.collect.nvml import NvmlGpuSource


def test_readings_and_memory_per_process():
    nvml = FakeNvml(
        [FakeGpu(processes=[(101, 70 * 2**30), (102, None)]), FakeGpu(util=100, power_mw=125_000)]
    )
    sample = NvmlGpuSource(nvml).read()
    assert sample.unavailable is None and sample.error is None
    g0, g1 = sample.gpus
    assert (g0.util_pct, g0.mem_used_bytes, g0.power_w, g0.sm_clock_mhz) == (3.0, 76 * 2**30, 120.0, 1980)
    assert g1.util_pct == 100.0 and g1.power_w == 125.0
    assert sample.memory_of(frozenset({101, 102})) == 70 * 2**30


def test_no_library_is_one_unavailable_reason():
    source = NvmlGpuSource(FakeNvml([], init_error=NVMLError_LibraryNotFound()))
    sample = source.read()
    assert sample.unavailable is not None and "NVML Shared Library Not Found" in sample.unavailable
    assert sample.gpus == ()
    source.close()


def test_no_gpu():
    assert "no GPU" in (NvmlGpuSource(FakeNvml([])).read().unavailable or "")


def test_unsupported_field_is_absent_and_failures_are_evidence():
    nvml = FakeNvml([FakeGpu(power_supported=False, fail_util="GPU is lost")])
    sample = NvmlGpuSource(nvml).read()
    (g,) = sample.gpus
    assert g.power_w is None and g.util_pct is None
    assert sample.error == "GPU is lost"  # 'Not Supported' is not an error, a lost GPU is


def test_real_module_without_a_driver_degrades():
    sample = NvmlGpuSource().read()  # this machine has nvidia-ml-py but no driver (CI), or a real GPU
    assert sample.unavailable is not None or sample.gpus
