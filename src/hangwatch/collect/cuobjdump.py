"""The ``cuobjdump`` boundary: NVIDIA's own list of the SASS and PTX in a library, when it is installed.

Used to cross-check the pure-Python reader (collect/fatbin.py), never instead of it: doctor must
work where the CUDA toolkit is absent. ``cuobjdump --list-elf --list-ptx FILE`` prints lines like

    ELF file    1: name.1.sm_90a.cubin
    PTX file    1: name.1.sm_90.ptx

It names PTX by the ``sm_`` of its virtual architecture, prints family-specific code without its
``f`` (``sm_100f`` shows as ``sm_100``), and lists only ``.nv_fatbin`` of a linked library.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_LINE = re.compile(r"^(?P<kind>ELF|PTX) file\s+\d+:\s+\S*?\.(?P<target>sm_\d+[a-z]?)\.(?:cubin|ptx)\s*$")


@dataclass(frozen=True)
class CuobjdumpListing:
    sass: frozenset[str] = frozenset()  # "sm_90a"
    ptx: frozenset[str] = frozenset()  # "compute_90"
    error: str | None = None


def find_cuobjdump() -> str | None:
    """``$HANGWATCH_CUOBJDUMP``, then PATH, then ``$CUDA_HOME/bin`` and /usr/local/cuda/bin."""
    override = os.environ.get("HANGWATCH_CUOBJDUMP")
    if override:
        return override if Path(override).is_file() else None
    found = shutil.which("cuobjdump")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "cuobjdump").is_file():
            return str(Path(home) / "bin" / "cuobjdump")
    return None


def parse_listing(text: str) -> CuobjdumpListing:
    sass: set[str] = set()
    ptx: set[str] = set()
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m is None:
            continue
        target = m.group("target")
        if m.group("kind") == "ELF":
            sass.add(target)
        else:
            ptx.add("compute_" + target[3:])
    return CuobjdumpListing(frozenset(sass), frozenset(ptx))


def list_targets(path: str, exe: str, timeout_s: float = 30.0) -> CuobjdumpListing:
    try:
        proc = subprocess.run(
            [exe, "--list-elf", "--list-ptx", path],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return CuobjdumpListing(error=f"cuobjdump took more than {timeout_s:.0f} s")
    except OSError as exc:
        return CuobjdumpListing(error=f"cuobjdump could not run: {exc}")
    listing = parse_listing(proc.stdout)
    # It exits non-zero (255) when a file has no PTX or no ELF at all; that is an empty listing, not an error.
    benign = ("does not contain device code", "No ELF file", "No PTX file")
    if (
        proc.returncode != 0
        and not listing.sass
        and not listing.ptx
        and not any(b in proc.stderr for b in benign)
    ):
        lines = proc.stderr.strip().splitlines()
        return CuobjdumpListing(error=lines[-1] if lines else f"exit {proc.returncode}")
    return listing


def normalise_for_cuobjdump(sass: tuple[str, ...]) -> frozenset[str]:
    """Our SASS names as cuobjdump prints them (it drops the family suffix ``f``)."""
    return frozenset(s[:-1] if s.endswith("f") else s for s in sass)
