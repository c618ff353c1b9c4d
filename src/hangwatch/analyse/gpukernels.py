"""The kernels of a GPU wait, decided: a ``gpu-spin`` verdict refined by what cuda-gdb read
(collect/cudagdb.py), and the notes that say what reading them cost.

What the kernels add is the kernel's own name and geometry ("rank 1's GPU runs
``spin_kernel(long)<<<(1,1,1),(1,1,1)>>>`` on 1 SM for 40 s"), and, among ranks, who differs: ranks of one
collective run the same kernel, so the one whose GPU runs another kernel, or none, is where the wait
started, as a rank whose stack is elsewhere is. That is evidence for the culprit only where the stacks
named none apart (every rank in the wait); where they did, the kernels are evidence beside them.

The library a kernel comes from is read off its name, where the name says it (a namespace, a prefix):
data, below, not a rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import PurePath

from hangwatch.analyse.causes import FIND_THE_KERNEL
from hangwatch.engines import registry
from hangwatch.model.gpukernels import KernelCapture
from hangwatch.model.gpukernels import KernelLaunch
from hangwatch.model.gpukernels import KernelOutcome
from hangwatch.model.gpukernels import KernelSample
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import Cause
from hangwatch.words import plural

NAMED = "kernels:named"
ODD_ONE_OUT = "kernels:odd-one-out"
# Ranks of one collective, the most that one differing kernel among them is told apart from: two that
# differ say nothing about which one is odd.
MIN_PEERS = 3

# Where a kernel's name says its library: the first match wins (name prefixes and namespaces as the
# libraries write them; Triton and CuPy name kernels as their users do, and are not told apart here).
# The engines' own namespaces (``Profile.kernel_namespaces``) come between these and ``LATER_LIBRARIES``.
LIBRARIES: tuple[tuple[str, str], ...] = (
    ("nccl", "NCCL"),
    ("at::", "torch"),
    ("c10::", "torch"),
    ("flashinfer::", "flashinfer"),
    ("flash::", "flash-attention"),
    ("cutlass::", "CUTLASS"),
    ("cub::", "CUB"),
)
LATER_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("deep_ep::", "DeepEP"),
    ("deep_gemm::", "DeepGEMM"),
    ("cublas", "cuBLAS"),
    ("sm90_xmma", "cuBLAS"),
)


def library_of(kernel: KernelLaunch) -> str | None:
    """The library a kernel comes from, where its name or its source says; None where neither does (a
    RawKernel of CuPy is named as its author named it)."""
    if kernel.source.rpartition(":")[0].endswith(".py"):
        return f"Triton, {PurePath(kernel.source).name}"  # JIT-compiled from a Python function
    name = kernel.name.lower()
    for prefix, library in (*LIBRARIES, *registry.kernel_namespaces(), *LATER_LIBRARIES):
        if name.startswith((prefix, f"void {prefix}")) or f" {prefix}" in name:
            return library
    return None


def kernel_words(kernel: KernelLaunch) -> str:
    """```spin_kernel(long)<<<(1,1,1),(1,1,1)>>>`` (torch) on 1 SM of GPU 0`."""
    library = library_of(kernel)
    where = []
    if kernel.sms is not None:
        where.append(f"on {plural(kernel.sms, 'SM')}")
    if kernel.device is not None:
        where.append(f"of GPU {kernel.device}")
    text = f"`{kernel.launch}`" + (f" ({library})" if library else "")
    return " ".join([text, *where])


def _signature(c: KernelCapture) -> frozenset[str]:
    return frozenset(k.name for k in c.kernels)


def odd_one_out(sample: KernelSample) -> KernelCapture | None:
    """Among at least ``MIN_PEERS`` processes read, the one whose kernels differ from all the others',
    which agree among themselves (running no kernel counts as a difference)."""
    read = [c for c in sample.captures if c.outcome is KernelOutcome.OK]
    if len(read) < MIN_PEERS:
        return None
    counts = Counter(_signature(c) for c in read)
    if len(counts) != 2:
        return None
    (common, _), (rare, m) = counts.most_common()
    if m != 1 or not common:
        return None
    return next(c for c in read if _signature(c) == rare)


def kernel_evidence(sample: KernelSample, label: Callable[[int], str]) -> list[str]:
    """One line per process whose GPU runs kernels, and the odd one out where there is one."""
    lines = [
        f"{label(c.pid)}'s GPU runs " + "; ".join(kernel_words(k) for k in c.kernels[:3])
        + (f" and {plural(len(c.kernels) - 3, 'more kernel')}" if len(c.kernels) > 3 else "")
        + f" (cuda-gdb, a pause of {c.paused_s:.1f} s)"
        for c in sample.captures
        if c.outcome is KernelOutcome.OK and c.kernels
    ]  # fmt: skip
    odd = odd_one_out(sample)
    if odd is not None:
        others = [c for c in sample.captures if c.outcome is KernelOutcome.OK and c.pid != odd.pid]
        theirs = ", ".join(f"`{k.launch}`" for k in others[0].kernels[:2]) or "no kernel"
        mine = ", ".join(f"`{k.launch}`" for k in odd.kernels[:2]) or "no kernel"
        lines.append(
            f"{label(odd.pid)} runs {mine} where its {plural(len(others), 'peer')} run {theirs}: "
            "the odd one out"
        )
    return lines


def steps_with_kernels(steps: tuple[str, ...], sample: KernelSample) -> tuple[str, ...]:
    """The next steps once the kernel is named: no re-run to find it (which would lose the hang)."""
    if not any(c.outcome is KernelOutcome.OK and c.kernels for c in sample.captures):
        return steps
    named = "The kernel is named above (cuda-gdb, the process left running); "
    return tuple(s.replace(FIND_THE_KERNEL, named) for s in steps)


def refine(
    verdict: Verdict,
    sample: KernelSample,
    label: Callable[[int], str],
    quiet_s: float | None,
) -> Verdict:
    """A ``gpu-spin`` verdict with its kernels named, and the odd one out as its culprit where the stacks
    named no rank apart; any other verdict as it is (the kernels are in the report either way)."""
    if verdict.cause is not Cause.GPU_SPIN:
        return verdict
    read = [c for c in sample.captures if c.outcome is KernelOutcome.OK and c.kernels]
    if not read:
        return verdict
    lasting = f" for {quiet_s:.0f} s" if quiet_s is not None and quiet_s >= 1 else ""
    kernel = read[0].kernels[0]
    sms = f" on {plural(kernel.sms, 'SM')}" if kernel.sms is not None else ""
    summary = (
        f"{verdict.summary}; {label(read[0].pid)}'s GPU runs `{kernel.launch}`{sms}{lasting}: "
        "a kernel waiting for something that never comes"
    )
    decided = (*verdict.decided_by, NAMED)
    culprits = verdict.culprits
    odd = odd_one_out(sample)
    listed = {c.pid for c in sample.captures if c.outcome is KernelOutcome.OK}
    if odd is not None and set(culprits) in ({c.pid for c in read}, listed):
        # The stacks named every rank of the wait (no rank apart): the kernels tell which one.
        culprits = (odd.pid,)
        decided = (*decided, ODD_ONE_OUT)
    return replace(
        verdict,
        summary=summary,
        culprits=culprits,
        evidence=(*verdict.evidence, *kernel_evidence(sample, label)),
        next_steps=steps_with_kernels(verdict.next_steps, sample),
        decided_by=decided,
    )


def kernel_notes(sample: KernelSample, name: Callable[[int], str]) -> tuple[str, ...]:
    """What reading the kernels cost and where it could not: one line each, never one per process
    for the same reason."""
    notes: list[str] = []
    if sample.debugger is None:
        reasons = {c.detail for c in sample.captures}
        return tuple(f"kernels: not named: {r}" for r in sorted(reasons) if r)
    attached = [c for c in sample.captures if c.paused_s > 0]
    if attached:
        longest = max(c.paused_s for c in attached)
        notes.append(
            f"kernels: read by cuda-gdb from {plural(len(attached), 'process', 'processes')} in "
            f"{sample.elapsed_s:.1f} s; each one's host threads were paused up to {longest:.1f} s while it "
            "was attached (its GPU ran on)"
        )
    by_reason: dict[tuple[KernelOutcome, str], list[int]] = {}
    for c in sample.captures:
        if c.outcome not in (KernelOutcome.OK, KernelOutcome.GONE):
            by_reason.setdefault((c.outcome, c.detail), []).append(c.pid)
    for (outcome, detail), pids in by_reason.items():
        who = ", ".join(name(p) for p in pids[:4])
        hint = (
            ": run hangwatch as the target's user or root with ptrace allowed (kernel.yama.ptrace_scope, "
            "CAP_SYS_PTRACE; a container needs --cap-add SYS_PTRACE and the GPU's debugger access)"
            if outcome is KernelOutcome.REFUSED
            else ""
        )
        notes.append(f"kernels: {outcome.value} for {who}: {detail.rstrip('.')}{hint}")
    for c in sample.captures:
        if c.resumed:
            notes.append(f"{name(c.pid)} was left stopped by cuda-gdb and resumed (SIGCONT)")
    return tuple(notes)
