"""The Rich live view on a real (pseudo-)terminal, with a server that prints what Rich would take for markup."""

from __future__ import annotations

import re
import sys

import pytest

from hwrun import run_in_terminal

pytestmark = pytest.mark.timeout(90)

# A path in brackets (a closing tag to Rich: MarkupError), PyTorch's rank prefix, a colour name.
SERVER = (
    "import sys, time\n"
    "print('[rank1]: loading [red]weights[/red] from [/models/foo]', flush=True)\n"
    "time.sleep(2)\n"
    "raise RuntimeError('no checkpoint at [/models/foo] for [rank1]')\n"
)


def test_server_text_in_brackets_is_shown_as_written_and_the_verdict_survives(tmp_path):
    out = run_in_terminal(
        ["run", "--run-dir", str(tmp_path / "run"), "--no-doctor", "--stall-after", "20", "--",
         sys.executable, "-c", SERVER],
        tmp_path,
    )  # fmt: skip
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.stdout)
    assert "MarkupError" not in screen, screen[-3000:]
    assert out.rc == 4, screen[-3000:]
    assert out.verdict["state"] == "crashed"
    assert "[hangwatch] supervising" in screen  # our own prefix shows
    assert "[rank1]: loading [red]weights[/red] from [/models/foo]" in screen
    assert "hangwatch verdict: CRASHED" in screen
    assert "\x1b[31m" not in out.stdout  # [red] recoloured nothing
