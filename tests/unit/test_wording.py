"""Texts that say what is true: counts agree with their nouns, doctor counts the ranks the server asks for."""

from __future__ import annotations

from builders import process_sample
from builders import report_with
from hangwatch.analyse.doctor import nccl as nccl_checks
from hangwatch.analyse.evidence import window_evidence
from hangwatch.analyse.stacktree import build_tree
from hangwatch.doctor.session import select_gpus
from hangwatch.model.doctor import GpuInventory
from hangwatch.model.doctor import HostFacts
from hangwatch.model.doctor import PyEnvFacts
from hangwatch.model.samples import Tick
from hangwatch.render.live import LiveState
from hangwatch.render.live import status_line
from hangwatch.render.stacktext import tree_lines
from hangwatch.supervise.teardown import CleanupResult
from hangwatch.words import plural


def test_plural():
    assert plural(1, "process") == "1 process"
    assert plural(0, "process") == "0 processes"
    assert plural(4, "PCIe-only GPU") == "4 PCIe-only GPUs"
    assert plural(2, "child", "children") == "2 children"


def test_one_process_and_no_probe_read_as_english():
    state = LiveState(
        t=1.0, phase="launch", phase_label="starting", in_phase_s=1.0, processes=(process_sample(7, "x"),),
        interval_s=1.0, probe=None, time_to_stall_s=5.0, gpu=None, gpu_mem_by_pid={}, last_progress="none yet",
    )  # fmt: skip
    line = status_line(state)
    assert "1 process," in line and "procs" not in line
    assert "no probe" in line and "probe no probe" not in line
    ticks = [
        Tick(t=0.0, processes=(process_sample(7, "x"),)),
        Tick(t=1.0, processes=(process_sample(7, "x"),)),
    ]
    assert window_evidence(ticks, 1.0, None, None)[1].startswith("1 process: ")
    assert CleanupResult(terminated=(7,), killed=(), remaining=()).describe().startswith("stopped 1 process")
    tree = build_tree(list(report_with("x").stacks))
    assert "(1 sample; 1 process, 1 thread)" in tree_lines(tree)[1]


def test_doctor_counts_the_tensor_parallel_size_not_the_gpus_listed():
    command = ("vllm", "serve", "m", "--tensor-parallel-size", "4")
    gpus = select_gpus(GpuInventory(), None, (12, 0), {}, planned=nccl_checks.tensor_parallel(command) or 1)
    assert len(gpus) == 4  # planning with --capability: the server's 4 ranks, not one GPU
    check = nccl_checks.check_nccl_env(
        {}, command=command, gpus=gpus[:1], inventory=GpuInventory(gpus=tuple(gpus[:1])),
        host=HostFacts(net_interfaces=("eth0",)), pyenv=PyEnvFacts("python"),
    )  # fmt: skip
    text = " ".join(check.evidence)
    assert "tensor parallelism over 4 PCIe-only compute-capability-12 GPUs" in text, text


def test_one_byte_formatter_for_every_size_hangwatch_prints():
    from hangwatch.words import human_bytes

    assert [human_bytes(n) for n in (0, 1023, 1024, 3 << 20, 5 << 40)] == [
        "0 B", "1023 B", "1.0 KiB", "3.0 MiB", "5.0 TiB",
    ]  # fmt: skip
    assert human_bytes(-2048) == "-2.0 KiB"
    # doctor's sizes: whole MiB below a GiB, then GiB with one decimal; cleanup's: always whole MiB
    assert [human_bytes(n, "MiB", "GiB") for n in (None, 512 << 20, 3 << 29, 96 << 30)] == [
        "?", "512 MiB", "1.5 GiB", "96.0 GiB",
    ]  # fmt: skip
    assert [human_bytes(n, "MiB", "MiB") for n in (None, 0, 3 << 30)] == ["?", "0 MiB", "3072 MiB"]


def test_a_watch_that_fell_behind_says_so():
    from types import SimpleNamespace

    from hangwatch.supervise.watch import Watch

    on_time = SimpleNamespace(late=[], interval=1.0)
    assert Watch._late_note(on_time) == ()  # type: ignore[arg-type]
    behind = SimpleNamespace(late=[1.2, 2.46], interval=1.0)
    assert Watch._late_note(behind) == (  # type: ignore[arg-type]
        "sampling fell behind 2 times (at most 2.5 s late: a slow /proc, NVML or stack capture); the windows "
        "count real time, not samples",
    )
