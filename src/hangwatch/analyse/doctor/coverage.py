"""Doctor's GPU-code checks: does the environment's code run on the GPUs it will meet? Pure functions.

Inputs are the scans of collect/fatbin.py, torch's compiled arch list and the GPUs' compute
capabilities; outputs are ``ModuleCoverage`` rows (the JSON ``modules``) and ``Check`` lines.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Sequence

from hangwatch.analyse.doctor.archcompat import Capability
from hangwatch.analyse.doctor.archcompat import arch_directory
from hangwatch.analyse.doctor.archcompat import coverage
from hangwatch.analyse.doctor.archcompat import format_capability
from hangwatch.analyse.doctor.archcompat import loader_choice
from hangwatch.analyse.doctor.archcompat import worst_coverage
from hangwatch.engines import registry
from hangwatch.model.doctor import Check
from hangwatch.model.doctor import Coverage
from hangwatch.model.doctor import EntryKind
from hangwatch.model.doctor import ModuleCoverage
from hangwatch.model.doctor import ModuleScan
from hangwatch.model.doctor import PyEnvFacts
from hangwatch.model.doctor import Status
from hangwatch.words import plural

# The first CUDA release whose driver JIT-compiles each PTX ISA version (PTX ISA release notes).
PTX_ISA_CUDA: dict[tuple[int, int], tuple[int, int]] = {
    **{(7, m): (11, m) for m in range(9)},
    **{(8, m): (12, m) for m in range(5)},
    (8, 5): (12, 5),
    (8, 6): (12, 7),
    (8, 7): (12, 8),
    (8, 8): (12, 9),
    (9, 0): (13, 0),
    (9, 1): (13, 1),
}
_MAX_LISTED = 8

# Modules that only one backend or feature loads: without code for the GPU, that feature is out, not
# the environment (the engine picks another backend, or fails only when told to use this one).
FEATURE_MODULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile("|".join((*registry.feature_modules("fa3"), r"flash_attn_3", r"flashattn_hopper"))),
        "FlashAttention-3 (an attention backend for Hopper)",
    ),
    (re.compile(r"flash_?mla"), "FlashMLA (the MLA attention of DeepSeek-style models)"),
    (re.compile(r"deep_?gemm"), "DeepGEMM (FP8 GEMM kernels for Hopper and Blackwell)"),
)


def feature_of(path: str) -> str | None:
    """The single feature a module serves, from its file and package names; None for core code."""
    name = path.lower().rsplit("site-packages/", 1)[-1]
    return next((feature for pattern, feature in FEATURE_MODULES if pattern.search(name)), None)


def _ptx_too_new(ptx_versions: Iterable[str], driver_cuda: tuple[int, int] | None) -> list[str]:
    if driver_cuda is None:
        return []
    too_new = []
    for text in ptx_versions:
        major, _, minor = text.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            continue
        needs = PTX_ISA_CUDA.get((int(major), int(minor)))
        if needs is not None and needs > driver_cuda:
            too_new.append(f"PTX ISA {text} needs a CUDA {needs[0]}.{needs[1]} driver")
    return too_new


def module_coverage(
    scan: ModuleScan,
    capabilities: Sequence[Capability],
    package: str | None = None,
    driver_cuda: tuple[int, int] | None = None,
) -> ModuleCoverage:
    """The verdict of one module for every capability checked (the worst is ``verdict``)."""
    sass = scan.targets(EntryKind.SASS)
    ptx = scan.targets(EntryKind.PTX)
    ptx_versions = tuple(sorted({e.ptx_version for c in scan.loadable for e in c.entries if e.ptx_version}))
    by_cap: list[tuple[str, Coverage]] = []
    reasons: list[str] = []
    partial: list[str] = []
    for cap in capabilities:
        verdict, reason = coverage(sass, ptx, cap)
        if verdict is Coverage.JIT:
            too_new = _ptx_too_new(ptx_versions, driver_cuda)
            if too_new and driver_cuda is not None:
                driver = f"{driver_cuda[0]}.{driver_cuda[1]}"
                verdict, reason = (
                    Coverage.NONE,
                    f"{reason}; but {'; '.join(too_new)} (this driver: CUDA {driver})",
                )
        by_cap.append((format_capability(cap), verdict))
        reasons.append(reason)
        missing = sum(
            1
            for c in scan.loadable
            if c.entries
            and coverage(
                [e.target for e in c.entries if e.kind is EntryKind.SASS],
                [e.target for e in c.entries if e.kind is EntryKind.PTX],
                cap,
            )[0]
            is Coverage.NONE
        )
        if missing and verdict is not Coverage.NONE:
            total = sum(1 for c in scan.loadable if c.entries)
            partial.append(f"{missing} of {total} containers have no code for {format_capability(cap)}")
    return ModuleCoverage(
        path=scan.path,
        sass=sass,
        ptx=ptx,
        verdict=worst_coverage(v for _, v in by_cap),
        package=package,
        by_capability=tuple(by_cap),
        reason="; ".join(dict.fromkeys(reasons)),
        partial="; ".join(partial) or None,
        ptx_versions=ptx_versions,
        feature=feature_of(scan.path),
    )


def _caps_text(capabilities: Sequence[Capability]) -> str:
    return ", ".join(format_capability(c) for c in capabilities)


def check_torch_arch(env: PyEnvFacts, capabilities: Sequence[Capability]) -> Check:
    name = "torch-architectures"
    if env.error:
        return Check(name, Status.WARN, f"could not ask the environment: {env.error}")
    if env.torch_error:
        return Check(
            name,
            Status.FAIL,
            f"torch does not import: {env.torch_error}",
            fix="Fix the environment first: `python -c 'import torch'` must work.",
        )
    if env.torch_version is None:
        return Check(name, Status.PASS, "torch is not installed in this environment: nothing to check")
    if env.torch_cuda is None:
        return Check(name, Status.PASS, f"torch {env.torch_version} is a CPU build: no GPU code to check")
    if not capabilities:
        return Check(
            name,
            Status.WARN,
            "no GPU to check against (none seen by NVML)",
            fix="Give --capability X.Y to check for the GPUs the server will run on.",
        )
    if not env.torch_arch_list:
        return Check(
            name, Status.WARN, f"torch {env.torch_version} did not report its compiled architectures"
        )
    sass = [a for a in env.torch_arch_list if a.startswith("sm_")]
    ptx = [a for a in env.torch_arch_list if a.startswith("compute_")]
    results = [(cap, *coverage(sass, ptx, cap)) for cap in capabilities]
    evidence = (
        f"torch {env.torch_version} (CUDA {env.torch_cuda}) was built for: {' '.join(env.torch_arch_list)}",
        *(f"{format_capability(cap)}: {verdict.value}: {reason}" for cap, verdict, reason in results),
    )
    verdict = worst_coverage(v for _, v, _ in results)
    if verdict is Coverage.NONE:
        return Check(
            name,
            Status.FAIL,
            f"torch has no kernels for {_caps_text(capabilities)}: "
            "every CUDA op fails with 'no kernel image is available for execution on the device'",
            evidence,
            fix="Install a torch build that lists this architecture (a newer CUDA variant of the wheel).",
        )
    if verdict is Coverage.JIT:
        return Check(
            name,
            Status.WARN,
            "torch has only PTX for this GPU: the first start JIT-compiles every kernel "
            "(many minutes of silence that look like a hang)",
            evidence,
            fix="Install a torch build with SASS for this architecture; or let the first start run (the JIT "
            "cache keeps the result).",
        )
    return Check(
        name, Status.PASS, f"torch {env.torch_version} has SASS for {_caps_text(capabilities)}", evidence
    )


def check_extension_arch(
    modules: Sequence[ModuleCoverage], capabilities: Sequence[Capability], scanned: int, seconds: float
) -> Check:
    name = "extension-architectures"
    if not capabilities:
        return Check(
            name,
            Status.WARN if modules else Status.PASS,
            f"{plural(len(modules), 'module')} with GPU code, but no GPU to check them against",
            fix="Give --capability X.Y to check for the GPUs the server will run on." if modules else None,
        )
    header = f"scanned {scanned} shared objects in {seconds:.2f} s; {len(modules)} carry GPU code"
    bad = [m for m in modules if m.verdict is Coverage.NONE]
    core = [m for m in bad if m.feature is None]
    slow = [m for m in modules if m.verdict is Coverage.JIT]
    evidence = [header]
    evidence += [
        f"NONE {m.path}: {m.reason}" + (f" (only for {m.feature})" if m.feature else "")
        for m in bad[:_MAX_LISTED]
    ]
    evidence += [f"JIT  {m.path}: {m.reason}" for m in slow[:_MAX_LISTED]]
    if len(bad) + len(slow) > 2 * _MAX_LISTED:
        evidence.append("(more in --report-json)")
    if core:
        return Check(
            name,
            Status.FAIL,
            f"{len(core)} of {len(modules)} GPU modules have no code for {_caps_text(capabilities)}: their "
            "kernels "
            "fail with 'no kernel image is available', or the engine dies or hangs picking a fallback",
            tuple(evidence),
            fix="Install wheels built for this architecture (check the package's release notes "
            "for sm_XY support), or build them with TORCH_CUDA_ARCH_LIST set to it.",
        )
    if bad:
        features = sorted({m.feature for m in bad if m.feature})
        return Check(
            name,
            Status.WARN,
            f"{'; '.join(features)}: not usable on {_caps_text(capabilities)} "
            f"({plural(len(bad), 'module')} used only by it {'has' if len(bad) == 1 else 'have'} no code "
            "for this GPU); every other GPU module has code for it",
            tuple(evidence),
            fix="Only matters if the server is set to use it (an attention backend, a kernel option): "
            "let the engine pick another, or install a build for this GPU.",
        )
    if slow:
        return Check(
            name,
            Status.WARN,
            f"{len(slow)} GPU modules only have PTX for {_caps_text(capabilities)}: "
            "the first start JIT-compiles them (slow, silent)",
            tuple(evidence),
            fix="Prefer wheels with SASS for this GPU; a first start that seems stuck may be this JIT.",
        )
    return Check(
        name,
        Status.PASS,
        f"all {len(modules)} GPU modules have SASS for {_caps_text(capabilities)}",
        tuple(evidence),
    )


def check_arch_directories(
    modules: Sequence[ModuleCoverage], capabilities: Sequence[Capability]
) -> Check | None:
    """A package with one build per architecture directory: does its loader pick one that runs here?"""
    name = "arch-directories"
    by_package: dict[str, dict[str, list[ModuleCoverage]]] = defaultdict(lambda: defaultdict(list))
    for m in modules:
        found = arch_directory(m.path)
        if found is not None and m.package:
            by_package[m.package][found[0]].append(m)
    if not by_package or not capabilities:
        return None
    status = Status.PASS
    evidence: list[str] = []
    fixes: list[str] = []
    for package, dirs in sorted(by_package.items()):
        evidence.append(f"{package} ships builds in {', '.join(sorted(dirs))}")
        for cap in capabilities:
            cap_text = format_capability(cap)
            known = loader_choice(package, cap)
            if known is not None:
                chosen, source = known
                picked = dirs.get(chosen, [])
                verdicts = [dict(m.by_capability).get(cap_text, m.verdict) for m in picked]
                worst_v = worst_coverage(verdicts) if picked else Coverage.NONE
                found = arch_directory(picked[0].path) if picked else None
                dir_cap = found[1] if found else None
                other = dir_cap is not None and dir_cap != cap
                line = f"on {cap_text} its loader picks {chosen}/ ({source})"
                if other:
                    line += f": a directory built for {format_capability(dir_cap)}"  # type: ignore[arg-type]
                line += f"; that code: {worst_v.value}"
                evidence.append(line)
                if worst_v is Coverage.NONE:
                    status = Status.FAIL
                    fixes.append(
                        f"{package}: its loader loads {chosen}/ on {cap_text}, which has no code for it; "
                        "install "
                        f"a {package} build for sm_{cap[0]}{cap[1]} (or one whose {chosen}/ includes it)"
                    )
                elif worst_v is Coverage.JIT and status is Status.PASS:
                    status = Status.WARN
                continue
            match = [
                d
                for d, ms in dirs.items()
                if any(dict(m.by_capability).get(cap_text) is Coverage.NATIVE for m in ms)
            ]
            exact = [d for d in dirs if (arch_directory(f"{d}/x") or ("", (0, 0), ""))[1] == cap]
            if not exact:
                evidence.append(
                    f"on {cap_text}: no directory is named for it; native code in: "
                    f"{', '.join(sorted(match)) or 'none'}"
                    "; which one the package's loader picks is not known to hangwatch"
                )
                if status is Status.PASS:
                    status = Status.WARN
                fixes.append(
                    f"{package}: check which build its loader imports on {cap_text} (e.g. with its debug "
                    "logging)"
                )
    summary = {
        Status.PASS: "per-architecture builds: the one each loader picks runs on this GPU",
        Status.WARN: "a per-architecture build may be picked for another GPU architecture",
        Status.FAIL: "a loader picks a build made for another GPU architecture, with no code for this one",
    }[status]
    return Check(name, status, summary, tuple(evidence), "; ".join(dict.fromkeys(fixes)) or None)


def check_crosscheck(disagreements: Sequence[str], compared: int, tool: str | None) -> Check | None:
    if tool is None or compared == 0:
        return None
    if disagreements:
        return Check(
            "fatbin-crosscheck",
            Status.WARN,
            f"cuobjdump disagrees with hangwatch's fatbin reader on {len(disagreements)} of {compared} "
            "modules",
            tuple(disagreements[:_MAX_LISTED]),
            fix="Trust cuobjdump's list; please report the module to hangwatch.",
        )
    return Check(
        "fatbin-crosscheck",
        Status.PASS,
        f"cuobjdump ({tool}) agrees on {'the' if compared == 1 else 'all'} "
        f"{plural(compared, 'module')} compared",
    )
