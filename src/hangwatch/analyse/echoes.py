"""Log lines our own probes cause, recognised by their timing: each follows one probe's answer.

A server may log something for every probe it answers: an access-log line (recognised by the probe's
request and source port in logscan.py), or words of its own, such as SGLang's ``Health check failed.
Server couldn't get a response from detokenizer for last 20 seconds.`` while its scheduler is wedged:
counted as progress, one line per probe would keep a wedged server alive forever. Whatever the
words, such a line comes within moments of a probe's answer. A kind of line (its text with numbers
masked) that has only ever appeared right around a probe's answer is an echo, not progress; once it
appears away from any probe, it is the server's own news for good.

Probes a second apart that answer in milliseconds leave few moments that are not "around a probe",
so there one coincidence proves nothing: a kind of line is an echo from its second time on. A probe
the server took a second or more to answer is rarer and says more: a line at its answer is an echo
the first time already (SGLang's health check answers after 20 s, with that line).

A probe can also cause lines when it is *sent*: SGLang's ``/health`` runs a generation, so the scheduler
logs ``Prefill batch, #new-seq: 1, ...`` within a second of the request, while the answer (a 503 when the
detokenizer is wedged) comes 20 s later, nowhere near that line. A line that arrives right after the
send of a probe that turned out slow (its answer later than ``LATE_S``, or none) is an echo of that probe,
whatever its kind's history (the warm-up's prefills made the kind the server's news long before). Not
after every send: probes a second apart would then cover nearly all the time. Only a slow probe counts
(the patient probe then waits longer for each next answer, so the windows after its sends are a small
part of the time), and only one line of each kind per probe (it asks for one thing): a busy server's
other lines in that window, and all its lines outside it, are its own work. Whether a probe turned out
slow is known ``LATE_S`` after its send at the latest, so a line in its window waits that long to be
judged (``SendEcho.UNDECIDED``).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from enum import StrEnum

from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult

# A line logged just before the answer is sent, or read from the pipe just after it arrived.
BEFORE_S = 0.3
AFTER_S = 0.5
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?")
_KEEP = 32  # probe answers remembered (a probe a second: half a minute)
SLOW_S = 1.0
# A line this soon after a probe was sent may be the server starting on it (SGLang's prefill for its
# /health generation: within a second; 2 s leaves room for a loaded machine).
SEND_ECHO_S = 2.0
# A probe not answered this long after its send turned out slow. SGLang answers a healthy /health after
# its first 1 s sleep (1.0-1.2 s measured), so a shorter bound would make every healthy probe slow;
# 2 s is also the probe's own default timeout.
LATE_S = 2.0


class SendEcho(StrEnum):
    """What a line's place right after a probe's send says of it."""

    ECHO = "echo"  # right after the send of a probe that turned out slow: the server starting on it
    UNDECIDED = "undecided"  # right after a send whose probe may still answer in time: ask again later
    NONE = "none"  # not an echo of a send: judge it by the answers, like any line


def template(line: str) -> str:
    return _NUMBERS.sub("#", line.strip())[:200]


class ProbeEchoes:
    def __init__(self) -> None:
        self._answers: deque[tuple[float, bool]] = deque(maxlen=_KEEP)  # (answered at, slowly)
        self._news: set[str] = set()  # kinds of line seen away from any probe: never echoes
        self._suspects: set[str] = set()  # kinds seen once, right at a quick probe's answer
        # send time -> how long its answer took (None: not answered yet, or it timed out unanswered)
        self._sent: dict[float, float | None] = {}
        self._echoed: set[tuple[float, str]] = set()  # (send, kind): each probe echoed once per kind

    def observe_sends(self, sends: Iterable[float]) -> None:
        """Probes sent, answered or not: a probe in flight has no result yet, only its send time."""
        for sent in sends:
            self._sent.setdefault(sent, None)
        self._trim()

    def observe_probes(self, probes: Iterable[ProbeResult]) -> None:
        for probe in probes:
            self._answers.append((probe.t + probe.elapsed_s, probe.elapsed_s >= SLOW_S))
            if probe.outcome is ProbeOutcome.TIMEOUT:
                self._sent.setdefault(probe.t, None)  # its late answer, if any, comes as an HTTP result
            else:
                self._sent[probe.t] = probe.elapsed_s
        self._trim()

    def after_send(self, line: str, at: float, now: float) -> SendEcho:
        """Whether a line that arrived at ``at`` is the server starting on a probe sent just before it.

        ``now``: what is known of the probes is as of then (a probe still unanswered ``LATE_S`` after its
        send turned out slow, whatever it answers later).
        """
        sends = [s for s in self._sent if s <= at <= s + SEND_ECHO_S]
        if not sends:
            return SendEcho.NONE
        sent = max(sends)
        took = self._sent[sent]
        if took is None and now - sent < LATE_S:
            return SendEcho.UNDECIDED
        if took is not None and took < LATE_S:
            return SendEcho.NONE
        kind = (sent, template(line))
        if kind in self._echoed:
            return SendEcho.NONE  # a second line of the kind: the probe asked for one thing
        self._echoed.add(kind)
        return SendEcho.ECHO

    def _trim(self) -> None:
        while len(self._sent) > _KEEP:
            oldest = min(self._sent)
            del self._sent[oldest]
            self._echoed = {k for k in self._echoed if k[0] != oldest}

    def is_echo(self, line: str, at: float) -> bool:
        kind = template(line)
        if kind in self._news:
            return False
        near = [slow for done, slow in self._answers if done - BEFORE_S <= at <= done + AFTER_S]
        if not near:
            self._news.add(kind)
            self._suspects.discard(kind)
            return False
        if any(near) or kind in self._suspects:
            return True
        self._suspects.add(kind)
        return False
