"""Engine profiles: each engine's startup phase lines, its readiness rule, how it names its processes.

The list of engines is ``ENGINES`` in engines/registry.py: a new engine is its own module and one entry
there. What is re-exported here is what the commands use most.
"""

from __future__ import annotations

from hangwatch.engines.generic import GENERIC
from hangwatch.engines.profile import Profile
from hangwatch.engines.registry import ENGINES
from hangwatch.engines.registry import by_name
from hangwatch.engines.registry import detect
from hangwatch.engines.registry import recognise_log
from hangwatch.engines.sglang import SGLANG
from hangwatch.engines.vllm import VLLM

# Name -> profile, for the command-line choices (``--engine``); read ENGINES where it may be replaced.
PROFILES: dict[str, Profile] = {p.name: p for p in ENGINES}

__all__ = [
    "ENGINES",
    "GENERIC",
    "PROFILES",
    "SGLANG",
    "VLLM",
    "Profile",
    "by_name",
    "detect",
    "recognise_log",
]
