"""``hangwatch demo``: the bundled story (story.py) under ``hangwatch run --until-ready``, explained after."""

from __future__ import annotations

import sys
from pathlib import Path

from hangwatch.model.vocabulary import State
from hangwatch.run import run_supervised
from hangwatch.supervise.plan import WatchOptions
from hangwatch.supervise.session import RunOptions

STALLED_EXIT = State.STALLED.exit_code


def run_demo(
    *,
    ranks: int,
    stall_after_s: float,
    run_dir: Path,
    report_json: Path | None,
    report_html: Path | None,
    report_md: Path | None,
    quiet: bool,
) -> int:
    """Exit 0 when the story ends, as it should, in a stall verdict; otherwise run's exit code.

    The run folder is ``run_dir`` (the CLI's default: a new one where ``hangwatch run`` puts its own),
    never a temporary folder: the verdict names the log in it for the user to open afterwards.
    """
    watch = WatchOptions(
        engine="sglang",
        ready_url=None,
        ready_pattern=None,
        waiting_patterns=(),
        stall_after_s=stall_after_s,
        timeout=None,
        interval=1.0,
        report_json=report_json,
        quiet=quiet,
        probe_timeout=2.0,
        report_html=report_html,
        report_md=report_md,
        own_request=True,  # run's default
    )
    options = RunOptions(
        watch=watch,
        command=(sys.executable, "-m", "hangwatch.demo.story", "--ranks", str(ranks)),
        until_ready=True,
        run_dir=run_dir,  # output.log and run.json: the verdict names the log, so it outlives the demo
        grace=3.0,
    )
    # No preflight: the demo's "engine" is a story on this machine, not a server to check it for.
    code = run_supervised(options)
    if code != STALLED_EXIT:
        print(f"\nThe demo should end in a stall verdict (exit {STALLED_EXIT}), but hangwatch exited {code}.")
        return code
    print(
        "\nThat was the demo: the ranks loaded their weights, then waited on each other forever "
        "(0 % CPU, no log, no port). `hangwatch run` exits 3 for a stall; the demo exits 0 because "
        "that is the outcome it exists to show."
    )
    return 0
