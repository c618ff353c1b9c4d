"""The boundary to the server's own Python environment: asked in a subprocess, never imported here.

``describe_env(python)`` runs ``PYTHON -c SCRIPT ARGS_JSON``; the script prints one JSON line:
the Python and package versions, torch's CUDA version, compiled architectures and NCCL version
(torch is the only package it imports, with the NVML-based availability check so that CUDA is
not initialised), the site-packages folders, and every shared object in them (each with the
package it belongs to). Listing files is cheap; telling which carry GPU code (their ELF section
names) and reading their fat binaries is collect/fatbin.py's job, in our process.

``quick_env(python, engines)`` is the fast path for ``hangwatch run``'s preflight: no subprocess, only
the version files torch and the engines install (``torch/version.py``, ``*.dist-info``) read
from the environment's site-packages.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hangwatch.model.doctor import ExtensionModule
from hangwatch.model.doctor import PyEnvFacts

# torch, the engines' own packages (passed in: the registry's distributions()), then these.
LIBRARIES = (
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "flash-attn",
    "flash-attn-3",
    "deep-gemm",
    "triton",
    "transformers",
    "nvidia-nccl-cu11",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime",
)


def distributions_with(engines: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(("torch", *engines, *LIBRARIES)))


_MARKER = "HANGWATCH-PYENV "

# Runs inside the target interpreter (any Python >= 3.8): keep it to the standard library, and to
# torch. Parameters come as one JSON argument, never pasted into the source.
SCRIPT = r"""
import json, os, sys, time
t0 = time.time()
args = json.loads(sys.argv[1])
out = {"python_version": sys.version.split()[0]}
sp = []
try:
    import site
    sp.extend(site.getsitepackages())
    sp.append(site.getusersitepackages())
except Exception:
    pass
for p in sys.path:
    if p.endswith(("site-packages", "dist-packages")) and p not in sp:
        sp.append(p)
out["site_packages"] = [p for p in sp if os.path.isdir(p)]
try:
    import importlib.metadata as md
    versions = {}
    for name in args["distributions"]:
        try:
            versions[name] = md.version(name)
        except Exception:
            pass
    out["packages"] = versions
except ImportError:
    out["packages"] = {}
t1 = time.time()
exts = []
seen = set()
def add(path, package):
    try:
        real = os.path.realpath(path)
        if real in seen:
            return
        seen.add(real)
        exts.append([path, package, os.path.getsize(path)])
    except OSError:
        pass
# Every shared object of every package (site-packages, and what else is on sys.path: PYTHONPATH,
# .pth entries; not the standard library, not the current directory): which of them carry GPU code
# is read from their ELF headers afterwards (collect/fatbin.py), not guessed from package names.
import sysconfig
stdlib = set()
for k in ("stdlib", "platstdlib"):
    s = os.path.realpath(sysconfig.get_paths()[k])
    stdlib |= {s, os.path.join(s, "lib-dynload")}
roots = []
for p in out["site_packages"] + [p for p in sys.path if p and os.path.isdir(p)]:
    real = os.path.realpath(p)
    if real not in roots and real not in stdlib:
        roots.append(real)
roots = [r for r in roots if not any(r != o and r.startswith(o + os.sep) for o in roots)]
for d in roots:
    for dirpath, dirnames, filenames in os.walk(d):
        rel = os.path.relpath(dirpath, d)
        parts = [] if rel == "." else rel.split(os.sep)
        top = "/".join(parts[:2]) if parts[:1] == ["nvidia"] else (parts[0] if parts else None)
        skip = (".dist-info", ".egg-info", "__pycache__")
        dirnames[:] = sorted(x for x in dirnames if not x.endswith(skip))
        for f in sorted(filenames):
            if f.endswith(".so") or ".so." in f:
                add(os.path.join(dirpath, f), top or f.split(".")[0])
out["extensions"] = exts
out["listing_s"] = time.time() - t1
import importlib.util
if args["torch"]:
    try:
        found = importlib.util.find_spec("torch") is not None
    except Exception:
        found = False
    if found:
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        try:
            import torch
            out["torch_version"] = str(torch.__version__)
            out["torch_cuda"] = torch.version.cuda
            flags = getattr(torch._C, "_cuda_getArchFlags", None)
            arch = flags() if flags is not None else None
            out["torch_arch_list"] = arch.split() if arch else []
            try:
                v = torch.cuda.nccl.version()
                out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
            except Exception:
                pass
        except Exception as e:
            out["torch_error"] = "%s: %s" % (type(e).__name__, e)
