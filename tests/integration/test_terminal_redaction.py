"""A crash whose message carries a secret and terminal colours, through a real ``hangwatch run``: every line
hangwatch prints is redacted as the reports are, the reports quote the log without escape sequences, and
the raw output kept in ``output.log`` is readable by its owner only."""

from __future__ import annotations

import stat
import sys

import pytest

from hwrun import assert_all_gone

pytestmark = pytest.mark.timeout(120)

# Too short for the hf_ shape: only HF_TOKEN's value (hangwatch's environment, which the tree inherits)
# says it is a secret. The live line showed it while the verdict block under it said ***.
HF_TOKEN = "hf_fakeTok3n9"
SHAPED = "hf_" + "Zq8RvT2mNx4LpW6yKc1BdF3hJs5GaE7u"  # a known shape: masked wherever it is found
# The escapes are built at run time: the traceback quotes the raise's source line, which must not hold
# them as text. A colour (SGR), a private mode (hide the cursor) and an OSC title ended by BEL.
PROGRAM = (
    "import os\n"
    "esc = chr(27)\n"
    "def sgr(code): return esc + '[' + code + 'm'\n"
    "print(sgr('32') + 'INFO' + sgr('0') + ' ' + esc + '[?' + '25l' + 'loading weights'"
    " + esc + ']' + '0;title' + chr(7), flush=True)\n"
    f"raise RuntimeError(sgr('1;31') + 'hub refused' + sgr('0') + ' token ' + os.environ['HF_TOKEN'] + ' {SHAPED}')\n"
)
ESCAPE_LEFTOVERS = ("\x1b", "[31m", "[1;31m", "[0m", "[32m", "[?25l", "]0;")


def test_a_crash_that_prints_a_token_in_colour(hw, tmp_path):
    program = tmp_path / "leaky_crash.py"
    program.write_text(PROGRAM)
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    out = hw(
        "run", "--no-doctor", "--stall-after", "30", "--report-html", str(html), "--report-md", str(md),
        "--", sys.executable, str(program),
        env={"HF_TOKEN": HF_TOKEN},
    )  # fmt: skip
    assert out.rc == 4, (out.stdout, out.stderr)
    assert out.report is not None
    assert_all_gone(out.report)

    # The terminal: the echo is the tree's own output, as it printed it; hangwatch's lines are redacted.
    shown = out.stdout + out.stderr
    assert HF_TOKEN in shown  # the echo of the traceback (the program really printed it)
    ours = [line for line in shown.splitlines() if line.startswith("[hangwatch]")]
    block = out.stdout[out.stdout.index("hangwatch verdict:") :]
    # The verdict is said once, in the block (the live line only says it came); the block redacts.
    assert not any(line.startswith("[hangwatch] verdict") for line in ours), ours
    assert "hub refused token ***" in block, block
    for text in (*ours, block):
        assert HF_TOKEN not in text and SHAPED not in text, text
        assert not any(e in text for e in ESCAPE_LEFTOVERS), text

    # The reports: redacted, and the log's escapes stripped whole (the ESC byte alone went before).
    reports = {"json": (tmp_path / "report.json").read_text(), "html": html.read_text(), "md": md.read_text()}
    for name, text in reports.items():
        assert HF_TOKEN not in text and SHAPED not in text, name
        left = [e for e in ESCAPE_LEFTOVERS if e in text]
        assert not left, (name, left)
    assert any("INFO loading weights" in line for line in out.report["log_tail"]), out.report["log_tail"]

    # output.log keeps every byte, so it is its owner's only, and the verdict says so where it names it.
    log = tmp_path / "run" / "output.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    raw = log.read_bytes()
    assert HF_TOKEN.encode() in raw and b"\x1b[1;31m" in raw
    assert f"log: {log} (the raw output, not redacted: mode 0600" in block


def test_an_error_line_is_redacted_as_every_other_line():
    """The error line quotes what was given (a path, a URL): a token in it is masked there too."""
    import subprocess

    from hwrun import hangwatch_argv

    token = "hf_" + "q" * 28
    done = subprocess.run(
        hangwatch_argv("run", "--report-json", f"/nonexistent/{token}/r.json", "--", "true"),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "hangwatch: error:" in done.stderr, done.stderr
    assert token not in done.stderr + done.stdout and "/nonexistent/***" in done.stderr
