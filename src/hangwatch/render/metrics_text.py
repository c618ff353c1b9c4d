"""The sidecar's reading as Prometheus text (exposition format 0.0.4), every name prefixed ``hangwatch_``.

Labels stay bounded, so that a scrape every 15 s for months does not grow the series: the reading and the
phase as 0/1 gauges over their known values, ranks as the engines spell them (``tp_rank``, ``pp_rank``,
``dp_rank``, ``ep_rank``, else ``rank``), GPUs as dcgm-exporter labels them (``gpu``, ``UUID``), never a
pid. docs/sidecar.md lists every series.
"""

from __future__ import annotations

import math
import re

from hangwatch.model.health import Health
from hangwatch.model.health import Reading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# gpustate.gpu_state's words: a spin is busy doing nothing (every pipe idle), as the stall rules read it.
GPU_STATES = ("working", "spinning", "idle", "unknown")

# "TP1", "DP0_TP1", "PP1-TP3": each group as its own label, as vLLM and SGLang name them in their own
# metrics; a bare number is torchrun's RANK.
_RANK_PART = re.compile(r"(DP|PP|TP|EP)[-_ ]?(\d+)", re.IGNORECASE)


def rank_labels(rank: str) -> dict[str, str]:
    parts = _RANK_PART.findall(rank)
    if parts:
        return {f"{kind.lower()}_rank": number for kind, number in parts}
    return {"rank": rank}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str) -> None:
        self.lines += [f"# HELP hangwatch_{name} {text}", f"# TYPE hangwatch_{name} {kind}"]

    def sample(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        number = repr(float(value)) if math.isfinite(value) else "NaN"
        self.lines.append(f"hangwatch_{name}{_labels(labels or {})} {number}")


def metrics_text(health: Health | None, now_wall: float) -> str:
    """The whole exposition for one scrape."""
    out = _Text()
    out.family("up", "gauge", "1 while hangwatch has a current reading of the tree it watches")
    fresh = health is not None and health.problem is None
    out.sample("up", 1.0 if fresh else 0.0)
    reading = health.reading if health is not None else Reading.WAITING
    out.family("state", "gauge", "the reading of the tree: 1 for the current one (progressing, ready, ...)")
    for r in Reading:
        out.sample("state", 1.0 if r is reading else 0.0, {"state": r.value})
    if health is None:
        return "\n".join(out.lines) + "\n"
    out.family("reading_age_seconds", "gauge", "seconds since the watch last read the tree")
    out.sample("reading_age_seconds", max(0.0, now_wall - health.updated_wall))
    out.family("serving", "gauge", "1 once the engine's readiness rule held: it serves")
    out.sample("serving", 1.0 if health.serving else 0.0)
    phases = dict(health.phases)
    out.family("phase", "gauge", "the start-up phase the tree is in: 1 for the current one")
    for name in dict.fromkeys([*phases, health.phase]):
        out.sample("phase", 1.0 if name == health.phase else 0.0, {"phase": name})
    out.family("phase_duration_seconds", "gauge", "how long each phase lasted (the current one: so far)")
    for name, seconds in phases.items():
        out.sample("phase_duration_seconds", seconds, {"phase": name})
    if health.last_progress_wall is not None:
        out.family("last_progress_timestamp_seconds", "gauge", "Unix time of the last sign of progress")
        out.sample("last_progress_timestamp_seconds", health.last_progress_wall)
    out.family("quiet_seconds", "gauge", "seconds since the last sign of progress (spins discounted)")
    out.sample("quiet_seconds", health.quiet_s)
    if health.time_to_stall_s is not None:
        out.family("time_to_stall_seconds", "gauge", "seconds of quiet left before a stall verdict (booting)")
        out.sample("time_to_stall_seconds", health.time_to_stall_s)
    if health.probe_green is not None:
        out.family("readiness_probe_green", "gauge", "1 when the engine's readiness probe last answered 2xx")
        out.sample("readiness_probe_green", 1.0 if health.probe_green else 0.0)
    out.family("stalls_total", "counter", "stall verdicts (a new one each time the tree stalls again)")
    out.sample("stalls_total", health.stalls)
    out.family("recoveries_total", "counter", "stalls that ended: the tree progressed again")
    out.sample("recoveries_total", health.recoveries)
    out.family("verdicts_total", "counter", "verdicts reached, by state")
    for state, n in health.verdicts:
        out.sample("verdicts_total", n, {"state": state})
    out.family("stack_captures_total", "counter", "stack captures taken of the tree")
    out.sample("stack_captures_total", health.captures)
    out.family("stack_capture_seconds_total", "counter", "time spent capturing stacks (each pauses them)")
    out.sample("stack_capture_seconds_total", health.capture_s)
    if health.gpus:
        out.family("gpu_state", "gauge", "each GPU the tree holds, as the rules judge it: 1 for its state")
        for index, uuid, state in health.gpus:
            for name in GPU_STATES:
                labels = {"gpu": str(index), "UUID": uuid, "state": name}
                out.sample("gpu_state", 1.0 if name == state else 0.0, labels)
    if health.culprit_ranks:
        out.family("culprit", "gauge", "1 for each rank the standing verdict names as the culprit")
        for rank in health.culprit_ranks:
            out.sample("culprit", 1.0, rank_labels(rank))
    return "\n".join(out.lines) + "\n"
