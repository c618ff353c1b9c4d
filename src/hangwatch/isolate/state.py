"""``isolate-state.json`` in the isolate run directory: every finished run, written as it finishes.

``--resume DIR`` reads it back and runs only what is missing. A run is reused for a trial of the same
name and the same edits (a toggle changed in the matrix since is run again). The command is kept only
when it holds nothing that redaction would hide; otherwise it must be given again, and it must be the
same one (its SHA-256 is kept).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from hangwatch.errors import UsageError
from hangwatch.model.isolate import Edit
from hangwatch.model.isolate import EditKind
from hangwatch.model.isolate import RunResult
from hangwatch.model.isolate import Toggle
from hangwatch.model.report import Verdict
from hangwatch.model.rulebook import NearMiss
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import Confidence
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.render.files import write_atomically
from hangwatch.render.json_report import json_text
from hangwatch.render.json_report import plain

STATE_SCHEMA = "hangwatch.isolate-state/1"
STATE_FILE = "isolate-state.json"


# The options kept in the state, by argparse dest, with the flag that gives each. Those --resume must not
# change (a run's supervision, what is tried) are refused when given otherwise; --repeat and --budget
# may be given anew (more runs to settle an inconclusive trial; this invocation's time).
OPTION_FLAGS = {
    "stall_after": "--stall-after",
    "timeout": "--timeout",
    "ready_url": "--ready-url",
    "ready_pattern": "--ready-pattern",
    "waiting_pattern": "--waiting-pattern",
    "interval": "--interval",
    "probe_timeout": "--probe-timeout",
    "engine": "--engine",
    "no_stacks": "--no-stacks",
    "grace": "--grace",
    "run_all": "--all",
    "pairs": "--pairs",
    "budget": "--budget",
}
MAY_CHANGE = frozenset({"budget"})


def shown(dest: str, value: Any) -> str:
    """An option as it is written on the command line: ``--stall-after 5``, ``--all``, ``no --timeout``."""
    flag = OPTION_FLAGS[dest]
    if value is None or value is False or value == []:
        return f"no {flag}"
    if value is True:
        return flag
    if isinstance(value, list):
        return " ".join(f"{flag} {v!r}" for v in value)
    if isinstance(value, float):
        return f"{flag} {value:g}"
    return f"{flag} {value!r}" if isinstance(value, str) and " " in value else f"{flag} {value}"


def resumed_options(
    directory: Path, saved: dict[str, Any], given: dict[str, Any], defaults: dict[str, Any]
) -> dict[str, Any]:
    """The options a resumed isolate runs with: the saved ones; ``given`` (the options on this command
    line) must agree with them, or it is refused with one line saying which, both values and what to do.
    An option the saved run did not have (a newer hangwatch) takes ``defaults``."""
    merged = {dest: saved.get(dest, defaults.get(dest)) for dest in OPTION_FLAGS}
    for dest, value in given.items():
        if dest in MAY_CHANGE:
            merged[dest] = value
        elif dest in merged and value != merged[dest]:
            flag = OPTION_FLAGS[dest]
            raise UsageError(
                f"--resume {directory}: {shown(dest, value)} given, but that isolate ran with "
                f"{shown(dest, merged[dest])}: leave {flag} out to resume as it ran, or start a new isolate "
                f"(another --run-dir) with {shown(dest, value)}"
            )
    return merged


def fingerprint(command: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps(list(command)).encode()).hexdigest()


def edits_key(edits: tuple[Edit, ...]) -> str:
    return json.dumps([[e.kind.value, e.name, e.value, list(e.aliases)] for e in edits])


@dataclass
class IsolateState:
    path: Path
    command: tuple[str, ...]
    repeat: int
    toggles: tuple[Toggle, ...]
    runs: dict[str, list[RunResult]] = field(default_factory=dict)  # by trial key
    started_at: str = ""
    # Every option that shapes a run or the search (OPTION_FLAGS), as given the first time; None for a
    # state file written before they were kept.
    options: dict[str, Any] | None = None

    @staticmethod
    def key(name: str, edits: tuple[Edit, ...]) -> str:
        return f"{name} {edits_key(edits)}"

    def done(self, name: str, edits: tuple[Edit, ...]) -> list[RunResult]:
        return list(self.runs.get(self.key(name, edits), []))

    def add(self, name: str, edits: tuple[Edit, ...], run: RunResult) -> None:
        self.runs.setdefault(self.key(name, edits), []).append(run)
        self.save()

    def command_complete(self) -> bool:
        """The command is kept whole (nothing in it that redaction hides): --resume DIR needs no command."""
        return tuple(redact_argv(self.command)) == self.command

    def save(self) -> None:
        redacted = redact_argv(self.command)
        data = {
            "schema": STATE_SCHEMA,
            "command": list(redacted),
            "command_complete": tuple(redacted) == self.command,
            "fingerprint": fingerprint(self.command),
            "repeat": self.repeat,
            "started_at": self.started_at,
            "options": self.options,
            "toggles": [plain(_toggle_dict(t)) for t in self.toggles],
            "runs": {k: [plain(_run_dict(r)) for r in v] for k, v in self.runs.items()},
        }
        write_atomically(self.path, json_text(data))


def _toggle_dict(t: Toggle) -> dict[str, Any]:
    return {
        "name": t.name,
        "why": t.why,
        "suggested_by": [c.value for c in t.suggested_by],
        "edits": [
            {"kind": e.kind.value, "name": e.name, "value": e.value, "aliases": list(e.aliases)}
            for e in t.edits
        ],
    }


def _run_dict(r: RunResult) -> dict[str, Any]:
    v = r.verdict
    return {
        "verdict": {
            "state": v.state.value,
            "cause": v.cause.value if v.cause else None,
            "phase": v.phase,
            "summary": v.summary,
            "culprits": list(v.culprits),
            "evidence": list(v.evidence),
            "next_steps": list(v.next_steps),
            "confidence": v.confidence,
            "decided_by": list(v.decided_by),
            "near_misses": [{"rule": m.rule, "met": m.met, "lacked": m.lacked} for m in v.near_misses],
        },
        "duration_s": r.duration_s,
        "run_dir": r.run_dir,
        "culprits": list(r.culprits),
        "overhead_s": r.overhead_s,
        "notes": list(r.notes),
    }


def verdict_from(d: dict[str, Any]) -> Verdict:
    return Verdict(
        state=State(d["state"]),
        cause=Cause(d["cause"]) if d.get("cause") else None,
        phase=d.get("phase"),
        summary=d.get("summary", ""),
        culprits=tuple(d.get("culprits", ())),
        evidence=tuple(d.get("evidence", ())),
        next_steps=tuple(d.get("next_steps", ())),
        confidence=Confidence(d["confidence"]) if d.get("confidence") else None,
        decided_by=tuple(d.get("decided_by", ())),
        near_misses=tuple(
            NearMiss(str(m.get("rule", "")), int(m.get("met", 0)), str(m.get("lacked", "")))
            for m in d.get("near_misses", ())
            if isinstance(m, dict)
        ),
    )


def _run_from(d: dict[str, Any]) -> RunResult:
    return RunResult(
        verdict=verdict_from(d["verdict"]),
        duration_s=float(d["duration_s"]),
        run_dir=str(d["run_dir"]),
        culprits=tuple(d.get("culprits", ())),
        overhead_s=float(d.get("overhead_s", 0.0)),
        notes=tuple(d.get("notes", ())),
    )


def _toggle_from(d: dict[str, Any]) -> Toggle:
    return Toggle(
        name=d["name"],
        edits=tuple(
            Edit(EditKind(e["kind"]), e["name"], e.get("value"), tuple(e.get("aliases", ())))
            for e in d["edits"]
        ),
        why=d.get("why", ""),
        suggested_by=tuple(Cause(c) for c in d.get("suggested_by", ())),
    )


def load_state(directory: Path, command: tuple[str, ...] | None) -> IsolateState:
    """The state of an interrupted ``isolate`` in ``directory``; ``command`` is the one given now (if any)."""
    path = directory / STATE_FILE
    if not path.is_file():
        raise UsageError(
            f"--resume {directory}: no {STATE_FILE} there",
            "Give the --run-dir of an earlier `hangwatch isolate` (it says where it writes at the start).",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != STATE_SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, not {STATE_SCHEMA}")
        stored = tuple(str(a) for a in data["command"])
        if command is None:
            if not data.get("command_complete"):
                raise UsageError(
                    f"--resume {directory}: the command held secrets, so it was not kept",
                    "Give the same command again after `--`.",
                )
            command = stored
        elif fingerprint(command) != data["fingerprint"]:
            raise UsageError(
                f"--resume {directory}: that run was for another command ({' '.join(stored)})",
                "Give the same command, or leave it out to reuse the one kept there.",
            )
        state = IsolateState(
            path=path,
            command=command,
            repeat=int(data["repeat"]),
            toggles=tuple(_toggle_from(t) for t in data["toggles"]),
            runs={k: [_run_from(r) for r in v] for k, v in data["runs"].items()},
            started_at=str(data.get("started_at", "")),
            options=dict(data["options"]) if isinstance(data.get("options"), dict) else None,
        )
    except UsageError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--resume {directory}: {STATE_FILE} cannot be read: {exc}") from None
    return state
