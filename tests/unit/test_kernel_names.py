"""Kernel naming (issue 25): cuda-gdb's output as it came from the GPU machine (tests/fixtures/cuda_gdb/),
the names and geometry read from it, and a gpu-spin verdict refined by them, the odd one out among ranks
included; and what it must not touch (another cause, a GPU running nothing, two ranks that differ)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hangwatch.analyse.causes import FIND_THE_KERNEL
from hangwatch.analyse.gpukernels import NAMED
from hangwatch.analyse.gpukernels import ODD_ONE_OUT
from hangwatch.analyse.gpukernels import kernel_notes
from hangwatch.analyse.gpukernels import library_of
from hangwatch.analyse.gpukernels import odd_one_out
from hangwatch.analyse.gpukernels import refine
from hangwatch.collect.cudagdb import classify
from hangwatch.collect.cudagdb import find_cuda_gdb
from hangwatch.collect.cudagdb import kernel_name
from hangwatch.collect.cudagdb import parse_kernels
from hangwatch.collect.stacks import DumpRun
from hangwatch.model.gpukernels import KernelCapture
from hangwatch.model.gpukernels import KernelLaunch
from hangwatch.model.gpukernels import KernelOutcome
from hangwatch.model.gpukernels import KernelSample
from hangwatch.model.gpukernels import bare_name
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cuda_gdb"


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("fixture", "name", "launch", "block"),
    [
        ("torch_spin.txt", "at::cuda::(anonymous namespace)::spin_kernel(long)",
         "spin_kernel(long)<<<(1,1,1),(1,1,1)>>>", (1, 1, 1)),
        ("cupy_spin.txt", "wait_for_flag", "wait_for_flag<<<(1,1,1),(1,1,1)>>>", (1, 1, 1)),
        ("triton_spin.txt", "wait_for_flag_kernel", "wait_for_flag_kernel<<<(1,1,1),(128,1,1)>>>", (128, 1, 1)),
    ],
)  # fmt: skip
def test_each_library_s_spinning_kernel_is_read_with_its_geometry(fixture, name, launch, block):
    [k] = parse_kernels(_read(fixture))
    assert (k.name, k.launch, k.grid, k.block) == (name, launch, (1, 1, 1), block)
    assert k.device == 0 and k.sms == 1 and k.status == "Active"  # one bit of a 132-SM mask


def test_the_table_s_name_without_types_takes_the_frames_full_signature():
    # cuda-gdb 13.0's table says "spin_kernel()"; only the device frame has "(long)".
    text = _read("torch_spin.txt")
    assert "::spin_kernel() " in text
    [k] = parse_kernels(text)
    assert k.name.endswith("spin_kernel(long)")


def test_a_triton_kernel_s_source_is_kept_and_names_its_library():
    [k] = parse_kernels(_read("triton_spin.txt"))
    assert k.source.endswith("kernel_program.py:62")
    assert library_of(k) == "Triton, kernel_program.py:62"
    [torch_kernel] = parse_kernels(_read("torch_spin.txt"))
    assert library_of(torch_kernel) == "torch"
    [raw] = parse_kernels(_read("cupy_spin.txt"))
    assert library_of(raw) is None  # a RawKernel is named as its author named it: nothing to tell


def test_a_gpu_between_gemms_runs_no_kernel_and_its_host_frames_are_not_kernels():
    assert parse_kernels(_read("gemm.txt")) == ()


def test_a_frame_alone_still_names_a_kernel_where_the_table_is_missing():
    text = "#0  0x00007f in ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)<<<(8,1,1),(512,1,1)>>> ()"
    [k] = parse_kernels(text)
    assert (
        k.launch
        == "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)<<<(8,1,1),(512,1,1)>>>"
    )
    assert k.sms is None and k.device is None and library_of(k) == "NCCL"


@pytest.mark.parametrize(
    ("invocation", "name"),
    [
        ("spin_kernel(cycles=100)", "spin_kernel"),  # an older debugger's argument values
        ("f(long)(cycles=1)", "f(long)"),
        ("f()", "f()"),
        ("at::cuda::(anonymous namespace)::spin_kernel()", "at::cuda::(anonymous namespace)::spin_kernel()"),
        ("void cutlass::Kernel<Sm90>(Params)", "void cutlass::Kernel<Sm90>(Params)"),
    ],
)
def test_argument_values_are_dropped_and_types_kept(invocation, name):
    assert kernel_name(invocation) == name


def test_bare_names_meet_across_the_two_spellings():
    assert bare_name("at::cuda::(anonymous namespace)::spin_kernel(long)") == bare_name(
        "at::cuda::(anonymous namespace)::spin_kernel()"
    )


def test_the_debugger_s_outcomes_are_told_apart():
    refused = _read("refused.txt")
    out, _, err = refused.partition("--- stderr\n")
    assert classify(DumpRun(1, out, err, 0.2))[0] is KernelOutcome.REFUSED
    assert classify(DumpRun(1, "", "ptrace: No such process.", 0.1))[0] is KernelOutcome.GONE
    outcome, detail = classify(DumpRun(None, "", "", 60.0))
    assert outcome is KernelOutcome.TIMEOUT and "60 s" in detail
    assert classify(DumpRun(0, "No CUDA kernels.\n", "", 9.0))[0] is KernelOutcome.OK
    outcome, detail = classify(DumpRun(1, "", "unrecognized option '--frobnicate'\nUse --help.", 0.1))
    assert outcome is KernelOutcome.FAILED and detail


def test_the_debugger_is_found_where_the_toolkit_puts_it(tmp_path):
    home = tmp_path / "cuda-12.8"
    (home / "bin").mkdir(parents=True)
    gdb = home / "bin" / "cuda-gdb"
    gdb.write_text("#!/bin/sh\n")
    gdb.chmod(0o755)
    empty = str(tmp_path / "nothing")
    assert find_cuda_gdb({"PATH": empty, "CUDA_HOME": str(home)}) == str(gdb)
    assert find_cuda_gdb({"PATH": str(home / "bin")}) == str(gdb)
    assert find_cuda_gdb({"PATH": empty, "HANGWATCH_CUDA_GDB": str(gdb)}) == str(gdb)
    assert find_cuda_gdb({"PATH": empty, "HANGWATCH_CUDA_GDB": str(tmp_path / "missing")}) is None
    if not any(Path("/usr/local").glob("cuda*/bin/cuda-gdb")):
        assert find_cuda_gdb({"PATH": empty}) is None


# -- the verdict ---------------------------------------------------------------------------------------

SPIN = parse_kernels(_read("torch_spin.txt"))
RAW = parse_kernels(_read("cupy_spin.txt"))


def _capture(pid: int, kernels=SPIN, outcome=KernelOutcome.OK) -> KernelCapture:
    return KernelCapture(pid, outcome, tuple(kernels), paused_s=9.5, state_after="R")


def _sample(*captures: KernelCapture) -> KernelSample:
    return KernelSample(40.0, captures, "/usr/local/cuda/bin/cuda-gdb", 10.0)


def _verdict(culprits: tuple[int, ...], cause: Cause = Cause.GPU_SPIN) -> Verdict:
    steps = (f"The host waits for the GPU. {FIND_THE_KERNEL}try `NCCL_P2P_DISABLE=1`.",)
    return Verdict(State.STALLED, cause, None, "rank 0 in cudaDeviceSynchronize", culprits, (), steps,
                   decided_by=("stalled:window", "stacks:gpu-spin"))  # fmt: skip


def label(pid: int) -> str:
    return f"rank {pid - 10} [{pid}]"


def test_a_spin_verdict_names_the_kernel_its_geometry_and_how_long():
    v = refine(_verdict((10,)), _sample(_capture(10)), label, 40.4)
    assert v.summary.endswith(
        "rank 0 [10]'s GPU runs `spin_kernel(long)<<<(1,1,1),(1,1,1)>>>` on 1 SM for 40 s: "
        "a kernel waiting for something that never comes"
    )
    assert v.decided_by[-1] == NAMED and v.culprits == (10,)
    assert any("(torch) on 1 SM of GPU 0 (cuda-gdb, a pause of 9.5 s)" in e for e in v.evidence)
    # The re-run that would lose the hang is no longer advised: the kernel is named.
    assert FIND_THE_KERNEL not in v.next_steps[0] and "named above" in v.next_steps[0]


def test_the_odd_rank_out_is_the_culprit_where_the_stacks_named_every_rank_alike():
    sample = _sample(_capture(10), _capture(11), _capture(12, RAW), _capture(13))
    assert odd_one_out(sample).pid == 12
    v = refine(_verdict((10, 11, 12, 13)), sample, label, 30.0)
    assert v.culprits == (12,) and v.decided_by[-2:] == (NAMED, ODD_ONE_OUT)
    assert any(
        "rank 2 [12] runs `wait_for_flag" in e and "its 3 peers run `spin_kernel" in e for e in v.evidence
    )


def test_a_rank_whose_gpu_runs_nothing_is_the_odd_one_out_too():
    sample = _sample(_capture(10), _capture(11), _capture(12), _capture(13, ()))
    assert odd_one_out(sample).pid == 13


def test_the_stacks_culprit_stands_when_the_stacks_named_one_apart():
    # The peer that never arrived (in Event.wait) is the culprit; its GPU running nothing agrees.
    sample = _sample(_capture(10), _capture(11), _capture(12), _capture(13, ()))
    v = refine(_verdict((13,)), sample, label, 30.0)
    assert v.culprits == (13,) and ODD_ONE_OUT not in v.decided_by


def test_two_ranks_that_differ_say_nothing_about_which_is_odd():
    sample = _sample(_capture(10), _capture(11, RAW))
    assert odd_one_out(sample) is None
    v = refine(_verdict((10, 11)), sample, label, 30.0)
    assert v.culprits == (10, 11) and ODD_ONE_OUT not in v.decided_by


def test_ranks_that_all_agree_have_no_odd_one_out():
    assert odd_one_out(_sample(_capture(10), _capture(11), _capture(12))) is None


def test_another_cause_and_a_gpu_running_nothing_are_left_as_they_are():
    other = _verdict((10,), Cause.COLLECTIVE_WAIT)
    assert refine(other, _sample(_capture(10)), label, 30.0) == other
    idle = _verdict((10,))
    assert refine(idle, _sample(_capture(10, ())), label, 30.0) == idle
    refused = _capture(10, (), KernelOutcome.REFUSED)
    assert refine(idle, _sample(refused), label, 30.0) == idle


def test_the_notes_say_the_pause_and_each_reason_once():
    sample = _sample(
        _capture(10),
        KernelCapture(11, KernelOutcome.REFUSED, detail="ptrace: Operation not permitted.", paused_s=0.2),
        KernelCapture(12, KernelOutcome.REFUSED, detail="ptrace: Operation not permitted.", paused_s=0.2),
        KernelCapture(13, KernelOutcome.OK, (), paused_s=8.0, state_after="R", resumed=True),
    )
    notes = kernel_notes(sample, label)
    assert "paused up to 9.5 s" in notes[0] and "4 processes" in notes[0]
    [refusal] = [n for n in notes if "refused" in n]
    assert "rank 1 [11], rank 2 [12]" in refusal and "ptrace_scope" in refusal
    assert "rank 3 [13] was left stopped by cuda-gdb and resumed (SIGCONT)" in notes


def test_no_debugger_is_one_note_that_says_what_to_install():
    from hangwatch.collect.cudagdb import KernelReader

    reader = KernelReader(debugger=None)
    reader.debugger = None  # as on a machine without the CUDA toolkit, whatever this one has
    sample = reader.capture([10, 11], 1.0)
    assert all(c.outcome is KernelOutcome.NO_DEBUGGER for c in sample.captures)
    [note] = kernel_notes(sample, label)
    assert note.startswith("kernels: not named: cuda-gdb not found") and "install" in note


def test_a_launch_is_written_as_cuda_writes_it():
    k = KernelLaunch(
        "void at::native::vectorized_elementwise_kernel<4, Functor>(int, Functor)",
        (132, 1, 1),
        (128, 1, 1),
        0,
        132,
    )
    assert k.short_name == "vectorized_elementwise_kernel<4, Functor>(int, Functor)"
    assert k.launch.endswith("<<<(132,1,1),(128,1,1)>>>")
    assert os.sep not in k.launch
