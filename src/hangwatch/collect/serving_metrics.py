"""Poll the server's Prometheus /metrics while it serves: running and waiting requests, tokens generated.

The one honest signal of a wedged server whose probes all stay green (failure mode F6,
eugr/spark-vllm-docker#260) is its generation-token counter frozen while requests are running.
A thread scrapes at a fixed interval so a slow /metrics never delays the supervision loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from hangwatch.collect.prometheus import scrape
from hangwatch.model.metrics import MetricNames
from hangwatch.model.metrics import MetricsSnapshot
from hangwatch.model.samples import ServingSample


def serving_sample(snapshot: MetricsSnapshot, names: MetricNames, t: float) -> ServingSample:
    return ServingSample(
        t=t,
        running=snapshot.value(names.running),
        waiting=snapshot.value(names.waiting),
        generated_tokens=snapshot.value(names.generation_tokens),
    )


class ServingPoller:
    def __init__(
        self,
        url: str,
        names: MetricNames,
        clock: Callable[[], float],
        interval_s: float = 2.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.url = url
        self._names = names
        self._wanted = (names.running, names.waiting, names.generation_tokens)
        self._clock = clock
        self._interval = interval_s
        self._timeout = timeout_s
        self._lock = threading.Lock()
        self._latest: ServingSample | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hangwatch-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        with httpx.Client(trust_env=False) as client:
            while not self._stop.is_set():
                t = round(self._clock(), 3)
                result = scrape(self.url, self._timeout, client=client, only=self._wanted)
                if isinstance(result, MetricsSnapshot):
                    sample = serving_sample(result, self._names, t)
                else:
                    sample = ServingSample(t=t, error=result.describe())
                with self._lock:
                    self._latest = sample
                self._stop.wait(self._interval)

    def take(self) -> ServingSample | None:
        """The newest sample not taken yet (None when nothing new arrived since)."""
        with self._lock:
            sample, self._latest = self._latest, None
        return sample

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._timeout + 1)
