"""``hangwatch stacks``: one merged snapshot of a running tree's stacks now, read-only.

The same machinery as a watch: the tree is found from /proc, every process is dumped concurrently
(never a stopped one; a dump that leaves a process stopped is undone), the stacks are merged across
ranks and the stack rules name a cause. With ``--samples N`` it takes N rounds ``--every`` seconds
apart, which tells a stack that does not move from one that does.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hangwatch import engines
from hangwatch.analyse import causes
from hangwatch.analyse.gpukernels import kernel_evidence
from hangwatch.analyse.gpukernels import kernel_notes
from hangwatch.analyse.gpukernels import steps_with_kernels
from hangwatch.analyse.nextsteps import StepFacts
from hangwatch.analyse.nextsteps import fit
from hangwatch.analyse.stackcontext import stack_context
from hangwatch.analyse.stackrules import classify
from hangwatch.analyse.stacktree import build_tree
from hangwatch.analyse.stackwatch import with_native_detail
from hangwatch.collect import procfs
from hangwatch.collect.connections import ConnectionWatcher
from hangwatch.collect.cudagdb import KernelReader
from hangwatch.collect.proctree import TreeSampler
from hangwatch.collect.proctree import check_target
from hangwatch.collect.proctree import own_processes
from hangwatch.collect.proctree import whole_machine_note
from hangwatch.collect.stacks import StackDumper
from hangwatch.engines import registry
from hangwatch.errors import HangwatchError
from hangwatch.errors import NoSuchProcess
from hangwatch.model.gpukernels import KernelSample
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import StackSample
from hangwatch.model.vocabulary import Cause
from hangwatch.redact import scrub
from hangwatch.render.files import write_atomically
from hangwatch.render.files import write_outputs
from hangwatch.render.json_report import json_text
from hangwatch.render.json_report import plain
from hangwatch.render.stacktext import tree_lines

SNAPSHOT_SCHEMA = "hangwatch.stacks/1"


class StacksUnavailableError(HangwatchError):
    exit_code = 1
    help_text = "Install py-spy in hangwatch's environment: pip install py-spy"


@dataclass(frozen=True)
class SnapshotOptions:
    pid: int
    engine: str | None
    samples: int
    every_s: float
    native: bool
    report_json: Path | None
    whole_machine: bool = False
    kernel_names: bool = False  # at a gpu-spin diagnosis, read the running kernels with cuda-gdb


def take_snapshot(options: SnapshotOptions) -> int:
    stat = procfs.read_stat(options.pid)
    if stat is None:
        raise NoSuchProcess(f"no process with PID {options.pid}")
    # Not hangwatch itself or its parent chain (it would dump nothing but the shell), not a kernel thread,
    # not every Python process of the machine unless asked for by name: as cleanup refuses them.
    check_target(f"--pid {options.pid}", [options.pid], whole_machine_flag="--whole-machine",
                 whole_machine=options.whole_machine, others_ok=True)  # fmt: skip
    cmdline = procfs.read_cmdline(options.pid) or (stat.comm,)
    profile = engines.by_name(options.engine) if options.engine else engines.detect(cmdline)
    dumper = StackDumper(native=options.native, engine_caches=registry.cache_folders())
    if dumper.unavailable is not None:
        raise StacksUnavailableError(dumper.unavailable)
    sampler = TreeSampler([options.pid], profile.role_of, watch_deaths=False, exclude=own_processes)
    started = time.monotonic()
    samples: list[StackSample] = []
    ticks: list[Tick] = []

    def census() -> Tick:
        t = round(time.monotonic() - started, 3)
        reading = sampler.sample(t)
        return Tick(t=t, processes=reading.processes, exits=reading.exits)

    try:
        for i in range(options.samples):
            if i:
                # One more /proc reading halfway between captures: data flowing through a process in
                # every interval shows its code moving (progress.data_flowing), even over two captures.
                time.sleep(options.every_s / 2)
                ticks.append(census())
                time.sleep(options.every_s / 2)
            ticks.append(census())
            # Native frames for the first round only; later rounds borrow them where the stack is the same.
            samples.append(dumper.capture(ticks[-1].processes, ticks[-1].t, native=options.native and i == 0))
        # Whether requests wait for an answer on the tree's listening ports: a tree where every process
        # waits for messages is idle only when none does (stackrules.rule_waiting_for_work).
        ports = {port for p in ticks[-1].processes for port in p.listening_ports}
        members = [p.pid for p in ticks[-1].processes]
        ticks[-1] = dataclasses.replace(ticks[-1], connections=ConnectionWatcher().read(ports, members))
    finally:
        sampler.close()
    analysed = [*samples[:-1], with_native_detail(samples)]
    exits = tuple(e for tick in ticks for e in tick.exits)
    diagnosis = classify(stack_context(analysed, ticks, exits))
    tree = build_tree(analysed, highlight=diagnosis.culprits or None)
    culprits = culprit_labels(diagnosis.culprits, ticks, exits)
    steps = snapshot_steps(diagnosis, options.pid)
    kernels = None
    if options.kernel_names and diagnosis.cause is Cause.GPU_SPIN:
        # The tree's members, eight at most (a snapshot reads no NVML to tell which hold GPU memory).
        kernels = KernelReader().capture(sorted(p.pid for p in ticks[-1].processes), ticks[-1].t)
        steps = steps_with_kernels(steps, kernels)
    lines = snapshot_text(options.pid, tree_lines(tree, max_lines=60), diagnosis, culprits, steps)
    if kernels is not None:
        lines += kernel_lines(kernels, ticks, exits)
    print(scrub("\n".join(lines)), flush=True)
    if options.report_json is not None:
        data: dict[str, Any] = {
            "schema": SNAPSHOT_SCHEMA,
            "pid": options.pid,
            "engine": profile.name,
            "diagnosis": plain(dataclasses.asdict(diagnosis)),
            "culprit_labels": list(culprits),
            "next_steps": list(steps),  # with the kernel named where cuda-gdb named it
            "stacks": plain([dataclasses.asdict(s) for s in samples]),
            "stack_tree": plain(dataclasses.asdict(tree)),
            "kernels": plain(dataclasses.asdict(kernels)) if kernels is not None else None,
        }
        write_outputs(
            [("--report-json", options.report_json, lambda path: write_atomically(path, json_text(data)))]
        )
    return 0


def culprit_labels(
    culprits: tuple[int, ...], ticks: list[Tick], exits: tuple[ExitRecord, ...]
) -> tuple[str, ...]:
    """Each culprit as ``name [pid] role/rank``, as a run's verdict names it (render/text.py), from the
    latest census that saw it (or its exit, for one that ended): never a bare pid."""
    known: dict[int, tuple[str, str | None, str | None]] = {}
    for e in exits:
        known[e.pid] = (e.name, e.role, e.rank)
    for tick in ticks:
        for p in tick.processes:
            known[p.pid] = (p.name, p.role, p.rank)
    labels = []
    for pid in culprits:
        if pid not in known:
            labels.append(f"[{pid}]")
            continue
        name, role, rank = known[pid]
        labels.append(f"{name} [{pid}]" + ((f" {role}/{rank}" if role else f" rank {rank}") if rank else ""))
    return tuple(labels)


def snapshot_steps(diagnosis: causes.Diagnosis, pid: int) -> tuple[str, ...]:
    """The next steps after a snapshot: never "take the stacks" (the command just run); where no rule
    named a cause, watching the tree over its stall window is what tells a slow step from a hang."""
    steps = causes.steps_after_stacks((*diagnosis.steps, *causes.NEXT_STEPS.get(diagnosis.cause, ())))
    if diagnosis.cause is Cause.UNKNOWN:
        steps = (
            f"Watch it over a stall window: `hangwatch attach --pid {pid} --window 120` follows every "
            "progress signal (log, CPU, I/O, GPU, ports) and takes stacks again when it goes quiet.",
            *steps,
        )
    # The tree is alive (a snapshot never stops it): PID is the culprit's, or the root's.
    return fit(steps, StepFacts(pid=diagnosis.culprits[0] if diagnosis.culprits else pid, port=None))


def kernel_lines(sample: KernelSample, ticks: list[Tick], exits: tuple[ExitRecord, ...]) -> list[str]:
    """The ``kernels:`` block of a snapshot: what each GPU runs, and what reading it cost."""

    def label(pid: int) -> str:
        return culprit_labels((pid,), ticks, exits)[0]

    found = kernel_evidence(sample, label)
    out = ["kernels:"]
    out += [f"  - {line}" for line in found] or ["  - none running on the GPUs of the processes read"]
    out += [f"  note: {n}" for n in kernel_notes(sample, label)]
    return out


def snapshot_text(
    pid: int,
    lines: list[str],
    diagnosis: causes.Diagnosis,
    culprits: tuple[str, ...] = (),
    steps: tuple[str, ...] = (),
) -> list[str]:
    out = [f"hangwatch stacks of the tree of pid {pid}:"]
    note = whole_machine_note(pid)
    if note is not None:
        out.append(f"  ({note})")
    out += [*lines, ""]
    confidence = f", {diagnosis.confidence} confidence" if diagnosis.confidence else ""
    out.append(f"cause: {diagnosis.cause.value}{confidence}")
    out.append(f"  {diagnosis.explanation}")
    if diagnosis.culprits:
        out.append(f"  culprits: {', '.join(culprits or tuple(f'[{p}]' for p in diagnosis.culprits))}")
    if diagnosis.rules:
        out.append(f"  decided by: {' > '.join(diagnosis.rules)}")
    if diagnosis.near:
        out.append("  closest rules (what each lacked):")
        out.extend(f"    - {m.describe()}" for m in diagnosis.near)
    if steps:
        out.append("next:")
        out.extend(f"  - {s}" for s in steps)
    return out
