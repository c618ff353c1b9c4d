"""Waiting for a tree's GPU memory to be released after clean-up (``supervise.teardown``), on scripted readings.

The real path (NVML on an H200) is validated by scripts/gpu/validate_nvml.py and validate_bench.py; here
the readings are scripted through the same ``GpuSource`` interface.
"""

from __future__ import annotations

from hangwatch.model.samples import GpuProcessMemory
from hangwatch.model.samples import GpuReading
from hangwatch.model.samples import GpuSample
from hangwatch.supervise import teardown


class Scripted:
    """A GpuSource that returns the given samples in turn, then the last one forever."""

    def __init__(self, *samples: GpuSample) -> None:
        self.samples = list(samples)
        self.reads = 0

    def read(self) -> GpuSample:
        self.reads += 1
        return self.samples.pop(0) if len(self.samples) > 1 else self.samples[0]

    def close(self) -> None:
        return None


def gpu(util: float) -> GpuReading:
    return GpuReading(0, "H200", util, 0.0, 2**30, 2**37, 120.0, 1980)


def held(pid: int, mib: int) -> GpuProcessMemory:
    return GpuProcessMemory(pid, 0, mib * 2**20)


def test_memory_released_after_a_few_reads():
    source = Scripted(
        GpuSample(gpus=(gpu(0),), processes=(held(7, 512),)),
        GpuSample(gpus=(gpu(0),), processes=(held(7, 512),)),
        GpuSample(gpus=(gpu(0),)),
    )
    assert teardown.wait_gpu_release(source, {7}, timeout_s=5) == "GPU memory of the tree released"
    assert source.reads == 3


def test_memory_still_held_after_the_timeout_is_said_with_its_size():
    source = Scripted(GpuSample(gpus=(gpu(0),), processes=(held(7, 512), held(8, 64))))
    note = teardown.wait_gpu_release(source, {7}, timeout_s=0.6)
    assert note == "GPU memory still held by the tree after 1 s: 512 MiB"


def test_a_gpu_busy_with_no_process_is_reported_as_possibly_wedged():
    source = Scripted(GpuSample(gpus=(gpu(100),)))
    note = teardown.wait_gpu_release(source, {7}, timeout_s=1)
    assert note is not None and note.startswith("GPU 0 at 100 % with no process")
    assert "never resets GPUs" in note and "stayed so for 5 s" in note


def test_a_busy_reading_that_does_not_persist_is_no_wedge():
    """NVML's utilisation averages its last period: 100 % right after the kernel died, 0 % a moment later."""
    source = Scripted(GpuSample(gpus=(gpu(100),)), GpuSample(gpus=(gpu(100),)), GpuSample(gpus=(gpu(0),)))
    assert teardown.wait_gpu_release(source, {7}, timeout_s=1) == "GPU memory of the tree released"


def test_a_busy_gpu_with_a_process_on_it_is_not_wedged():
    sample = GpuSample(gpus=(gpu(100),), processes=(held(9, 100),))
    assert teardown.busy_without_process(sample) is None


def test_no_gpu_means_nothing_to_say():
    source = Scripted(GpuSample(unavailable="NVML Shared Library Not Found"))
    assert teardown.wait_gpu_release(source, {7}, timeout_s=5) is None
    assert source.reads == 1
