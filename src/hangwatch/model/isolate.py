"""``hangwatch isolate``: the changes tried (edits, toggles), each trial's runs, and the conclusion.

The JSON contract (schema ``hangwatch.isolate/1``) is these dataclasses serialised as they are:
``baseline`` and every entry of ``trials`` are a ``TrialResult`` (``edits``, ``verdict``: the object of
``hangwatch.report/1``, ``runs``: each run's verdict), ``conclusion`` a ``Conclusion``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import Confidence
from hangwatch.model.vocabulary import State

ISOLATE_SCHEMA = "hangwatch.isolate/1"
BASELINE = "baseline"


class EditKind(StrEnum):
    REMOVE = (
        "remove"  # an argument and its value (``--flag v``, ``--flag=v``); ``--prefix-*``: every such flag
    )
    REPLACE = "replace"  # a flag's value, the flag added when absent
    ADD = "add"  # one argument, appended (nothing to do when already there)
    ENV = "env"  # set an environment variable
    UNSET_ENV = "unset_env"  # remove an environment variable


@dataclass(frozen=True)
class Edit:
    kind: EditKind
    name: str  # the flag, the argument (add) or the variable
    value: str | None = None  # replace and env
    aliases: tuple[str, ...] = ()  # other spellings of the same flag (``-tp`` for ``--tensor-parallel-size``)

    def describe(self) -> str:
        if self.kind is EditKind.REMOVE:
            return f"remove {self.name}"
        if self.kind is EditKind.REPLACE:
            return f"{self.name} {self.value}"
        if self.kind is EditKind.ADD:
            return f"add {self.name}"
        if self.kind is EditKind.ENV:
            return f"{self.name}={self.value}"
        return f"unset {self.name}"


@dataclass(frozen=True)
class Toggle:
    """One change to try: a name, its edits, and in words what it turns off or on."""

    name: str
    edits: tuple[Edit, ...]
    why: str = ""  # "speculative decoding off"
    # The baseline causes that make this toggle the most informative to try first.
    suggested_by: tuple[Cause, ...] = ()

    def describe(self) -> str:
        return ", ".join(e.describe() for e in self.edits)


@dataclass(frozen=True)
class TrialResult:
    """One trial: the baseline (no edits) or the baseline with one toggle (two with ``--pairs``)."""

    index: int  # 0 for the baseline
    name: str  # "baseline", a toggle's name, "a+b" for a pair
    toggles: tuple[str, ...]  # the toggles it combines (empty for the baseline)
    why: str  # what the change means, in words
    edits: tuple[Edit, ...]
    command: tuple[str, ...]  # as launched (redacted)
    verdict: Verdict  # the trial's outcome: its first failure when any run failed, else its first run
    runs: tuple[Verdict, ...]  # every run's verdict, in order
    durations_s: tuple[float, ...]  # each run's time to verdict
    run_dirs: tuple[str, ...]  # each run's own log and report
    booted: int  # runs whose verdict is ready
    repeat: int  # runs asked for; fewer in ``runs`` when the budget or Ctrl-C cut it short
    culprits: tuple[str, ...] = ()  # the culprits of ``verdict`` as "name [pid] role/rank"
    overheads_s: tuple[float, ...] = ()  # per run: wall time outside the program's own boot (wait, clean-up)
    notes: tuple[str, ...] = ()  # the port that stayed busy, processes clean-up could not stop, ...

    @property
    def done(self) -> int:
        return len(self.runs)

    @property
    def complete(self) -> bool:
        return self.done >= self.repeat

    @property
    def all_booted(self) -> bool:
        return self.done > 0 and self.booted == self.done

    @property
    def none_booted(self) -> bool:
        return self.done > 0 and self.booted == 0

    def outcome(self) -> str:
        """``ready``, ``stalled`` for one run; ``2 of 3 booted`` when repeated."""
        if self.repeat == 1 and self.done == 1:
            return self.verdict.state.value
        states = sorted({v.state.value for v in self.runs if v.state is not State.READY})
        failed = f" ({', '.join(states)})" if states else ""
        return f"{self.booted} of {self.done} booted{failed}"


@dataclass(frozen=True)
class Conclusion:
    culprit_toggles: tuple[str, ...]  # the toggles that alone turn the baseline's failure into ready
    confidence: Confidence  # NONE: inconclusive, or nothing to isolate
    summary: str  # one sentence
    minimal_changes: tuple[str, ...] = ()  # the trials (single or pairs) that boot every time
    p_value: float | None = None  # Fisher's exact test, one-sided, of the best change against the baseline
    runs_to_settle: int | None = None  # runs per side that would settle it, if the rates seen so far hold
    details: tuple[str, ...] = ()  # one line per toggle compared with the baseline


@dataclass(frozen=True)
class IsolateReport:
    schema: str
    engine: str
    command: tuple[str, ...]  # the baseline, redacted
    started_at: str
    duration_s: float
    run_dir: str
    repeat: int
    budget_s: float | None
    stopped: str  # why isolate stopped: "a change made it boot", "every trial ran", "budget spent", ...
    baseline: TrialResult | None
    trials: tuple[TrialResult, ...]
    not_run: tuple[str, ...]  # toggles planned and not run (budget, early stop, Ctrl-C)
    conclusion: Conclusion
    notes: tuple[str, ...] = ()
    interrupted: bool = False


@dataclass(frozen=True)
class RunResult:
    """What one run of a trial left: its verdict, and where to read the rest."""

    verdict: Verdict
    duration_s: float  # the program's own time to a verdict (launch to verdict)
    run_dir: str
    culprits: tuple[str, ...]
    overhead_s: float  # wall time of the run outside that: the port wait, the launch, the tear-down
    notes: tuple[str, ...] = ()