out["elapsed_s"] = time.time() - t0
sys.stdout.write("\n" + __MARKER__ + json.dumps(out) + "\n")
""".replace("__MARKER__", repr(_MARKER))


def describe_env(
    python: str,
    *,
    engines: Sequence[str],
    import_torch: bool = True,
    timeout_s: float = 120.0,
) -> PyEnvFacts:
    """Ask the interpreter at ``python`` about its environment; errors become ``PyEnvFacts.error``.
    ``engines``: the engines' packages (the registry's distributions())."""
    exe = shutil.which(python) or python
    args = json.dumps({"distributions": distributions_with(engines), "torch": import_torch})
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [exe, "-c", SCRIPT, args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return PyEnvFacts(
            python, error=f"{python} did not answer within {timeout_s:.0f} s (importing torch hung?)"
        )
    except OSError as exc:
        return PyEnvFacts(python, error=f"cannot run {python}: {exc.strerror or exc}")
    elapsed = time.monotonic() - started
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARKER):
            try:
                return facts_from_json(python, json.loads(line[len(_MARKER) :]), elapsed)
            except (ValueError, TypeError) as exc:
                return PyEnvFacts(python, error=f"{python} answered with something unreadable: {exc}")
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return PyEnvFacts(python, error=f"{python} exited {proc.returncode} without an answer: {tail}")


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def facts_from_json(python: str, data: dict[str, Any], elapsed_s: float = 0.0) -> PyEnvFacts:
    packages = data.get("packages") or {}
    exts = []
    for item in data.get("extensions") or []:
        if isinstance(item, list) and len(item) == 3:
            exts.append(ExtensionModule(str(item[0]), str(item[1]), int(item[2])))
    return PyEnvFacts(
        python=python,
        python_version=_str(data.get("python_version")),
        torch_version=_str(data.get("torch_version")),
        torch_cuda=_str(data.get("torch_cuda")),
        torch_arch_list=tuple(str(a) for a in data.get("torch_arch_list") or ()),
        torch_error=_str(data.get("torch_error")),
        nccl_version=_str(data.get("nccl_version")),
        packages=tuple(sorted((str(k), str(v)) for k, v in packages.items())),
        site_packages=tuple(str(p) for p in data.get("site_packages") or ()),
        extensions=tuple(exts),
        listing_s=float(data.get("listing_s") or 0.0),
        elapsed_s=elapsed_s,
    )


# -- the fast path: no subprocess ---------------------------------------------------------------

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
_VERSION_LINE = re.compile(
    r"^(__version__|cuda|git_version)\s*(?::\s*\S+\s*)?=\s*['\"]?([^'\"\n]*)['\"]?\s*$", re.M
)


def interpreter_of(command: tuple[str, ...]) -> str | None:
    """The Python that ``command`` runs: ``python ...`` itself, or the ``#!`` line of a console script."""
    if not command:
        return None
    exe = shutil.which(command[0])
    if exe is None:
        return None
    if _PYTHON_NAME.match(Path(command[0]).name):
        return exe
    try:
        with Path(exe).open("rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if first.startswith(b"#!"):
        parts = first[2:].decode("utf-8", "replace").split()
        if parts and _PYTHON_NAME.match(Path(parts[0]).name):
            return parts[0]
        if len(parts) >= 2 and Path(parts[0]).name == "env" and _PYTHON_NAME.match(parts[1]):
            return shutil.which(parts[1])
    return None


def site_packages_of(python: str) -> list[Path]:
    """The site-packages folders of a venv or prefix install, found from the interpreter's path alone."""
    prefix = Path(python).parent.parent
    found = sorted(prefix.glob("lib/python3*/site-packages")) + sorted(
        prefix.glob("lib/python3*/dist-packages")
    )
    return [p for p in found if p.is_dir()]


def quick_env(python: str, engines: Sequence[str]) -> PyEnvFacts:
    """Versions read from files (``torch/version.py``, ``*.dist-info`` names): milliseconds, no import.
    ``engines``: the engines' packages (the registry's distributions())."""
    started = time.monotonic()
    sites = site_packages_of(python)
    if not sites:
        return PyEnvFacts(python, error=f"no site-packages found beside {python}")
    torch_version = torch_cuda = None
    packages: dict[str, str] = {}
    wanted = {d.lower().replace("-", "_") for d in distributions_with(engines)}
    for site in sites:
        version_py = site / "torch" / "version.py"
        if torch_version is None and version_py.is_file():
            values = dict(_VERSION_LINE.findall(_read(version_py)))
            torch_version = values.get("__version__") or None
            cuda = values.get("cuda")
            torch_cuda = cuda if cuda and cuda != "None" else None
        try:
            names = [p.name for p in site.iterdir()]
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                dist, _, version = name[: -len(".dist-info")].partition("-")
                if dist.lower() in wanted:
                    packages.setdefault(dist.lower().replace("_", "-"), version)
    return PyEnvFacts(
        python=python,
        torch_version=torch_version,
        torch_cuda=torch_cuda,
        packages=tuple(sorted(packages.items())),
        site_packages=tuple(str(s) for s in sites),
        elapsed_s=time.monotonic() - started,
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
