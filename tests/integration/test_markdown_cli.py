"""`run --report-md`: the Markdown carries the versions of the command's environment and its last log lines."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = (
    "import os, sys\n"
    "for i in range(40):\n"
    "    print(f'step {i}')\n"
    "print('token is', os.environ['HF_TOKEN'])\n"
    "sys.exit('RuntimeError: boom')\n"
)


def test_markdown_has_versions_and_the_last_log_lines(hw, tmp_path):
    md_path = tmp_path / "report.md"
    secret = "s3cr3t-value-0123456789"
    out = hw(
        "run", "--quiet", "--no-doctor", "--report-md", str(md_path), "--", sys.executable, "-c", SCRIPT,
        env={"HF_TOKEN": secret},
    )  # fmt: skip
    assert out.rc == 4, out.stdout + out.stderr
    md = md_path.read_text()
    version_block = md.split("Versions:\n\n```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert version_block[0] == f"Python:    {sys.version.split()[0]}"
    assert any(line.startswith("torch:") for line in version_block)
    log_block = md.split("log lines of `", 1)[1].split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert len(log_block) == 30
    assert log_block[-3:] == ["step 39", "token is ***", "RuntimeError: boom"]
    assert secret not in md
    assert out.report is not None and out.report["log_tail"][-1] == "RuntimeError: boom"
    assert out.report["environment"]["Python"] == sys.version.split()[0]
