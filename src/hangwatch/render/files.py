"""Writing the files a command was asked for (``--report-json``, ``--report-html``, ``--report-md``).

Each is written to a temporary file beside it and renamed into place, so a reader never sees half a
report; a write that fails leaves no temporary file behind and is reported, never raised: the
verdict has been printed by then, and a report that cannot be written must not cost it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """``text`` into ``path`` (UTF-8) through ``PATH.tmp`` and a rename; the temporary file never stays."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_outputs(outputs: list[tuple[str, Path | None, Callable[[Path], None]]]) -> bool:
    """Call each ``(flag, path, writer)`` whose path is set; a failure is said on stderr with its flag.

    True when every file was written.
    """
    ok = True
    for flag, path, writer in outputs:
        if path is None:
            continue
        try:
            writer(path)
        except OSError as exc:
            ok = False
            reason = exc.strerror or str(exc)
            print(f"hangwatch: error: {flag} {path}: not written: {reason}", file=sys.stderr, flush=True)
    return ok


def output_path_problem(path: Path, example_name: str = "report") -> str | None:
    """Why ``path`` cannot take a report (checked before a command starts), or None when it can."""
    if not path.name or path.is_dir():
        return f"is a folder: give a file in it, e.g. {path / example_name}"
    parent = path.parent
    if not parent.exists():
        return f"the folder {parent} does not exist: create it first (mkdir -p {parent}) or give another path"
    if not parent.is_dir():
        return f"{parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return (
            f"cannot create files in {parent} (permission denied): give a path in a folder you can write to"
        )
    if path.exists() and not os.access(path, os.W_OK):
        return "the file exists and is not writable: remove it or give another path"
    return None
