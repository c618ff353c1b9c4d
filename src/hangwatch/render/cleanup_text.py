"""``hangwatch cleanup``'s plan (for --dry-run) and outcome as text."""

from __future__ import annotations

from hangwatch.model.cleanup import CleanupOutcome
from hangwatch.model.cleanup import CleanupPlan
from hangwatch.model.samples import ProcState
from hangwatch.redact import scrub
from hangwatch.words import human_bytes
from hangwatch.words import plural


def _mib(n: int | None) -> str:
    return human_bytes(n, "MiB", "MiB")


def plan_text(plan: CleanupPlan, grace_s: float) -> str:
    live = [m for m in plan.members if not m.ended]
    lines = [
        f"hangwatch cleanup --dry-run: {plan.target}: {plural(len(live), 'process')} would be stopped "
        "(nothing was changed)"
    ]
    for m in plan.members:
        zombie = " (zombie: already exited)" if m.ended else " (its main thread ended; other threads run)"
        stopped = " (stopped: SIGCONT after SIGTERM)"
        extra = {ProcState.STOPPED: stopped, ProcState.ZOMBIE: zombie}.get(m.state, "")
        lines.append(f"  pid {m.pid:>7}  ppid {m.ppid:>7}  {m.state}  {m.title}{extra}")
    session = f" and to its session's process group {plan.session}" if plan.session is not None else ""
    lines.append(f"  would send SIGTERM to each{session}, wait {grace_s:g} s, then SIGKILL what is left")
    for g in plan.gpu:
        lines.append(
            f"  GPU {g.gpu_index}: the tree holds {_mib(g.tree_bytes)} (GPU used {_mib(g.used_bytes)})"
        )
    if plan.gpu_note:
        lines.append(f"  {plan.gpu_note}")
    for s in plan.segments:
        lines.append(
            f"  shm {s.path} ({_mib(s.allocated_bytes)}): would be removed once no process maps it "
            f"(now: pid {', '.join(map(str, s.holders))})"
        )
    lines += [f"  note: {n}" for n in plan.notes]
    return scrub("\n".join(lines))


def outcome_text(outcome: CleanupOutcome) -> str:
    plan = outcome.plan
    stopped = len(outcome.terminated) + len(outcome.killed)
    head = (
        f"hangwatch cleanup: {plan.target}: stopped {plural(stopped, 'process')} in {outcome.seconds:.1f} s"
    )
    if outcome.killed:
        head += f" ({len(outcome.killed)} needed SIGKILL)"
    lines = [head]
    if outcome.remaining:
        lines.append(
            f"  REMAIN: pid {', '.join(map(str, outcome.remaining))} survived SIGKILL (uninterruptible in a "
            "driver call?): only a reboot or a GPU reset frees them"
        )
    for pid, parent in outcome.zombies:
        lines.append(
            f"  pid {pid} has exited; its parent {parent} has not reaped it yet (it holds nothing but its "
            "pid)"
        )
    for g in outcome.gpu:
        lines.append(
            f"  GPU {g.gpu_index}: tree memory {_mib(g.tree_before)} -> {_mib(g.tree_after)}; "
            f"GPU used {_mib(g.used_before)} -> {_mib(g.used_after)}"
        )
    if outcome.gpu_note:
        lines.append(f"  {outcome.gpu_note}")
    for s in outcome.segments:
        lines.append(
            f"  shm {s.path}: {s.action} ({_mib(s.allocated_bytes)}){': ' + s.reason if s.reason else ''}"
        )
    lines.append(
        f"  freed: {plural(stopped, 'process')}, {_mib(outcome.shm_freed_bytes)} of /dev/shm"
        + "".join(
            f", GPU {g.gpu_index} {_mib(g.tree_before - g.tree_after)}" for g in outcome.gpu if g.tree_before
        )
    )
    lines += [f"  note: {n}" for n in plan.notes]
    return scrub("\n".join(lines))
