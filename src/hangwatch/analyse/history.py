"""Phase history, decided: the key of a boot from what a run knows, which of its phases go into the history,
the usual range of a phase (``model.history.USUAL_RULE``), and this boot against it.

Pure: the command line, the report and the facts ``supervise/history.py`` read (the model's size on disk,
the compile caches, the host name) come in; nothing here reads a file or the database.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from pathlib import PurePath

from hangwatch.engines.profile import flag_value
from hangwatch.engines.profile import has_flag
from hangwatch.engines.profile import int_flag
from hangwatch.engines.registry import boot_flags
from hangwatch.model.history import AUTO_FACTOR
from hangwatch.model.history import AUTO_FLOOR_S
from hangwatch.model.history import AUTO_MARGIN_S
from hangwatch.model.history import AUTO_MIN_BOOTS
from hangwatch.model.history import RECENT_BOOTS
from hangwatch.model.history import TRIM_FROM
from hangwatch.model.history import BootKey
from hangwatch.model.history import BootRecord
from hangwatch.model.history import HistoryComparison
from hangwatch.model.history import PastBoots
from hangwatch.model.history import PhaseDuration
from hangwatch.model.history import PhaseHistory
from hangwatch.model.history import PhaseHistoryLine
from hangwatch.model.history import PhaseWindow
from hangwatch.model.history import Standing
from hangwatch.model.report import Report
from hangwatch.model.samples import Tick
from hangwatch.redact import scrub

READY = "ready"  # the phase a boot enters once ready (analyse/assess.py): serving, not booting

_SWITCH_VALUE_CHARS = 60  # a --compilation-config JSON can be long: its start tells configurations apart

# A phase outside its usual range by more than this is "longer"/"shorter": phases are timed by the tick
# (one second by default), so a second either way is the clock's, not the boot's.
MARGIN_S = 1.0
MARGIN_SHARE = 0.10

_INTERPRETERS = ("python", "pypy", "bash", "sh", "env", "uv", "torchrun", "deepspeed", "accelerate")
_SCRIPTS = (".py", ".sh")


def model_of(command: Sequence[str]) -> str | None:
    """What the command serves: ``--model`` / ``--model-path``, or ``vllm serve M``; as written."""
    value = flag_value(list(command), "--model") or flag_value(list(command), "--model-path")
    if value is None and "serve" in command:
        after = command[list(command).index("serve") + 1 :]
        value = after[0] if after and not after[0].startswith("-") else None
    return value or None


def program_of(command: Sequence[str]) -> str | None:
    """What a command that names no model runs: its script (absolute), ``-m module``, else its program."""
    for i, arg in enumerate(command):
        if arg in ("-m", "-c") and i + 1 < len(command):
            # One line: a ``-c`` program's newlines would break every one-line rendering of the key.
            return f"{arg} {' '.join(scrub(command[i + 1]).split())[:_SWITCH_VALUE_CHARS]}"
        if arg.endswith(_SCRIPTS) and not arg.startswith("-"):
            return str(Path(arg).absolute())  # the cwd's, not the disk's: no file is read
    for arg in command:
        name = PurePath(arg).name
        if "=" in arg or arg.startswith("-") or name.startswith(_INTERPRETERS):
            continue
        return name
    return PurePath(command[0]).name if command else None


def parallel_sizes(command: Sequence[str], engine: str) -> tuple[int, int, int, int]:
    """TP, PP, DP, EP as the command line sets them (1 where it does not; engines/bootflags.py)."""
    argv = tuple(command)
    flags = boot_flags(engine)
    tp, pp, dp, ep = (
        max(1, int_flag(argv, *f)) if f else 1 for f in (flags.tp, flags.pp, flags.dp, flags.ep)
    )
    if flags.ep_over_tp_dp and has_flag(argv, *flags.ep_over_tp_dp):
        ep = tp * dp
    return tp, pp, dp, ep


def switches_of(command: Sequence[str], engine: str) -> tuple[str, ...]:
    """The boot-changing switches given, sorted: ``("attention-backend=FLASHINFER", "enforce-eager")``."""
    argv = tuple(command)
    out = set()
    for flag, takes_value in boot_flags(engine).switches:
        name = flag.lstrip("-")
        if takes_value:
            value = flag_value(argv, flag)
            if value is not None:
                out.add(f"{name}={scrub(value)[:_SWITCH_VALUE_CHARS]}")
        elif has_flag(argv, flag):
            out.add(name)
    return tuple(sorted(out))


def engine_version(engine: str, environment: Mapping[str, str]) -> str | None:
    for name in boot_flags(engine).versions:
        if name in environment:
            return environment[name]
    return None


def gpus_of(timeline: Sequence[Tick]) -> tuple[str | None, int]:
    """The GPU model and count NVML saw at the latest tick it answered; (None, 0) without NVML."""
    for tick in reversed(timeline):
        if tick.gpu is not None and tick.gpu.gpus:
            names = Counter(g.name for g in tick.gpu.gpus)
            return " + ".join(names), len(tick.gpu.gpus)
    return None, 0


def launch_key(command: Sequence[str], engine: str, *, model: str | None, host: str) -> BootKey:
    """What a boot's key says before it starts (the command line, the host): enough to find comparable
    boots (``comparable``); the version, GPUs, model size and caches are read at its end (``boot_key``)."""
    tp, pp, dp, ep = parallel_sizes(command, engine)
    return BootKey(
        engine=engine,
        engine_version=None,
        model=scrub(model) if model else None,
        model_bytes=None,
        program=None if model else program_of(command),
        tp=tp,
        pp=pp,
        dp=dp,
        ep=ep,
        switches=switches_of(command, engine),
        gpu_model=None,
        gpu_count=0,
        host=host,
        caches_warm=False,
    )


def boot_key(
    report: Report,
    command: Sequence[str],
    *,
    model: str | None,
    model_bytes: int | None,
    host: str,
    caches_warm: bool,
) -> BootKey:
    """The key of this boot. ``model`` as supervise/history.py resolved it (a local folder made absolute)."""
    gpu_model, gpu_count = gpus_of(report.timeline)
    return replace(
        launch_key(command, report.engine, model=model, host=host),
        engine_version=engine_version(report.engine, report.environment),
        model_bytes=model_bytes,
        gpu_model=gpu_model,
        gpu_count=gpu_count,
        caches_warm=caches_warm,
    )


def _durations(report: Report) -> list[tuple[str, float, bool]]:
    """(phase, seconds, finished) of this boot, up to ready (or to the phase it stopped in), in order; a
    phase entered twice counts once, its times added."""
    spans = list(report.phases)
    ready_at = next((i for i, s in enumerate(spans) if s.name == READY), None)
    finished = len(spans) - 1 if ready_at is None else ready_at
    out: dict[str, tuple[float, bool]] = {}
    for i, span in enumerate(spans[: finished + 1] if ready_at is None else spans[:ready_at]):
        end = span.end if span.end is not None else report.duration_s
        before, _ = out.get(span.name, (0.0, True))
        out[span.name] = (before + max(0.0, end - span.start), i < finished)
    return [(name, round(seconds, 3), done) for name, (seconds, done) in out.items()]


def recordable(report: Report) -> tuple[PhaseDuration, ...]:
    """The phases this boot adds to the history: the healthy durations only. Every phase before ready;
    for a boot that never became ready (a stall, a crash, a timeout, Ctrl-C) the phases it finished, not
    the one it stopped in (a hang's duration is not how long that phase takes)."""
    quiet: dict[str, float] = {}
    for span in report.phases:
        if span.quiet_s is not None:
            quiet[span.name] = max(quiet.get(span.name, 0.0), span.quiet_s)
    return tuple(PhaseDuration(name, s, quiet.get(name)) for name, s, done in _durations(report) if done)


def boot_record(report: Report) -> BootRecord:
    return BootRecord(report.started_at, report.verdict.state.value, report.mode, recordable(report))


def usual(phase: str, durations: Sequence[float]) -> PhaseHistory:
    """The usual range of a phase from its durations, the most recent first (``USUAL_RULE``)."""
    recent = sorted(durations[:RECENT_BOOTS])
    kept = recent[1:-1] if len(recent) >= TRIM_FROM else recent
    return PhaseHistory(
        phase=phase,
        lo_s=kept[0],
        hi_s=kept[-1],
        boots=len(recent),
        recorded=len(durations),
        last_s=durations[0] if durations else None,
    )


def standing(seconds: float, range_: PhaseHistory, finished: bool) -> Standing:
    """Longer or shorter than usual by more than the tick's margin; a phase not finished cannot be shorter."""
    margin = max(MARGIN_S, MARGIN_SHARE * range_.hi_s)
    if seconds > range_.hi_s + margin:
        return Standing.LONGER
    if finished and seconds < range_.lo_s - max(MARGIN_S, MARGIN_SHARE * range_.lo_s):
        return Standing.SHORTER
    return Standing.WITHIN


def compare(report: Report, key: BootKey, past: PastBoots | None, *, recorded: bool) -> HistoryComparison:
    """This boot's phases against the boots before it (``past``, read before this one was added)."""
    lines = []
    for name, seconds, done in _durations(report):
        values = past.durations.get(name) if past is not None else None
        if not values:
            continue
        range_ = usual(name, values)
        lines.append(PhaseHistoryLine(name, seconds, done, range_, standing(seconds, range_, done)))
    return HistoryComparison(
        key_id=key.key_id,
        key=key,
        earlier_boots=past.boots if past is not None else 0,
        lines=tuple(lines),
        recorded=recorded,
    )


def listing_phases(past: PastBoots) -> tuple[PhaseHistory, ...]:
    """Each phase of a configuration with its usual range, for ``hangwatch history``."""
    return tuple(usual(name, values) for name, values in past.durations.items() if values)


# What two configurations must share for one's quiet spells to set the other's windows: what the boot does
# and where; its version, GPUs and warm caches may differ (the longest spell of all is taken).
_COMPARABLE = ("engine", "model", "program", "tp", "pp", "dp", "ep", "switches", "host")


def comparable(a: BootKey, b: BootKey) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in _COMPARABLE)


