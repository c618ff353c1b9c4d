"""From the trials to a conclusion: which change turns the failure into ``ready``, and how sure that is.

Each trial is k of N booted. A toggle is compared with the baseline by Fisher's exact test, one-sided:
the chance of seeing at least that many boots with the toggle if booting did not depend on it at all.

* Named the culprit, confidence **high**: every run with the toggle booted and p <= 0.05 (3 of 3 against
  0 of 3 gives p = 0.05).
* Named, confidence **medium**: every run with it booted, every baseline run failed, but too few runs for
  p <= 0.05 (1 against 1 gives p = 0.5): right when the failure is deterministic, which the baseline's
  own runs are the only evidence of; ``--repeat 3`` settles it.
* Otherwise **inconclusive**, with the counts, p, and how many runs each would settle it if the rates seen
  so far held (the smallest equal number of runs for which they would give p <= 0.05).
"""

from __future__ import annotations

from math import comb

from hangwatch.model.isolate import Conclusion
from hangwatch.model.isolate import TrialResult
from hangwatch.model.vocabulary import Confidence
from hangwatch.model.vocabulary import State

SIGNIFICANT = 0.05
MAX_RUNS_TO_SETTLE = 100


def fisher_one_sided(booted_with: int, runs_with: int, booted_without: int, runs_without: int) -> float:
    """P(at least ``booted_with`` boots among the ``runs_with`` runs with the change), every arrangement
    of the boots seen over all the runs being equally likely (hypergeometric)."""
    total = runs_with + runs_without
    boots = booted_with + booted_without
    if runs_with == 0 or runs_without == 0:
        return 1.0
    ways = comb(total, runs_with)
    tail = sum(
        comb(boots, x) * comb(total - boots, runs_with - x)
        for x in range(booted_with, min(boots, runs_with) + 1)
    )
    return tail / ways


def runs_to_settle(booted_with: int, runs_with: int, booted_without: int, runs_without: int) -> int | None:
    """Runs each side that would give p <= 0.05 if the boot rates seen so far held; None when they are
    the same rate (or the change boots less): no number of runs would name it."""
    if runs_with == 0 or runs_without == 0:
        return None
    rate_with = booted_with / runs_with
    rate_without = booted_without / runs_without
    if rate_with <= rate_without:
        return None
    for m in range(max(runs_with, runs_without, 2), MAX_RUNS_TO_SETTLE + 1):
        a = round(rate_with * m)
        b = round(rate_without * m)
        if a > b and fisher_one_sided(a, m, b, m) <= SIGNIFICANT:
            return m
    return MAX_RUNS_TO_SETTLE + 1


def _p(value: float) -> str:
    return f"p = {value:.3g}"


def _counts(trial: TrialResult, baseline: TrialResult) -> str:
    return f"{trial.booted} of {trial.done} booted with it, {baseline.booted} of {baseline.done} without"


def baseline_words(baseline: TrialResult) -> str:
    """How the baseline fails: "the baseline stalled (cuda-graph-capture) in phase cuda_graph, culprit X"."""
    v = baseline.verdict
    words = f"the baseline {v.state.value}"
    if v.cause is not None:
        words += f" ({v.cause.value})"
    phase = v.phase_name
    if phase:
        words += f" in phase {phase}"
    if baseline.culprits:
        words += f", culprit {', '.join(baseline.culprits[:3])}"
    return words


def _failure_word(baseline: TrialResult) -> str:
    state = baseline.verdict.state
    return {State.STALLED: "hang", State.CRASHED: "crash", State.TIMEOUT: "timeout"}.get(state, "failure")


def conclude(baseline: TrialResult | None, trials: tuple[TrialResult, ...]) -> Conclusion:
    if baseline is None or baseline.done == 0:
        return Conclusion(
            (),
            Confidence.NONE,
            "no verdict for the baseline (interrupted, or out of --budget): nothing is known yet",
        )
    if baseline.all_booted:
        return Conclusion(
            (),
            Confidence.NONE,
            f"the baseline booted in {baseline.booted} of {baseline.done} runs: no failure to isolate"
            + (" (give --repeat N to catch a flaky one)" if baseline.done == 1 else ""),
        )
    details: list[str] = []
    named: list[tuple[TrialResult, float, Confidence]] = []  # (trial, p, confidence)
    weak: list[tuple[TrialResult, float]] = []
    for trial in trials:
        if trial.done == 0:
            continue
        p = fisher_one_sided(trial.booted, trial.done, baseline.booted, baseline.done)
        line = f"{trial.name}: {_counts(trial, baseline)} ({_p(p)})"
        if trial.all_booted and p <= SIGNIFICANT:
            named.append((trial, p, Confidence.HIGH))
            line += ": makes the difference"
        elif trial.all_booted and baseline.none_booted:
            named.append((trial, p, Confidence.MEDIUM))
            line += ": makes the difference if the failure is deterministic"
        elif trial.booted > 0:
            weak.append((trial, p))
        details.append(line)
    minimal = tuple(t.name for t, _, _ in named)
    singles = [(t, p, c) for t, p, c in named if len(t.toggles) == 1]
    failure = _failure_word(baseline)
    if named:
        chosen = singles or named
        best_conf = Confidence.HIGH if any(c == Confidence.HIGH for _, _, c in chosen) else Confidence.MEDIUM
        best = min(chosen, key=lambda x: x[1])
        changes = "; or ".join(f"{t.why or t.name} ({t.name})" for t, _, _ in chosen)
        lead = "with any of: " if len(chosen) > 1 else "with "
        if not singles:
            lead = "with no single change, but " + lead
        trial, p, _ = best
        evidence = f"{_counts(trial, baseline)}, Fisher's exact test, one-sided, {_p(p)}"
        if best_conf == Confidence.MEDIUM:
            settle = runs_to_settle(trial.booted, trial.done, baseline.booted, baseline.done)
            evidence += (
                f"; too few runs to be sure a flaky failure is not lucky: --repeat {settle} settles it"
                if settle
                else ""
            )
        summary = f"the {failure} disappears {lead}{changes} ({evidence}); {baseline_words(baseline)}"
        # Only a toggle that does it alone is a culprit; a pair that does is a minimal change.
        culprits = tuple(n for t, _, _ in singles for n in t.toggles)
        return Conclusion(
            culprits,
            best_conf,
            summary,
            minimal,
            round(best[1], 4),
            None,
            tuple(details),
        )
    if weak:
        trial, p = min(weak, key=lambda x: x[1])
        settle = runs_to_settle(trial.booted, trial.done, baseline.booted, baseline.done)
        if settle is None:
            more = "more runs would not settle it at these rates"
        elif settle > MAX_RUNS_TO_SETTLE:
            more = f"more than {MAX_RUNS_TO_SETTLE} runs each would be needed at these rates"
        else:
            more = f"about {settle} runs each would settle it if these rates hold (--repeat {settle})"
        summary = f"inconclusive: {_counts(trial, baseline)} ({trial.name}; {_p(p)}); {more}"
        return Conclusion((), Confidence.NONE, summary, (), round(p, 4), settle, tuple(details))
    tried = len([t for t in trials if t.done])
    summary = (
        f"no change tried made it boot ({tried} trial{'s' if tried != 1 else ''}); {baseline_words(baseline)}"
    )
    return Conclusion((), Confidence.NONE, summary, (), None, None, tuple(details))
