"""Evidence in plain words, from the ticks of the window the verdict covers."""

from __future__ import annotations

from collections.abc import Sequence

from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ProcState
from hangwatch.model.samples import Tick
from hangwatch.redact import redact_text
from hangwatch.words import human_bytes
from hangwatch.words import plural

# A process is named in the evidence when it used more CPU than this over the quiet spell, or is in a
# state other than asleep: the rest of a large tree is one summary line.
CPU_SAID_S = 0.5
# GPU memory that moved less than this over the spell reads "flat" (allocator noise is a few MiB; the
# progress model's own threshold for GPU memory as progress is progress.GPU_MEM_DELTA_MIN).
GPU_MEMORY_FLAT_BYTES = 16 << 20


def window_evidence(
    window: Sequence[Tick], quiet_s: float, last_probe: ProbeResult | None, waiting_line: str | None
) -> list[str]:
    """``log silent 60 s; 4 processes: +0.0 s CPU, +0 B I/O, state S; ...``."""
    if not window:
        return []
    out: list[str] = []
    # Lines said again with other counts reach a verdict only once the stacks showed their writer in
    # place: a wait that logs, worded with the engines' own "still waiting" lines.
    waiting = sum(t.log.waiting_lines + t.log.heartbeat_lines for t in window)
    if waiting and waiting_line:
        out.append(
            f"log: only 'still waiting' lines for {quiet_s:.0f} s "
            f"({waiting}x: {redact_text(waiting_line)[:160]})"
        )
    else:
        out.append(f"log silent {quiet_s:.0f} s")
    last = window[-1]
    cpu: dict[int, float] = {}
    io: dict[int, int] = {}
    for tick in window[1:]:
        for p in tick.processes:
            cpu[p.pid] = cpu.get(p.pid, 0.0) + p.cpu_delta_s
            io[p.pid] = io.get(p.pid, 0) + p.io_delta_bytes
    states = sorted({p.state for p in last.processes})
    total_cpu = sum(cpu.values())
    total_io = sum(io.values())
    out.append(
        f"{plural(len(last.processes), 'process')}: +{total_cpu:.1f} s CPU, +{human_bytes(total_io)} I/O, "
        f"state {'/'.join(states) or '-'}"
    )
    for p in last.processes:
        if cpu.get(p.pid, 0.0) > CPU_SAID_S or p.state not in (ProcState.SLEEPING, ProcState.IDLE):
            out.append(
                f"  {p.name} [{p.pid}]: state {p.state}, +{cpu.get(p.pid, 0.0):.1f} s CPU, "
                f"+{human_bytes(io.get(p.pid, 0))} I/O"
            )
    unreadable = [p for p in last.processes if p.io_error]
    if unreadable:
        out.append(f"I/O unreadable for {plural(len(unreadable), 'process')}: {unreadable[0].io_error}")
    if last_probe is not None:
        out.append(f"probe {last_probe.url}: {last_probe.describe()}")
    out.extend(gpu_evidence(window))
    return out


def gpu_evidence(window: Sequence[Tick]) -> list[str]:
    samples = [t.gpu for t in window if t.gpu is not None]
    if not samples:
        return []
    if samples[-1].unavailable:
        return []  # said once in the report's notes, not in every verdict
    out = []
    indices = sorted({g.index for s in samples for g in s.gpus})
    for index in indices:
        readings = [g for s in samples for g in s.gpus if g.index == index]
        utils = [g.util_pct for g in readings if g.util_pct is not None]
        mems = [g.mem_used_bytes for g in readings if g.mem_used_bytes is not None]
        powers = [g.power_w for g in readings if g.power_w is not None]
        parts = [f"GPU {index}"]
        if utils:
            parts.append(f"util {min(utils):.0f}-{max(utils):.0f} %")
        if mems:
            flat = max(mems) - min(mems) < GPU_MEMORY_FLAT_BYTES
            parts.append(f"memory {'flat at ' if flat else ''}{human_bytes(mems[-1])}")
        if powers:
            parts.append(f"power {min(powers):.0f}-{max(powers):.0f} W")
        out.append(", ".join(parts))
    errors = {s.error for s in samples if s.error}
    if errors:
        out.append("NVML errors: " + "; ".join(sorted(errors))[:200])
    return out
