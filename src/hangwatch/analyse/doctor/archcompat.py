"""Which GPU code runs on which GPU: CUDA's compatibility rules as pure functions.

The rules (CUDA C Programming Guide, "Binary Compatibility" and "Feature Availability"):

* SASS ``sm_XY`` runs on a GPU of compute capability X.Z with Z >= Y: same major, same or
  newer minor. Never across majors (``sm_90`` does not run on 10.0, ``sm_100`` not on 12.0).
* Family-specific SASS ``sm_XYf`` (CUDA 12.9+) runs on the members of its family, the GPUs of
  the same major with minor >= Y (``sm_100f``: 10.0 and 10.3).
* Arch-specific SASS ``sm_XYa`` (wgmma, tcgen05, ...) runs on exactly X.Y and nothing else.
* PTX ``compute_XY`` can be compiled by the driver (JIT) for any GPU of capability >= X.Y, at
  the first load (slow first start, a cache in ~/.nv/ComputeCache afterwards).
  ``compute_XYa`` compiles only for exactly X.Y, ``compute_XYf`` only for its family.

A loader that picks one of several per-architecture builds by a rule of its own is the other
way code and GPU miss each other; :func:`loader_choice` knows the rules of the libraries that
do this, read from their source.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass

from hangwatch.model.doctor import Coverage

Capability = tuple[int, int]

_TARGET = re.compile(r"^(?P<kind>sm|compute)_(?P<arch>\d{2,3})(?P<variant>[af]?)$")
_ARCH_DIR = re.compile(r"^sm_?(?P<arch>\d{2,3})(?P<variant>[af]?)$")


@dataclass(frozen=True)
class Target:
    kind: str  # "sm" or "compute"
    capability: Capability
    variant: str  # "", "a", "f"

    @property
    def name(self) -> str:
        major, minor = self.capability
        return f"{self.kind}_{major}{minor}{self.variant}"


def capability_of_arch(arch: int) -> Capability:
    """90 -> (9, 0); 100 -> (10, 0); 121 -> (12, 1)."""
    return divmod(arch, 10)


def parse_capability(text: str) -> Capability:
    """ "12.0", "12" (a major version), "sm_120" or "120" (an arch number) -> (12, 0); else ValueError."""
    text = text.strip().lower()
    m = _TARGET.match(text)
    if m:
        return capability_of_arch(int(m.group("arch")))
    major, dot, minor = text.partition(".")
    if major.isdigit() and not dot and int(major) >= 20:
        return capability_of_arch(int(major))
    if not major.isdigit() or (dot and not minor.isdigit()):
        raise ValueError(f"not a compute capability: {text!r} (expected X.Y, e.g. 9.0 or 12.0)")
    return int(major), int(minor or 0)


def format_capability(cap: Capability) -> str:
    return f"{cap[0]}.{cap[1]}"


def parse_target(text: str) -> Target | None:
    m = _TARGET.match(text.strip())
    if m is None:
        return None
    return Target(m.group("kind"), capability_of_arch(int(m.group("arch"))), m.group("variant"))


def sass_runs_on(target: Target, gpu: Capability) -> bool:
    if target.variant == "a":
        return target.capability == gpu
    return target.capability[0] == gpu[0] and gpu[1] >= target.capability[1]


def ptx_compiles_for(target: Target, gpu: Capability) -> bool:
    if target.variant == "a":
        return target.capability == gpu
    if target.variant == "f":
        return target.capability[0] == gpu[0] and gpu[1] >= target.capability[1]
    return gpu >= target.capability


def coverage(sass: Iterable[str], ptx: Iterable[str], gpu: Capability) -> tuple[Coverage, str]:
    """The verdict for code of these targets on a GPU of capability ``gpu``, and why."""
    sass_targets = [t for t in (parse_target(s) for s in sass) if t is not None]
    ptx_targets = [t for t in (parse_target(p) for p in ptx) if t is not None]
    cap = format_capability(gpu)
    runs = [t.name for t in sass_targets if sass_runs_on(t, gpu)]
    if runs:
        return Coverage.NATIVE, f"SASS {', '.join(runs)} runs on {cap}"
    jit = [t.name for t in ptx_targets if ptx_compiles_for(t, gpu)]
    if jit:
        return (
            Coverage.JIT,
            f"no SASS for {cap}: the driver must JIT-compile PTX {', '.join(jit)} at first load",
        )
    return Coverage.NONE, _why_none(sass_targets, ptx_targets, gpu)


def _why_none(sass: list[Target], ptx: list[Target], gpu: Capability) -> str:
    cap = format_capability(gpu)
    if not sass and not ptx:
        return "no GPU code at all"
    reasons = []
    specific = [t for t in sass + ptx if t.variant == "a"]
    if specific:
        names = ", ".join(f"{t.name} only on {format_capability(t.capability)}" for t in specific)
        reasons.append(f"arch-specific code runs on exactly its own capability ({names})")
    newer_ptx = [t.name for t in ptx if t.variant == "" and t.capability > gpu]
    if newer_ptx:
        reasons.append(f"PTX {', '.join(newer_ptx)} is for a newer GPU than {cap}")
    have = ", ".join(t.name for t in sass + ptx)
    reasons.append(f"has {have}; nothing for {cap}")
    return "; ".join(reasons)


def worst_coverage(verdicts: Iterable[Coverage]) -> Coverage:
    order = {Coverage.NATIVE: 0, Coverage.JIT: 1, Coverage.NONE: 2}
    return max(verdicts, key=order.__getitem__, default=Coverage.NATIVE)


# -- per-architecture directories and the loaders that choose between them ----------------------


def arch_directory(path: str) -> tuple[str, Capability, str] | None:
    """('sm100', (10, 0), 'a'?) for a module inside a directory named for an architecture."""
    parts = path.split("/")
    for part in reversed(parts[:-1]):
        m = _ARCH_DIR.match(part)
        if m:
            return part, capability_of_arch(int(m.group("arch"))), m.group("variant")
    return None


def _sgl_kernel_choice(gpu: Capability | None) -> str:
    # sgl-kernel's load_utils._load_architecture_specific_ops: capability 90 loads sm90/common_ops,
    # EVERY other capability (and no GPU) loads sm100/common_ops; so a 12.0 GPU gets the sm100 build.
    if gpu is not None and gpu == (9, 0):
        return "sm90"
    return "sm100"


LOADERS: dict[str, tuple[Callable[[Capability | None], str], str]] = {
    "sgl_kernel": (
        _sgl_kernel_choice,
        "sgl_kernel/load_utils.py: capability 9.0 -> sm90/, anything else -> sm100/",
    ),
}


def loader_choice(package: str, gpu: Capability) -> tuple[str, str] | None:
    """(directory the package's own loader picks on this GPU, where the rule comes from), if known."""
    known = LOADERS.get(package)
    if known is None:
        return None
    choose, source = known
    return choose(gpu), source
