"""The one list of engine profiles, and what the rest of hangwatch reads of all of them together.

A new engine is a module of its own (engines/<name>.py, one ``Profile``) and one entry in ``ENGINES``:
the log scanner, the stack rules, the next steps, doctor and the benchmark read its facts from here.
``collect/`` may not import engines/: its callers pass these facts in (``distributions``,
``cache_folders``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from hangwatch.engines.bootflags import BootFlags
from hangwatch.engines.generic import GENERIC
from hangwatch.engines.llamacpp import LLAMACPP
from hangwatch.engines.profile import EnvRule
from hangwatch.engines.profile import Profile
from hangwatch.engines.sglang import SGLANG
from hangwatch.engines.vllm import VLLM
from hangwatch.errors import UsageError
from hangwatch.model.doctor import CacheFolder
from hangwatch.model.metrics import MetricNames

# Every engine, in the order they are tried; the generic profile last: it matches anything.
ENGINES: tuple[Profile, ...] = (VLLM, SGLANG, LLAMACPP, GENERIC)

T = TypeVar("T")


def _per_registry(build: Callable[[], T]) -> Callable[[], T]:
    """``build()`` once per value of ``ENGINES`` (compiled patterns), again when the tuple is replaced."""
    memo: list[tuple[tuple[Profile, ...], T]] = []

    def get() -> T:
        if not memo or memo[0][0] is not ENGINES:
            memo[:] = [(ENGINES, build())]
        return memo[0][1]

    return get


def engines() -> tuple[Profile, ...]:
    """The named engines (every profile but the last, generic one)."""
    return ENGINES[:-1]


def fallback() -> Profile:
    return ENGINES[-1]


def profiles() -> dict[str, Profile]:
    return {p.name: p for p in ENGINES}


def detect(cmdline: list[str] | tuple[str, ...]) -> Profile:
    """The profile whose engine the command line starts; the generic one when none matches."""
    for profile in engines():
        if profile.matches(cmdline):
            return profile
    return fallback()


def by_name(name: str) -> Profile:
    known = profiles()
    try:
        return known[name]
    except KeyError:
        raise UsageError(f"unknown engine {name!r}", f"Choose one of: {', '.join(sorted(known))}.") from None


def recognise_log(line: str) -> str | None:
    """The engine whose startup lines this is (for a wrapper script the command line did not name)."""
    for profile in engines():
        if any(p.search(line) for rule in profile.phases for p in rule.patterns):
            return profile.name
    return None


def boot_flags(engine: str) -> BootFlags:
    """The engine's command-line words that make boots comparable; the generic profile's for unknown."""
    return profiles().get(engine, fallback()).boot


def _union(parts: list[str]) -> str:
    return "|".join(dict.fromkeys(parts))


@_per_registry
def writer_prefix() -> str:
    """A regex source: any engine's writer prefix (``(Worker_TP1 pid=90) ``), optional."""
    prefixes = _union([p for e in ENGINES for p in e.log_prefixes])
    return f"(?:{prefixes})?" if prefixes else ""


@_per_registry
def log_header() -> str:
    """A regex source: any engine's level, time and file header after the prefix, optional."""
    headers = _union([h for e in ENGINES for h in e.log_headers])
    return f"(?:{headers})?" if headers else ""


def log_prefix() -> str:
    """What a writer puts before its message: the prefix, then the header (a regex source)."""
    return writer_prefix() + log_header()


@_per_registry
def fatal_lines() -> tuple[str, ...]:
    """Regex sources of every engine's lines that say it failed to start, in registry order."""
    return tuple(f for e in ENGINES for f in e.fatal_lines)


@_per_registry
def writer_pids() -> tuple[re.Pattern[str], ...]:
    return tuple(e.writer_pid for e in ENGINES if e.writer_pid is not None)


@_per_registry
def writer_ranks() -> tuple[re.Pattern[str], ...]:
    return tuple(e.writer_rank for e in ENGINES if e.writer_rank is not None)


@_per_registry
def compile_frames() -> tuple[str, ...]:
    return tuple(f for e in ENGINES for f in e.compile_frames)


@_per_registry
def kernel_namespaces() -> tuple[tuple[str, str], ...]:
    return tuple(k for e in ENGINES for k in e.kernel_namespaces)


def feature_modules(feature: str) -> tuple[str, ...]:
    """Regex sources of the engines' native modules that only ``feature`` loads."""
    return tuple(src for e in ENGINES for key, src in e.feature_modules if key == feature)


def flags_for(purpose: str) -> tuple[tuple[Profile, str], ...]:
    """(engine, flag) of every engine that names a flag for ``purpose`` (profile.CUDA_GRAPHS_OFF, ...)."""
    return tuple((e, e.next_step_flags[purpose]) for e in ENGINES if purpose in e.next_step_flags)


@_per_registry
def distributions() -> tuple[str, ...]:
    """Every engine's packages as pip names them, in registry order."""
    return tuple(dict.fromkeys(d for e in ENGINES for d in e.distributions))


@_per_registry
def cache_folders() -> tuple[CacheFolder, ...]:
    return tuple(c for e in ENGINES for c in e.cache_dirs)


@_per_registry
def env_rules() -> tuple[EnvRule, ...]:
    return tuple(r for e in ENGINES for r in e.env_rules)


@_per_registry
def metric_names() -> tuple[MetricNames, ...]:
    """The /metrics names of the engines that have them, in registry order."""
    return tuple(e.metrics for e in ENGINES if e.metrics is not None)


def by_metrics(names: MetricNames) -> Profile | None:
    return next((e for e in ENGINES if e.metrics == names), None)
