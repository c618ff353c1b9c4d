"""``hangwatch bench``: the workload, what each request measured, and the report they add up to.

The JSON contract (``hangwatch.bench/1``) is ``dataclasses.asdict(BenchReport)``: ``servers`` holds one
:class:`ServerResult` per URL, ``comparison`` a :class:`Comparison` when two servers were compared.
All times are seconds. Ratios are always the second server over the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.metrics import ScrapeError

BENCH_SCHEMA = "hangwatch.bench/1"


class Endpoint(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"

    @property
    def path(self) -> str:
        return "/v1/completions" if self is Endpoint.COMPLETIONS else "/v1/chat/completions"


class ErrorKind(StrEnum):
    """Why a request failed. Each kind points at a different problem on the server's side."""

    REFUSED = "refused"  # nothing listens on the port
    CONNECT = "connect"  # no TCP connection for another reason (unreachable, connect timeout)
    NO_ANSWER = "no-answer"  # connected, but no HTTP answer within the idle timeout: a wedged server
    STALLED_STREAM = "stalled-stream"  # the stream started, then no chunk within the idle timeout
    TIMEOUT = "timeout"  # the whole request took longer than the request timeout
    HTTP_STATUS = "http-status"  # an answer other than 200 (prompt too long, unknown model, 404)
    NOT_OPENAI = "not-openai"  # a 200 that is not an OpenAI event stream (a web page, one JSON body)
    MALFORMED = "malformed"  # a streamed chunk that is not JSON or lacks the OpenAI fields
    SERVER_ERROR = "server-error"  # the stream carried an error object
    DISCONNECTED = "disconnected"  # the connection closed before the stream ended
    NO_USAGE = "no-usage"  # the stream ended without the usage chunk: output tokens unknown
    EMPTY = "empty"  # the stream ended without a single choice chunk
    CANCELLED = "cancelled"  # stopped by us: the run was aborted
    ERROR = "error"  # anything else (the detail says what)


@dataclass(frozen=True)
class Prompt:
    text: str


@dataclass(frozen=True)
class Workload:
    """What is sent to every server, in every round (``requests`` and ``duration_s`` are per round)."""

    endpoint: Endpoint
    model: str | None  # None: the first model the server lists at /v1/models
    requests: int | None  # a fixed number of requests per round ...
    duration_s: float | None  # ... or keep sending for this long per round
    concurrency: int  # at most this many requests in flight
    rate: float | None  # Poisson arrivals at this many requests/s; None: as fast as concurrency allows
    max_tokens: int
    temperature: float
    ignore_eos: bool
    seed: int
    rounds: int
    warmup: int  # requests per server before the first round, not counted
    prompts: str  # "bundled" or the file given
    prompt_count: int
    request_timeout_s: float
    idle_timeout_s: float


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it. Times are seconds from sending the request."""

    index: int
    sent_s: float  # when it was sent, from the start of its run
    ttft_s: float | None  # to the first chunk carrying a choice (vLLM's benchmark client does the same)
    itl_s: tuple[float, ...]  # gaps between chunks carrying a choice (one chunk may carry several tokens)
    e2e_s: float  # to the end of the stream (or the failure)
    output_tokens: int | None  # usage.completion_tokens from the server
    prompt_tokens: int | None
    chunks: int
    error: ErrorKind | None = None
    detail: str | None = None
    status: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class LoadRun:
    """One run of the load generator against one server."""

    records: tuple[RequestRecord, ...]
    duration_s: float  # first request sent to last request finished
    aborted: str | None  # why it stopped early


@dataclass(frozen=True)
class RoundMeasurement:
    """One server's share of one round: its requests and /metrics before, during and after."""

    label: str  # "A" or "B"
    round: int
    position: int  # 0: ran first in its round
    records: tuple[RequestRecord, ...]
    duration_s: float  # first request sent to last request finished
    before: MetricsSnapshot | ScrapeError
    after: MetricsSnapshot | ScrapeError
    during: tuple[MetricsSnapshot, ...] = ()
    aborted: str | None = None


