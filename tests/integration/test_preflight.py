"""The preflight ``run`` prints before launching: each warning once, in one format, only what applies."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def _run_with_low_open_files(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    """hangwatch run under a hard open-files limit of 4096 (vLLM and SGLang want 65536: a warning)."""
    argv = [sys.executable, "-m", "hangwatch", "run", "--quiet", "--run-dir", str(tmp_path / "run"), *args]
    line = " ".join(f"'{a}'" for a in argv)
    return subprocess.run(
        ["bash", "-c", f"ulimit -Sn 4096 && ulimit -Hn 4096 && exec {line}"],
        capture_output=True, text=True, timeout=50, cwd=tmp_path,
    )  # fmt: skip


def test_an_engine_gets_its_warning_once(tmp_path):
    proc = _run_with_low_open_files(tmp_path, "--engine", "vllm", "--", sys.executable, "-c", "print(1)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("hangwatch preflight") == 1
    assert proc.stderr.count("WARN") == 1, proc.stderr  # not once in a table and again in details
    assert proc.stderr.count("vLLM and SGLang want 65536") == 1
    assert proc.stderr.count("ulimit -n: soft 4096, hard 4096") == 1
    assert proc.stderr.count("fix: ") == 1


def test_a_generic_program_gets_no_engine_advice(tmp_path):
    proc = _run_with_low_open_files(tmp_path, "--", sys.executable, "-c", "print(1)")
    assert proc.returncode == 0, proc.stderr
    assert "vLLM" not in proc.stderr and "SGLang" not in proc.stderr, proc.stderr
    assert "open-files" not in proc.stderr
