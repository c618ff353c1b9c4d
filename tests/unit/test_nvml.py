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
    # Said on every run of a CPU machine: short, and naming what is missing.
    assert sample.unavailable == "no NVIDIA driver (NVML's library not found)"
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


def test_per_process_sm_samples_say_whose_kernel_runs():
    """NVML's per-process samples (measured on the H200: the spinning rank 94-99 %, its absent peer 0):
    only samples newer than the last reading count, and none newer means every process read 0."""
    gpu = FakeGpu(
        processes=[(201, 1 << 30), (202, 1 << 30)], process_util=[(201, 1_000, 99), (201, 2_000, 97)]
    )
    source = NvmlGpuSource(FakeNvml([gpu]))
    first = {p.pid: p.sm_util_pct for p in source.read().processes}
    assert first == {201: 99.0, 202: 0.0}
    again = source.read()  # nothing newer than timestamp 2000: NVML answers "Not Found"
    assert {p.pid: p.sm_util_pct for p in again.processes} == {201: 0.0, 202: 0.0} and again.error is None
    gpu.process_util.append((202, 3_000, 40))
    assert {p.pid: p.sm_util_pct for p in source.read().processes} == {201: 0.0, 202: 40.0}


def test_per_process_sm_samples_unsupported_are_absent_not_errors():
    source = NvmlGpuSource(FakeNvml([FakeGpu(processes=[(201, 1 << 30)], process_util=None)]))
    for _ in range(2):
        sample = source.read()
        assert sample.processes[0].sm_util_pct is None and sample.error is None
