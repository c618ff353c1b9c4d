"""What one ``bench`` invocation asks for, parsed once from the command line into a frozen value."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hangwatch.model.bench import Endpoint
from hangwatch.model.bench import Workload


@dataclass(frozen=True)
class BenchOptions:
    urls: tuple[str, ...]  # one or two base URLs: A, then B
    workload: Workload
    launch: tuple[tuple[str, ...] | None, ...]  # per URL: the command that starts that server, or None
    boot_timeout_s: float
    stall_after_s: float
    run_dir: Path
    probe_timeout_s: float
    report_json: Path | None
    report_html: Path | None
    quiet: bool
    metrics: bool = True  # read /metrics (server-side view, speculative acceptance)


def base_url_of(url: str) -> str:
    """``http://h:p``, ``http://h:p/``, ``http://h:p/v1``, ``.../v1/completions``: all the same server."""
    trimmed = url.rstrip("/")
    for suffix in (Endpoint.CHAT.path, Endpoint.COMPLETIONS.path, "/v1/models", "/v1"):
        if trimmed.endswith(suffix):
            return trimmed[: -len(suffix)]
    return trimmed