@dataclass(frozen=True)
class Percentiles:
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True)
class SpecStats:
    """Speculative decoding acceptance over the run, as the engine itself defines it (docs/engine-facts.md).

    vLLM (counter deltas): acceptance_rate = accepted / draft tokens; mean_acceptance_length =
    1 + accepted / drafts (the bonus token included); per_position[i] = accepted at position i / drafts.
    SGLang (gauges): the values of ``sglang:spec_accept_rate`` and ``sglang:spec_accept_length`` at the
    end of the run, which cover the last decode-log interval only; no per-position figures.
    """

    engine: str
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position: tuple[float, ...]
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    accepted_per_position: tuple[int, ...] = ()
    source: str = ""


@dataclass(frozen=True)
class ServerMetrics:
    """The server's own view of the run, from /metrics before, during and after."""

    engine: str | None  # "vllm", "sglang", or None when no known metric names were found
    generation_tokens: int | None  # counter delta over the run
    prompt_tokens: int | None
    running_max: float | None  # the most requests running / waiting in a scrape during the run (every 1 s)
    waiting_max: float | None
    scrapes: int


@dataclass(frozen=True)
class RoundResult:
    round: int
    position: int
    duration_s: float
    requests: int
    errors: int
    output_tokens: int
    output_tokens_per_s: float
    ttft_p50_s: float | None
    itl_p50_s: float | None
    e2e_p50_s: float | None
    spec: SpecStats | None


CURVE_STEP_PCT = 2


@dataclass(frozen=True)
class Distributions:
    """Quantile curves (0, 2 ... 100 %: CURVE_STEP_PCT apart) for the plots; empty when nothing measured."""

    ttft_s: tuple[float, ...]
    itl_s: tuple[float, ...]
    e2e_s: tuple[float, ...]


@dataclass(frozen=True)
class Boot:
    """How a server launched by ``--launch-a/-b`` came up under supervision."""

    command: tuple[str, ...]  # redacted
    ready_after_s: float
    log_path: str
    report_path: str


@dataclass(frozen=True)
class ServerResult:
    label: str
    url: str
    model: str
    requests: int
    errors: int
    errors_by_kind: Mapping[str, int]
    error_examples: Mapping[str, str]  # the first detail seen per kind
    output_tokens: int
    prompt_tokens: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft_s: Percentiles
    itl_s: Percentiles
    tpot_s: Percentiles  # (e2e - ttft) / (output tokens - 1), per request, as vLLM's benchmark defines it
    e2e_s: Percentiles
    spec: SpecStats | None
    spec_note: str | None  # why ``spec`` is None, or a caveat about it
    server_metrics: ServerMetrics | None
    metrics_note: str | None
    rounds: tuple[RoundResult, ...]
    distributions: Distributions
    aborted: str | None = None
    boot: Boot | None = None


class Outcome(StrEnum):
    FASTER = "faster"
    SLOWER = "slower"
    NO_CLEAR_DIFFERENCE = "no-clear-difference"
    INCONCLUSIVE = "inconclusive"  # one round, or rounds with no throughput on a side


@dataclass(frozen=True)
class RatioSpread:
    """A ratio (second over first) over all rounds, and the lowest and highest single-round ratio."""

    ratio: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class RoundRatio:
    round: int
    output_tokens_per_s_ratio: float | None
    ttft_p50_ratio: float | None
    itl_p50_ratio: float | None
    e2e_p50_ratio: float | None


@dataclass(frozen=True)
class Comparison:
    first: str  # label and URL of each side, so the verdict reads on its own
    second: str
    output_tokens_per_s_ratio: float | None
    output_tokens_per_s_spread: RatioSpread
    ttft_p50: RatioSpread
    itl_p50: RatioSpread
    e2e_p50: RatioSpread
    rounds: tuple[RoundRatio, ...]
    outcome: Outcome
    verdict: str


@dataclass(frozen=True)
class BenchReport:
    schema: str
    started_at: str  # wall clock, ISO 8601
    hangwatch_version: str
    workload: Workload
    servers: tuple[ServerResult, ...]
    comparison: Comparison | None
    notes: tuple[str, ...] = ()
