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
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable

from hangwatch.model.samples import ProbeResult

# A line logged just before the answer is sent, or read from the pipe just after it arrived.
BEFORE_S = 0.3
AFTER_S = 0.5
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?")
_KEEP = 32  # probe answers remembered (a probe a second: half a minute)
SLOW_S = 1.0


def template(line: str) -> str:
    return _NUMBERS.sub("#", line.strip())[:200]


class ProbeEchoes:
    def __init__(self) -> None:
        self._answers: deque[tuple[float, bool]] = deque(maxlen=_KEEP)  # (answered at, slowly)
        self._news: set[str] = set()  # kinds of line seen away from any probe: never echoes
        self._suspects: set[str] = set()  # kinds seen once, right at a quick probe's answer

    def observe_probes(self, probes: Iterable[ProbeResult]) -> None:
        for probe in probes:
            self._answers.append((probe.t + probe.elapsed_s, probe.elapsed_s >= SLOW_S))

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
