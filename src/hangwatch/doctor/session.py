"""Doctor's two runs: the full checklist (``hangwatch doctor``) and the fast one ``hangwatch run`` makes.

Collect the facts (collect/), judge them (analyse/), return the checks. The fast preflight
imports nothing from the target environment and starts no interpreter: it reads version files,
asks NVML once, scans /proc once, and reads the fat binaries of only the modules a known
per-architecture loader would pick. Its budget is 2 s on a host with vLLM installed.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
import time
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hangwatch import engines
from hangwatch.analyse.doctor import checks as dc
from hangwatch.analyse.doctor import coverage as cov
from hangwatch.analyse.doctor import nccl as nccl_checks
from hangwatch.analyse.doctor.archcompat import LOADERS
from hangwatch.analyse.doctor.archcompat import Capability
from hangwatch.analyse.doctor.archcompat import format_capability
from hangwatch.analyse.doctor.archcompat import loader_choice
from hangwatch.collect import cuobjdump
from hangwatch.collect import host as hostinfo
from hangwatch.collect.fatbin import carries_device_code
from hangwatch.collect.fatbin import read_fatbins
from hangwatch.collect.nvml import read_inventory
from hangwatch.collect.pyenv import describe_env
from hangwatch.collect.pyenv import interpreter_of
from hangwatch.collect.pyenv import quick_env
from hangwatch.engines import registry
from hangwatch.engines.profile import flag_value
from hangwatch.model.doctor import DOCTOR_SCHEMA
from hangwatch.model.doctor import Check
from hangwatch.model.doctor import CheckpointFacts
from hangwatch.model.doctor import DoctorReport
from hangwatch.model.doctor import EntryKind
from hangwatch.model.doctor import GpuFacts
from hangwatch.model.doctor import GpuInventory
from hangwatch.model.doctor import HostFacts
from hangwatch.model.doctor import ModuleCoverage
from hangwatch.model.doctor import ModuleScan
from hangwatch.model.doctor import PortFacts
from hangwatch.model.doctor import PyEnvFacts
from hangwatch.render.doctor_text import doctor_text
from hangwatch.render.files import write_outputs
from hangwatch.render.json_report import write_report
from hangwatch.words import plural

CROSS_CHECK_BUDGET_S = 60.0


@dataclass(frozen=True)
class DoctorOptions:
    python: str | None = None
    port: int | None = None
    model: Path | None = None
    gpus: tuple[int, ...] | None = None
    capability: Capability | None = None
    command: tuple[str, ...] = ()
    scan: tuple[Path, ...] = ()
    cross_check: bool = True


def select_gpus(
    inventory: GpuInventory,
    gpus: tuple[int, ...] | None,
    capability: Capability | None,
    env: Mapping[str, str],
    planned: int = 1,
) -> list[GpuFacts]:
    """The GPUs the server will use: --gpus, else CUDA_VISIBLE_DEVICES, else all (--capability: planned,
    ``planned`` of them: the command's tensor-parallel size)."""
    if capability is not None:
        indices = gpus or tuple(range(max(planned, 1)))
        return [
            GpuFacts(
                i, f"planned GPU of capability {format_capability(capability)}", capability, synthetic=True
            )
            for i in indices
        ]
    chosen = list(inventory.gpus)
    if gpus is not None:
        chosen = [g for g in chosen if g.index in gpus]
    elif env.get("CUDA_VISIBLE_DEVICES") is not None:
        wanted = [v.strip() for v in env["CUDA_VISIBLE_DEVICES"].split(",") if v.strip()]
        chosen = [
            g
            for g in chosen
            if str(g.index) in wanted or any(g.uuid and g.uuid.startswith(w) for w in wanted)
        ]
    return chosen


def _capabilities(gpus: list[GpuFacts]) -> list[Capability]:
    return sorted({g.capability for g in gpus if g.capability is not None})


def model_of(command: tuple[str, ...]) -> Path | None:
    """The local checkpoint folder a command serves (``--model``, ``--model-path``, ``vllm serve DIR``)."""
    value = flag_value(command, "--model") or flag_value(command, "--model-path")
    if value is None and "serve" in command:
        after = command[command.index("serve") + 1 :]
        value = after[0] if after and not after[0].startswith("-") else None
    if value and Path(value).is_dir():
        return Path(value)
    return None


def port_of(command: tuple[str, ...], port: int | None) -> int | None:
    if port is not None:
        return port
    value = flag_value(command, "--port")
    if value is not None and value.isdigit():
        return int(value)
    profile = engines.detect(command) if command else None
    return profile.default_port if profile is not None else None


def _scan_paths(paths: tuple[Path, ...]) -> list[tuple[str, str | None]]:
    """(file, package) for each --scan argument: a file, or every *.so under a folder (package: its name)."""
    out: list[tuple[str, str | None]] = []
    for p in paths:
        if p.is_dir():
            out += [(str(f), p.name) for f in sorted(p.rglob("*.so*")) if f.is_file()]
        else:
            out.append((str(p), None))
    return out


def scan_modules(
    files: list[tuple[str, str | None]],
    capabilities: list[Capability],
    driver_cuda: tuple[int, int] | None,
    timings: dict[str, float] | None = None,
) -> tuple[list[ModuleScan], list[ModuleCoverage], float]:
    """Every shared object's ELF section headers first (cheap: which carry CUDA code), then the fat
    binaries of those that do. ``timings`` gets ``elf_headers_s`` and ``fatbins_s``."""
    started = time.monotonic()
    candidates = [(path, package) for path, package in files if carries_device_code(path)]
    headers_done = time.monotonic()
    scans: list[ModuleScan] = []
    modules: list[ModuleCoverage] = []
    for path, package in candidates:
        scan = read_fatbins(path)
        scans.append(scan)
        if scan.has_device_code:
            modules.append(cov.module_coverage(scan, capabilities, package, driver_cuda))
    if timings is not None:
        timings["elf_headers_s"] = headers_done - started
        timings["fatbins_s"] = time.monotonic() - headers_done
    return scans, modules, time.monotonic() - started


def cross_check(
    scans: list[ModuleScan], budget_s: float = CROSS_CHECK_BUDGET_S
) -> tuple[list[str], int, str | None]:
    tool = cuobjdump.find_cuobjdump()
    if tool is None:
        return [], 0, None
    deadline = time.monotonic() + budget_s
    disagreements: list[str] = []
    compared = 0
    for scan in scans:
        if not scan.has_device_code or time.monotonic() > deadline:
            continue
        listing = cuobjdump.list_targets(scan.path, tool)
        if listing.error:
            continue
        compared += 1
        ours_sass = cuobjdump.normalise_for_cuobjdump(scan.targets(EntryKind.SASS))
        ours_ptx = frozenset(scan.targets(EntryKind.PTX))
        if ours_sass != listing.sass or ours_ptx != listing.ptx:
            disagreements.append(
                f"{scan.path}: hangwatch {sorted(ours_sass | ours_ptx)}, cuobjdump "
                f"{sorted(listing.sass | listing.ptx)}"
            )
    return disagreements, compared, tool


def run_doctor(options: DoctorOptions, env: Mapping[str, str] | None = None) -> DoctorReport:
    env = os.environ if env is None else env
    timings: dict[str, float] = {}
    notes: list[str] = []
    t = time.monotonic()
    inventory = read_inventory()
    timings["nvml_s"] = time.monotonic() - t
    planned = nccl_checks.tensor_parallel(options.command) or 1
    gpus = select_gpus(inventory, options.gpus, options.capability, env, planned)
    caps = _capabilities(gpus)
    if inventory.unavailable:
        notes.append(f"GPU: {inventory.unavailable}")
    python = options.python or interpreter_of(options.command) or shutil.which("python3") or sys.executable
    notes.append(f"environment checked: {python}")
    t = time.monotonic()
    pyenv = describe_env(python, engines=registry.distributions())
    timings["environment_s"] = time.monotonic() - t
    files = [(e.path, e.package) for e in pyenv.extensions] + _scan_paths(options.scan)
    scans, modules, scan_s = scan_modules(files, caps, inventory.cuda_driver_version, timings)
    timings["fatbin_scan_s"] = scan_s
    timings["listing_s"] = pyenv.listing_s
    disagreements: list[str] = []
    compared, tool = 0, None
    if options.cross_check:
        t = time.monotonic()
        disagreements, compared, tool = cross_check(scans)
        timings["cuobjdump_s"] = time.monotonic() - t
        if tool is None:
            notes.append("cuobjdump not found: fatbin reader not cross-checked")
    t = time.monotonic()
    host = hostinfo.read_host(env, engine_caches=registry.cache_folders())
    model = options.model or model_of(options.command)
    checkpoint = hostinfo.checkpoint_size(model) if model is not None else None
    port = port_of(options.command, options.port)
    port_facts = hostinfo.check_port(port) if port is not None else None
    timings["host_s"] = time.monotonic() - t
    problems = [f"{s.path}: {p}" for s in scans for p in s.problems[:2]]
    if problems:
        notes.append(
            f"fatbin reader skipped damaged structures in {plural(len(problems), 'place')}, "
            f"e.g. {problems[0]}"
        )
    checks: list[Check | None] = [
        cov.check_extension_arch(modules, caps, len(files), scan_s),
        cov.check_torch_arch(pyenv, caps),
        cov.check_arch_directories(modules, caps),
        cov.check_crosscheck(disagreements, compared, tool),
        dc.check_versions(inventory, pyenv, planning=options.capability is not None),
        *_common_checks(
            inventory,
            host,
            gpus,
            env=env,
            command=options.command,
            pyenv=pyenv,
            checkpoint=checkpoint,
            port_facts=port_facts,
        ),
    ]
    return _report("full", caps=caps, checks=checks, modules=modules, timings=timings, notes=notes)


def _report(
    mode: str,
    *,
    caps: Sequence[Capability],
    checks: Sequence[Check | None],
    modules: Sequence[ModuleCoverage],
    timings: Mapping[str, float],
    notes: Sequence[str],
) -> DoctorReport:
    """The report of one doctor run; checks that did not apply (None) are left out."""
    return DoctorReport(
        schema=DOCTOR_SCHEMA,
        created_at=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        mode=mode,
        capabilities=tuple(format_capability(c) for c in caps),
        checks=tuple(c for c in checks if c is not None),
        modules=tuple(modules),
        timings={k: round(v, 3) for k, v in timings.items()},
        notes=tuple(notes),
    )


def _common_checks(
    inventory: GpuInventory,
    host: HostFacts,
    gpus: list[GpuFacts],
    *,
    env: Mapping[str, str],
    command: tuple[str, ...],
    pyenv: PyEnvFacts | None,
    checkpoint: CheckpointFacts | None,
    port_facts: PortFacts | None,
) -> list[Check | None]:
    cpu_only = pyenv is not None and pyenv.torch_version is not None and pyenv.torch_cuda is None
    return [
        dc.check_gpu_processes(inventory, host, gpus, ours=set()),
        dc.check_gpu_wedged(inventory, host, gpus),
        dc.check_shm(host),
        dc.check_open_files(host),
        dc.check_memlock(host, env),
        dc.check_memory(host, checkpoint, gpus, cpu_only),
        dc.check_cache_disk(host),
        dc.check_port(port_facts),
        nccl_checks.check_nccl_env(
            env, command=command, gpus=gpus, inventory=inventory, host=host, pyenv=pyenv
        ),
    ]


def loader_modules(
    site_packages: tuple[str, ...], capabilities: list[Capability]
) -> list[tuple[str, str | None]]:
    """The *.so files that known per-architecture loaders would import on these GPUs (and no others)."""
    files: list[tuple[str, str | None]] = []
    for site in site_packages:
        for package in LOADERS:
            root = Path(site) / package
            if not root.is_dir():
                continue
            choices = [loader_choice(package, cap) for cap in capabilities]
            for sub in sorted({c[0] for c in choices if c is not None}):
                files += [(str(f), package) for f in sorted((root / sub).glob("*.so")) if f.is_file()]
    return files


# Checks whose advice is about what vLLM and SGLang need (their open-files limit, their compile caches):
# not said before a program that is neither.
ENGINE_ONLY_CHECKS = frozenset({"open-files", "cache-disk"})


def fast_preflight(
    command: tuple[str, ...],
    port: int | None,
    env: Mapping[str, str] | None = None,
    engine: str | None = None,
) -> list[Check]:
    """The checks ``hangwatch run`` makes before it launches ``command`` (under 2 s, no interpreter run),
    only those that apply to it: ``engine`` (``--engine``) or the one its command line names."""
    checks = list(fast_report(command, port, env).checks)
    profile = engines.by_name(engine) if engine else engines.detect(command)
    if profile.name == "generic":
        checks = [c for c in checks if c.name not in ENGINE_ONLY_CHECKS]
    return checks


def fast_report(
    command: tuple[str, ...],
    port: int | None,
    env: Mapping[str, str] | None = None,
    capability: Capability | None = None,
    gpus: tuple[int, ...] | None = None,
) -> DoctorReport:
    env = os.environ if env is None else env
    started = time.monotonic()
    inventory = read_inventory()
    selected = select_gpus(inventory, gpus, capability, env, nccl_checks.tensor_parallel(command) or 1)
    caps = _capabilities(selected)
    python = interpreter_of(command)
    pyenv = quick_env(python, registry.distributions()) if python else None
    modules: list[ModuleCoverage] = []
    if pyenv is not None and not pyenv.error and caps:
        _scans, modules, _s = scan_modules(
            loader_modules(pyenv.site_packages, caps), caps, inventory.cuda_driver_version
        )
    host = hostinfo.read_host(env, engine_caches=registry.cache_folders())
    model = model_of(command)
    checkpoint = hostinfo.checkpoint_size(model) if model is not None else None
    chosen_port = port_of(command, port)
    port_facts = hostinfo.check_port(chosen_port) if chosen_port is not None else None
    checks: list[Check | None] = [
        cov.check_arch_directories(modules, caps),
        dc.check_versions(inventory, pyenv, planning=capability is not None) if pyenv is not None else None,
        *_common_checks(
            inventory,
            host,
            selected,
            env=env,
            command=command,
            pyenv=pyenv,
            checkpoint=checkpoint,
            port_facts=port_facts,
        ),
    ]
    notes = [f"GPU: {inventory.unavailable}"] if inventory.unavailable else []
    timings = {"total_s": time.monotonic() - started}
    return _report("fast", caps=caps, checks=checks, modules=modules, timings=timings, notes=notes)


def doctor(options: DoctorOptions, *, fast: bool, report_json: Path | None) -> int:
    """``hangwatch doctor``: the full checklist (``fast``: only the checks ``run`` makes), printed, and
    written as JSON when asked; the exit code says the worst status."""
    if fast:
        report = fast_report(options.command, options.port, capability=options.capability, gpus=options.gpus)
    else:
        report = run_doctor(options)
    print(doctor_text(report), flush=True)
    write_outputs([("--report-json", report_json, lambda path: write_report(report, path))])
    return report.exit_code
