"""A Prometheus scrape as a frozen value, or why there is none.

Used by ``bench`` (server-side token counts and speculative acceptance from counter deltas) and
meant for the supervisor too (a serving stall: requests running while ``generation_tokens_total``
stays frozen). Samples are kept under the names the server exposes them with, ``_total`` suffix
included (``vllm:spec_decode_num_drafts_total``), so the names the engines document
(docs/engine-facts.md) can be used as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class MetricNames:
    """An engine's names for the figures every serving engine exposes (its profile holds them: engines/)."""

    engine: str  # also the names' prefix: "vllm" for "vllm:..."
    generation_tokens: str
    prompt_tokens: str
    running: str
    waiting: str


@dataclass(frozen=True)
class MetricSample:
    """One line of the exposition: a sample name, its labels (sorted), its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None

    def matches(self, wanted: Mapping[str, str]) -> bool:
        return all(self.label(k) == v for k, v in wanted.items())


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every sample of one scrape, by sample name. ``t`` is time.monotonic() when the answer arrived."""

    url: str
    t: float
    samples: Mapping[str, tuple[MetricSample, ...]]

    def has(self, name: str) -> bool:
        return name in self.samples

    def names(self, prefix: str = "") -> tuple[str, ...]:
        return tuple(sorted(n for n in self.samples if n.startswith(prefix)))

    def value(self, name: str, **labels: str) -> float | None:
        """The sum of the samples called ``name`` whose labels include ``labels``; None if there is none.

        Summing is what a counter split by label needs (vLLM labels every sample with ``engine`` and
        ``model_name``; with data parallelism one counter per engine). Giving no labels sums them all.
        """
        matching = [s.value for s in self.samples.get(name, ()) if s.matches(labels)]
        return sum(matching) if matching else None

    def by_label(self, name: str, key: str, **labels: str) -> dict[str, float]:
        """``{label value: sum}`` over the samples of ``name``, grouped by the label ``key``."""
        out: dict[str, float] = {}
        for s in self.samples.get(name, ()):
            group = s.label(key)
            if group is not None and s.matches(labels):
                out[group] = out.get(group, 0.0) + s.value
        return out


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str, **labels: str) -> float | None:
    """How much a counter grew between two scrapes; None when it is missing or went down (a restart)."""
    a = before.value(name, **labels)
    b = after.value(name, **labels)
    if b is None:
        return None
    if a is None:
        a = 0.0  # appeared during the run: prometheus_client creates labelled children on first use
    return b - a if b >= a else None


class ScrapeFailure(StrEnum):
    REFUSED = "refused"  # nothing listens
    TIMEOUT = "timeout"  # connected, no answer in time (or no connection in time)
    HTTP_STATUS = "http-status"  # 404: the server exposes no /metrics (SGLang without --enable-metrics)
    NOT_PROMETHEUS = "not-prometheus"  # an answer the text parser rejects
    ERROR = "error"
    SKIPPED = "skipped"  # not asked for (bench --no-metrics)


@dataclass(frozen=True)
class ScrapeError:
    url: str
    kind: ScrapeFailure
    detail: str
    status: int | None = None

    def describe(self) -> str:
        return f"{self.url}: {self.detail}"
