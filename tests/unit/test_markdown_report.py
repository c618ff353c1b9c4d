"""The Markdown for an issue tracker: versions and the last log lines, exactly; bounded, redacted, fenced."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import sys
from pathlib import Path

from hangwatch.collect.logtail import tail_lines
from hangwatch.collect.versions import distributions_with
from hangwatch.collect.versions import driver_version
from hangwatch.collect.versions import environment_versions
from hangwatch.collect.versions import python_versions
from hangwatch.engines import registry
from hangwatch.model.doctor import GpuFacts
from hangwatch.model.doctor import GpuInventory
from hangwatch.model.report import Report
from hangwatch.model.report import Verdict
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State
from hangwatch.render.json_report import report_to_dict
from hangwatch.render.markdown import markdown_report

ENV = {
    "Python": "3.12.3",
    "torch": "2.8.0+cu128",
    "torch CUDA": "12.8",
    "vllm": "0.10.2",
    "NVIDIA driver": "570.86.15",
    "CUDA (driver)": "12.8",
    "GPUs": "8x NVIDIA H200",
    "hangwatch": "0.1.0",
    "OS": "Linux 6.8.0 x86_64",
}


def small_report(**changes: object) -> Report:
    verdict = Verdict(
        state=State.CRASHED,
        cause=Cause.EXCEPTION,
        phase=None,
        summary="the command failed: RuntimeError: boom",
        culprits=(),
        evidence=("log: RuntimeError: boom",),
    )
    report = Report(
        schema="hangwatch.report/1", engine="vllm", mode="run", command=("vllm", "serve", "M"),
        started_at="2025-01-01T00:00:00+00:00", duration_s=12.0, log_path="/runs/1/output.log",
        verdict=verdict, phases=(), processes=(), probes=(), timeline=(),
    )  # fmt: skip
    return dataclasses.replace(report, **changes)  # type: ignore[arg-type]


def test_versions_and_last_log_lines_exactly():
    md = markdown_report(
        small_report(environment=ENV, log_tail=("INFO loading weights", "RuntimeError: boom"))
    )
    assert md == (
        "### hangwatch: **CRASHED** — cause `exception`\n"
        "\n"
        "the command failed: RuntimeError: boom\n"
        "\n"
        "- engine profile: `vllm`, mode `run`, watched 12 s (started 2025-01-01T00:00:00+00:00)\n"
        "- command: `vllm serve M`\n"
        "\n"
        "Versions:\n"
        "\n"
        "```text\n"
        "Python:        3.12.3\n"
        "torch:         2.8.0+cu128\n"
        "torch CUDA:    12.8\n"
        "vllm:          0.10.2\n"
        "NVIDIA driver: 570.86.15\n"
        "CUDA (driver): 12.8\n"
        "GPUs:          8x NVIDIA H200\n"
        "hangwatch:     0.1.0\n"
        "OS:            Linux 6.8.0 x86_64\n"
        "```\n"
        "\n"
        "Last 2 log lines of `/runs/1/output.log`:\n"
        "\n"
        "```text\n"
        "INFO loading weights\n"
        "RuntimeError: boom\n"
        "```\n"
        "\n"
        "Evidence:\n"
        "\n"
        "```text\n"
        "log: RuntimeError: boom\n"
        "```\n"
        "\n"
        "_Report written by hangwatch._\n"
    )


def test_no_sections_when_nothing_was_read():
    md = markdown_report(small_report())
    assert "Versions:" not in md and "log lines" not in md


def test_log_tail_is_bounded_redacted_and_cannot_close_its_fence():
    lines = (
        *tuple(f"line {i}" for i in range(50)),
        "token hf_abcdefghijklmnopqrstuvwxyz0123",
        "```` closing? ```",
    )
    md = markdown_report(small_report(log_tail=lines))
    block = md.split("log lines of `/runs/1/output.log`:\n\n```text\n", 1)[1].split("\n```\n", 1)[0]
    shown = block.splitlines()
    assert len(shown) == 30
    assert shown[0] == "line 22"
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in md
    assert "```" not in block  # four backticks included: every run of three is broken up
    assert shown[-1].replace("\u200b", "") == "```` closing? ```"


def test_json_carries_environment_and_log_tail():
    data = report_to_dict(small_report(environment={"Python": "3.12.3"}, log_tail=("a",)))
    assert data["environment"] == {"Python": "3.12.3"}
    assert data["log_tail"] == ["a"]


def test_tail_lines_reads_only_the_end(tmp_path: Path):
    log = tmp_path / "output.log"
    body = b"".join(b"x%05d\n" % i for i in range(20000))  # 140 kB
    log.write_bytes(body + b"load 10%\rload 55%\rload 100%\n\x1b[31mred\x1b[0m\n\n   \nlast, no newline")
    # The colour's escapes are stripped whole (clean_text), not only their ESC byte.
    assert tail_lines(log, n=4) == ("x19999", "load 100%", "red", "last, no newline")
    # 62 bytes after x19999's newline: with 70 the read starts inside x19998, whose piece is dropped.
    assert tail_lines(log, n=100, max_bytes=70)[0] == "x19999"
    assert tail_lines(log, n=100, max_bytes=62)[0] == "load 100%"
    assert tail_lines(tmp_path / "missing") == ()
    long = tmp_path / "long.log"
    long.write_text("y" * 1000 + "\n")
    assert tail_lines(long, max_chars=10) == ("yyyyyyyyy\u2026",)


def test_python_versions_from_the_interpreter_itself():
    wanted = distributions_with(registry.distributions())
    found = python_versions(sys.executable, wanted)
    expected = {"python": sys.version.split()[0]}
    for name in wanted:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            expected[name] = importlib.metadata.version(name)
    found.pop("torch_cuda", None)  # absent for a CPU build; read from torch/version.py otherwise
    assert found == expected
    assert "torch" in found  # the test environment has torch


def test_driver_version_from_proc(tmp_path: Path):
    nv = tmp_path / "driver" / "nvidia"
    nv.mkdir(parents=True)
    (nv / "version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16)\n"
        "GCC version:  gcc version 12.3.0\n"
    )
    assert driver_version(tmp_path) == "570.86.15"
    (nv / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\n"
    )
    assert driver_version(tmp_path) == "550.54.15"
    assert driver_version(tmp_path / "none") is None


def test_environment_versions_in_template_order(tmp_path: Path):
    answer = (
        'noise\nHANGWATCH-VERSIONS {"python": "3.12.3", "transformers": "4.56.0", "torch": "2.8.0+cu128", '
        '"torch_cuda": "12.8", "vllm": "0.10.2"}\n'
    )
    inventory = GpuInventory(
        driver_version="570.86.15",
        cuda_driver_version=(12, 8),
        gpus=(GpuFacts(0, "NVIDIA H200", (9, 0)), GpuFacts(1, "NVIDIA H200", (9, 0))),
    )
    env = environment_versions(
        ("vllm", "serve"),
        python="/venv/bin/python",
        run=lambda argv, timeout: answer if argv[0] == "/venv/bin/python" else None,
        inventory=lambda: inventory,
        proc_root=tmp_path,
        engines=registry.distributions(),
    )
    assert list(env) == [
        "Python", "torch", "torch CUDA", "vllm", "transformers", "NVIDIA driver", "CUDA (driver)", "GPUs",
        "hangwatch", "OS",
    ]  # fmt: skip
    assert (
        env["torch CUDA"] == "12.8"
        and env["GPUs"] == "2x NVIDIA H200"
        and env["NVIDIA driver"] == "570.86.15"
    )


def test_environment_of_a_command_that_is_not_python(tmp_path: Path):
    env = environment_versions(
        ("/bin/sleep", "1"),
        run=lambda argv, timeout: None,
        inventory=GpuInventory,
        proc_root=tmp_path,
        engines=registry.distributions(),
    )
    assert list(env) == ["hangwatch", "OS"]


def test_one_log_line_is_one_line():
    assert "\nLast log line of `/runs/1/output.log`:\n" in markdown_report(small_report(log_tail=("only",)))
