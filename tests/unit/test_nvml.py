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


class _GpmNvml:
    """NVML's GPM calls as pynvml spells them, for two GPUs whose samples count up: enough to see which
    GPUs a read asks and which pairs of samples it turns into metrics (the real GPM: docs/gpu-validation.md)."""

    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self) -> None:
        self.taken: list[int] = []
        self.freed = 0

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlGpmQueryDeviceSupport(self, handle: int) -> object:
        return type("Support", (), {"isSupportedDevice": 1})()

    def nvmlGpmSampleAlloc(self) -> list[int]:
        return []

    def nvmlGpmSampleGet(self, handle: int, sample: list[int]) -> None:
        self.taken.append(handle)
        sample.append(handle)

    def nvmlGpmSampleFree(self, sample: list[int]) -> None:
        self.freed += 1

    def c_nvmlGpmMetricsGet_t(self) -> object:
        metric = type("Metric", (), {"metricId": 0, "value": 41.0, "nvmlReturn": 0})
        return type("Request", (), {"metrics": [metric() for _ in range(16)]})()

    def nvmlGpmMetricsGet(self, request: object) -> None: ...


def test_gpm_reads_the_gpus_asked_and_starts_again_after_a_gap():
    from hangwatch.collect.gpm import GpmSource

    now = [0.0]
    nvml = _GpmNvml()
    gpm = GpmSource(nvml, clock=lambda: now[0])
    assert gpm.unavailable is None
    assert gpm.read({1}) == () and nvml.taken == [1]  # GPU 0 not held by the tree: not read
    now[0] = 1.0
    [activity] = gpm.read({1}, max_interval_s=2.5)
    assert (activity.index, activity.interval_s, activity.tensor_util) == (1, 1.0, 41.0)
    now[0] = 10.0  # nobody read for 9 s: that average is not what the GPU does now
    assert gpm.read({1}, max_interval_s=2.5) == ()
    now[0] = 11.0
    assert [a.interval_s for a in gpm.read({1}, max_interval_s=2.5)] == [1.0]
    gpm.close()
    assert nvml.freed == 4  # every sample taken was freed: three replaced, the last at close
