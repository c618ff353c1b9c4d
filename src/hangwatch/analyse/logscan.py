"""Turn new log lines into a LogSample: phase events, "still waiting" lines, findings that name a cause."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import replace

from hangwatch.analyse.echoes import ProbeEchoes
from hangwatch.analyse.echoes import SendEcho
from hangwatch.engines import registry
from hangwatch.engines.profile import Profile
from hangwatch.engines.profile import RoleOf
from hangwatch.model.samples import ExitRecord
from hangwatch.model.samples import LogFinding
from hangwatch.model.samples import LogLines
from hangwatch.model.samples import LogSample
from hangwatch.model.samples import OwnRequest
from hangwatch.model.samples import PhaseEvent
from hangwatch.model.samples import ProbeMarks
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import Tick
from hangwatch.model.vocabulary import Cause
from hangwatch.redact import redact_text

NO_MARKS = ProbeMarks()


@functools.lru_cache(maxsize=4)
def _findings_of(
    prefix: str, header: str, fatal: tuple[str, ...]
) -> tuple[tuple[Cause, re.Pattern[str]], ...]:
    """The patterns that name a line, ordered by specificity: the first match names the line. ``prefix``,
    ``header``: the engines' writer prefix and level header (the registry's); ``fatal``: the lines with
    which the engines say they failed to start."""
    return (
        (
            Cause.CUDA_OOM,
            re.compile(
                r"CUDA out of memory|(?:torch\.(?:cuda\.)?)?OutOfMemoryError: CUDA|CUDA error: out of memory"
                r"|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED"
            ),
        ),
        (
            Cause.PORT_IN_USE,
            re.compile(r"Address already in use|EADDRINUSE|\[Errno 98\]|address already in use"),
        ),
        (
            Cause.EXCEPTION,
            re.compile(r"^Traceback \(most recent call last\):|^\S.*\bTraceback \(most recent call last\):"),
        ),
        # The summary line that ends a traceback: "ValueError: ...", "torch.OutOfMemoryError: ...".
        (
            Cause.EXCEPTION,
            # After a writer's prefix and a level header (not a debug line's): "ValueError: ...".
            re.compile(
                rf"^{prefix}(?!DEBUG ){header}"
                r"(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)(?::|$)"
            ),
        ),
        *([(Cause.EXCEPTION, re.compile("|".join(fatal)))] if fatal else []),
    )


def _findings() -> tuple[tuple[Cause, re.Pattern[str]], ...]:
    return _findings_of(registry.writer_prefix(), registry.log_header(), registry.fatal_lines())


_MAX_FINDINGS_PER_TICK = 20
TAIL_LINES = 12  # kept per tick: the last words before a crash
# A line that says again, word for word, what an earlier one said (its time stamp aside) is a
# heartbeat, not news: vLLM's stats line "Avg prompt throughput: 0.0 tokens/s ... Running: 3 reqs"
# every 10 s while its worker is wedged. Numbers other than time stamps are kept: when they change
# (throughput, a progress bar), the line is news.
_TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?|\b\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
    r"|\b\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
)
_REMEMBERED = 4096
_COUNT = re.compile(r"\d+")
# Counts that measure advance toward an end: a fraction (``3/8``) or a percentage (``40%``).
_ADVANCE = re.compile(r"(\d+)\s*/\s*(\d+)|(\d+(?:\.\d+)?)\s*%")
# What a writer puts before its message, and who wrote a line (its pid, its rank tag): the engines' facts
# (Profile.log_prefixes, log_headers, writer_pid, writer_rank), read through the registry.


@functools.lru_cache(maxsize=4)
def _line_prefix_of(source: str) -> re.Pattern[str]:
    return re.compile(source)


def _leftmost(patterns: tuple[re.Pattern[str], ...], text: str) -> re.Match[str] | None:
    """The match that starts first (the first pattern's of those that start together)."""
    best = None
    for pattern in patterns:
        found = pattern.search(text)
        if found is not None and (best is None or found.start() < best.start()):
            best = found
    return best


def _writer(line: str) -> tuple[str, str] | None:
    """(label, pid) of the process a line's prefix names: ``(Worker_TP1 pid=90)`` -> (Worker_TP1, 90)."""
    found = _leftmost(registry.writer_pids(), line[:200])
    return (found.group("label"), found.group("pid")) if found is not None else None


# A rank a line opens with, as programs of many ranks sharing one output say who speaks: torch's
# ``[rank1]:``, ``rank 0: ...``, ``[Rank 3] ...``. Its number names the writer, it is no count.
_OPENING_RANK = re.compile(r"^\W{0,3}rank\s*[:=#]?\s*(\d+)\b", re.IGNORECASE)


# Lines the server writes because of hangwatch's own request: handling it (SGLang logs a prefill for the
# one token), and reacting when hangwatch gives up on it (the server notices the closed connection on its
# next check, then logs the error: 0.9-1.9 s later in sglang-tp1-detok-serving-block-run).
OWN_ECHO_S = 2.0


def caused_by_own(own: OwnRequest | None, at: float) -> bool:
    """A line that arrived right after hangwatch sent its own request, or right after it ended: an echo
    of that request whatever it says (the request's answer, if any, is progress of its own)."""
    if own is None:
        return False
    if own.sent_t <= at <= own.sent_t + OWN_ECHO_S:
        return True
    return own.done_t is not None and own.done_t <= at <= own.done_t + OWN_ECHO_S


def _rank_tag(said: str) -> str | None:
    found = _leftmost(registry.writer_ranks(), said[:200])
    return found.group("rank") if found else None


def line_source(line: str) -> tuple[int | None, str | None]:
    """(pid, rank) of the process a log line names as its writer, where it does."""
    pid = rank = None
    found = _writer(line)
    if found:
        label, pid = found[0], int(found[1])
        tail = re.search(r"((?:TP|DP|PP|EP)\d+)$", label)
        rank = tail.group(1) if tail else None
    return pid, rank if rank is not None else _rank_tag(line)


class LogScanner:
    """Stateful only in which phases each source (rank) visited: SGLang loads its draft with the target's
    lines, and at TP=2 one rank's first "Load weight begin" may follow the other's "Load weight end"."""

    def __init__(
        self,
        profile: Profile,
        ready_patterns: tuple[re.Pattern[str], ...] = (),
        waiting_patterns: tuple[re.Pattern[str], ...] = (),
        echo_markers: tuple[str, ...] = (),
    ) -> None:
        """``echo_markers``: text of access-log lines that are always ours, whatever the probe (the /metrics
        scrape's, our own request's model lookup), beside those each tick's ``ProbeMarks`` give."""
        self._profile = profile
        self._ready = profile.ready_patterns + ready_patterns
        self._waiting = profile.waiting_patterns + waiting_patterns
        self._visited: dict[str, list[str]] = {}  # source (profile.source_of) -> phases it opened
        self._ours = echo_markers
        self._echoes = ProbeEchoes()
        self._in_traceback: set[str] = set()  # writers whose traceback's frames are being printed
        self._said: dict[str, None] = {}  # lines already said (time stamps removed), oldest first
        # What each writer already said, its counts masked -> the advance marks of its latest such line
        # (oldest first): a line that says it again with other counts is a heartbeat.
        self._told: dict[tuple[str | None, str], tuple[float, ...]] = {}
        # Lines right after a probe's send, waiting to learn whether that probe turns out slow: (line, at)
        self._held: list[tuple[str, float]] = []

    def read(self, tick: Tick) -> LogSample:
        """The tick's log read (a one-node watch has one: several are the nodes', NodeLogs reads those)."""
        return self.read_lines(tick.logs[0] if tick.logs else LogLines(), tick)

    def read_lines(self, log: LogLines, tick: Tick) -> LogSample:
        """One log's news of the tick, with the tick's probe answers and our own request's state; the lines
        its reader left out count as new lines, unread."""
        sample = self.scan(
            log.lines, log.new_bytes, tick.t, log.times, tick.probes,
            marks=log.marks, own_request=tick.own_request,
        )  # fmt: skip
        return replace(sample, new_lines=sample.new_lines + log.omitted) if log.omitted else sample

    def scan(
        self,
        lines: tuple[str, ...],
        new_bytes: int,
        t: float,
        times: tuple[float, ...] = (),
        probes: tuple[ProbeResult, ...] = (),
        *,
        marks: ProbeMarks = NO_MARKS,
        own_request: OwnRequest | None = None,
    ) -> LogSample:
        """``times``: when each line arrived (empty: unknown); ``probes``: the answers since the last scan;
        ``marks``: what the probes leave in the log; ``own_request``: our own completion, the latest."""
        waiting = echoes = held = beats = beat_bytes = 0
        beat_pids: dict[int, None] = {}
        named: dict[int, str] = {}
        markers = (*marks.echo_markers, *self._ours) if lines else ()
        own = own_request if lines or self._held else None
        self._echoes.observe_sends(marks.sends)
        self._echoes.observe_probes((*probes, *marks.late_answers))
        released = self._release(t, own)
        events: list[PhaseEvent] = []
        findings: list[LogFinding] = []
        ready_line = None
        for index, line in enumerate(lines):
            writer = _writer(line)
            if writer is not None:
                named[int(writer[1])] = writer[0]
            said = _TIMESTAMP.sub("", line.strip())
            if any(p.search(line) for p in self._waiting) or self._repeats(said):
                waiting += 1
                continue
            if markers and any(m in line for m in markers):
                echoes += 1
                continue
            judged = self._judge(line, times[index], t, own) if times else SendEcho.NONE
            if judged is SendEcho.UNDECIDED:
                held += 1
                self._held.append((line, times[index]))
            elif judged is SendEcho.ECHO:
                echoes += 1  # not progress, but still read for what it names
            elif self._heartbeat(said, writer):
                beats += 1
                beat_bytes += len(line.encode(errors="replace")) + 1
                if writer is not None:
                    beat_pids[int(writer[1])] = None
            phase = self._phase_of(line)
            if phase is not None:
                pid, rank = line_source(line)
                source = f"pid:{pid}" if pid is not None else (f"rank:{rank}" if rank else None)
                events.append(PhaseEvent(t, phase, redact_text(line), source))
            if ready_line is None and any(p.search(line) for p in self._ready):
                ready_line = redact_text(line)
            ends_traceback = self._ends_traceback(line)
            if len(findings) < _MAX_FINDINGS_PER_TICK:
                at = times[index] if times else t  # when it arrived, where known: deaths are that fine
                for cause, pattern in _findings():
                    if pattern.search(line):
                        pid, rank = line_source(line)
                        findings.append(LogFinding(at, cause, redact_text(line), pid, rank))
                        break
                else:
                    if ends_traceback:
                        pid, rank = line_source(line)
                        findings.append(LogFinding(at, Cause.EXCEPTION, redact_text(line), pid, rank))
        return LogSample(
            new_bytes=new_bytes,
            new_lines=len(lines),
            waiting_lines=waiting,
            echo_lines=echoes,
            held_lines=held,
            heartbeat_lines=beats,
            heartbeat_bytes=beat_bytes,
            heartbeat_pids=tuple(beat_pids),
            released_lines=released,
            undecided_lines=len(self._held),
            phase_events=tuple(events),
            findings=tuple(findings),
            ready_line=ready_line,
            last_line=redact_text(lines[-1]) if lines else None,
            named=tuple(sorted(named.items())),
            tail=tuple(redact_text(line)[:300] for line in lines[-TAIL_LINES:]),
        )

    def _ends_traceback(self, line: str) -> bool:
        """The line that ends a traceback (``sitecustomize.InjectedFault: ...``), by its place, whatever
        the exception is called: the first unindented line after a writer's ``Traceback (most recent
        call last):`` and its indented frames. Per writer (vLLM's pid prefix, SGLang's rank tag), as
        ranks' tracebacks interleave."""
        prefix = _line_prefix_of(registry.log_prefix()).match(line)
        body = line[prefix.end() :] if prefix is not None else line
        pid, rank = line_source(line)
        writer = f"pid:{pid}" if pid is not None else f"rank:{rank}"
        if body.startswith("Traceback (most recent call last):"):
            self._in_traceback.add(writer)
            return False
        if writer not in self._in_traceback or not body.strip() or body[0].isspace():
            return False
        self._in_traceback.discard(writer)
        return True

    def _judge(self, line: str, at: float, now: float, own: OwnRequest | None) -> SendEcho:
        """ECHO: a line our probes or our own request caused; UNDECIDED: right after a probe's send,
        and whether that probe turns out slow is not known yet; NONE: the server's own."""
        after_send = self._echoes.after_send(line, at, now)
        if after_send is not SendEcho.NONE:
            return after_send
        if self._echoes.is_echo(line, at) or caused_by_own(own, at):
            return SendEcho.ECHO
        return SendEcho.NONE

    def _release(self, now: float, own: OwnRequest | None) -> int:
        """Judge the lines held for a probe's outcome; how many turned out the server's own (progress
        now: at most ``LATE_S`` late, which only delays a stall verdict)."""
        held, self._held = self._held, []
        released = 0
        for line, at in held:
            judged = self._judge(line, at, now, own)
            if judged is SendEcho.UNDECIDED:
                self._held.append((line, at))
            elif judged is SendEcho.NONE:
                released += 1
        return released

    def _repeats(self, said: str) -> bool:
        """The line (``said``: stripped, time stamps removed) says again what an earlier line said, word
        for word."""
        if not said:
            return False
        if said in self._said:
            return True
        self._said[said] = None
        if len(self._said) > _REMEMBERED:
            del self._said[next(iter(self._said))]
        return False

    def _heartbeat(self, said: str, writer: tuple[str, str] | None) -> bool:
        """The line says again what its writer said before, counts aside, and no count of the kind
        that measures advance (``3/8``, ``40%``) went up.

        A wait that logs says the same thing with a new count each time (torch's store barrier:
        ``... num_workers_joined=1, ..., elapsed=0:00:10``; a retry loop's ``attempt 7, waited 14 s``),
        and so does a loop that works (``step 12``): the words cannot tell them apart, so such a line is
        weak evidence, which the writer's stacks can discount. A progress bar's fraction or percentage
        grows, and the first time a writer says a thing is news: both are progress.
        """
        # The writer, as the line names it (its counts are masked below): vLLM's pid, else SGLang's rank,
        # else the rank the line opens with ("rank 1: flags shared" after "rank 0: flags shared" is news
        # from another writer, not the first one saying it again).
        source = writer[1] if writer is not None else _rank_tag(said)
        if source is None:
            opening = _OPENING_RANK.match(said)
            source = f"rank{opening.group(1)}" if opening else None
        key = (source, _COUNT.sub("#", said))
        marks = (
            tuple(
                float(m.group(1)) / float(m.group(2))
                if m.group(2) and float(m.group(2))
                else float(m.group(3) or 0)
                for m in _ADVANCE.finditer(said)
            )
            if "%" in said or "/" in said
            else ()
        )
        before = self._told.pop(key, None)
        self._told[key] = marks
        if len(self._told) > _REMEMBERED:
            del self._told[next(iter(self._told))]
        return before is not None and not any(new > old for new, old in zip(marks, before, strict=False))

    def _phase_of(self, line: str) -> str | None:
        for index, r in enumerate(self._profile.phases):
            if not any(p.search(line) for p in r.patterns):
                continue
            name = r.name
            visited = self._visited.setdefault(self._profile.source_of(line), [])
            # Opened again by the same source after it reached a later phase: the second pass (the draft).
            later = {x.name for x in self._profile.phases[index + 1 :]}
            if r.again and name in visited and later & set(visited[visited.index(name) :]):
                name = r.again
            visited.append(name)
            return name
        return None


def named_exits(
    exits: tuple[ExitRecord, ...], titles: Mapping[int, str], role_of: RoleOf, roots: set[int]
) -> tuple[ExitRecord, ...]:
    """The exits, each member that never titled itself (or whose comm cut its title short) named by the
    title its log lines give it, with the role and rank that title means."""
    out = []
    for e in exits:
        title = titles.get(e.pid)
        if title is None or title == e.name or not (e.untitled or title.startswith(e.name)):
            out.append(e)
            continue
        role, rank = role_of(title, (title,), e.pid in roots, {})
        out.append(replace(e, name=title, role=role, rank=rank, untitled=False))
    return tuple(out)