def auto_windows(pasts: Sequence[PastBoots]) -> tuple[PhaseWindow, ...]:
    """Each boot phase's stall window from the quiet spells of comparable configurations' recent boots
    (``AUTO_RULE``); only phases with ``AUTO_MIN_BOOTS`` boots that knew their spells."""
    spells: dict[str, list[float]] = {}
    for past in pasts:
        for phase, recent in past.quiet.items():
            spells.setdefault(phase, []).extend(recent[:RECENT_BOOTS])
    out = []
    for phase, seen in spells.items():
        if phase == READY or len(seen) < AUTO_MIN_BOOTS:
            continue
        longest = max(seen)
        window = max(AUTO_FLOOR_S, AUTO_FACTOR * longest + AUTO_MARGIN_S)
        out.append(PhaseWindow(phase, round(window, 1), round(longest, 1), len(seen)))
    return tuple(out)


def pooled_usual(pasts: Sequence[PastBoots]) -> tuple[PhaseHistory, ...]:
    """Each phase's usual duration over comparable configurations' boots (the most recently booted
    configuration's first), for the live view before this boot's own key is known."""
    durations: dict[str, list[float]] = {}
    for past in pasts:
        for phase, values in past.durations.items():
            durations.setdefault(phase, []).extend(values)
    return tuple(usual(phase, values) for phase, values in durations.items() if values and phase != READY)
