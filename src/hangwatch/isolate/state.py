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
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import Confidence
from hangwatch.model.vocabulary import State
from hangwatch.redact import redact_argv
from hangwatch.render.files import write_atomically
from hangwatch.render.json_report import json_text
from hangwatch.render.json_report import plain

STATE_SCHEMA = "hangwatch.isolate-state/1"
STATE_FILE = "isolate-state.json"


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

    @staticmethod
    def key(name: str, edits: tuple[Edit, ...]) -> str:
        return f"{name} {edits_key(edits)}"

    def done(self, name: str, edits: tuple[Edit, ...]) -> list[RunResult]:
        return list(self.runs.get(self.key(name, edits), []))

    def add(self, name: str, edits: tuple[Edit, ...], run: RunResult) -> None:
        self.runs.setdefault(self.key(name, edits), []).append(run)
        self.save()

    def save(self) -> None:
        redacted = redact_argv(self.command)
        data = {
            "schema": STATE_SCHEMA,
            "command": list(redacted),
            "command_complete": tuple(redacted) == self.command,
            "fingerprint": fingerprint(self.command),
            "repeat": self.repeat,
            "started_at": self.started_at,
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
        )
    except UsageError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--resume {directory}: {STATE_FILE} cannot be read: {exc}") from None
    return state
