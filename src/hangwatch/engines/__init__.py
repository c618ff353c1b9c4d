"""Engine profiles: each engine's startup phase lines, its readiness rule, how it names its processes."""

from __future__ import annotations

from hangwatch.engines.generic import GENERIC
from hangwatch.engines.llamacpp import LLAMACPP
from hangwatch.engines.profile import Profile
from hangwatch.engines.sglang import SGLANG
from hangwatch.engines.vllm import VLLM
from hangwatch.errors import UsageError

PROFILES: dict[str, Profile] = {p.name: p for p in (VLLM, SGLANG, LLAMACPP, GENERIC)}


def detect(cmdline: list[str] | tuple[str, ...]) -> Profile:
    """The profile whose engine the command line starts; ``generic`` when none matches."""
    for profile in (VLLM, SGLANG, LLAMACPP):
        if profile.matches(cmdline):
            return profile
    return GENERIC


def by_name(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(
            f"unknown engine {name!r}", f"Choose one of: {', '.join(sorted(PROFILES))}."
        ) from None


def recognise_log(line: str) -> str | None:
    """The engine whose startup lines this is (for a wrapper script the command line did not name)."""
    for profile in (VLLM, SGLANG, LLAMACPP):
        if any(p.search(line) for rule in profile.phases for p in rule.patterns):
            return profile.name
    return None
