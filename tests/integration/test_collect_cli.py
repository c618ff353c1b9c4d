"""``hangwatch collect`` through the real CLI on this machine: what a node sends is a bundle that decodes into
the analysis' objects, selects only what was asked for, and carries no secret."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hangwatch.nodes import codec
from hwrun import hangwatch_argv
from proc_helpers import spawn
from proc_helpers import wait_until

pytestmark = pytest.mark.timeout(120)

SECRET = "sk-abcdefghijklmnopqrstuvwxyz012345"


def collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hangwatch_argv("collect", *args), capture_output=True, text=True, timeout=60, check=False
    )


def test_a_full_bundle_of_a_matched_tree_decodes_and_hides_secrets() -> None:
    script = "import time\ndef waiting_here():\n    time.sleep(600)\nwaiting_here()\n"
    argv = [sys.executable, "-c", script, "--api-key", SECRET, "hw-collect-probe"]
    env = {"RANK": "2", "WORLD_SIZE": "4", "OPENAI_API_KEY": SECRET, "PATH": "/usr/bin:/bin"}
    with spawn(argv, env=env) as proc:
        wait_until(lambda: _sleeping(proc.pid), 30, what="the probe asleep")
        out = collect("--match", "hw-collect-probe", "--samples", "2", "--every", "0.3", "--no-native")
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout  # argv redacted, the environment never read beyond the allow-list
        bundle = codec.decode(out.stdout)
        (p,) = bundle.processes  # the probe only: not the collector, whose argv has the pattern too
        assert p.pid == proc.pid and (p.rank, p.rank_source, p.world_size) == ("2", "env:RANK", 4)
        assert set(p.env) == {"RANK", "WORLD_SIZE"}
        assert len(bundle.stacks) == 2
        frames = [f.name for f in bundle.stacks[-1].processes[0].threads[0].frames]
        assert "waiting_here" in frames
        assert bundle.errors == ()


def test_census_takes_no_stacks_and_nothing_matched_is_an_error_not_a_crash() -> None:
    out = collect("--match", "no-such-process-zq9", "--mode", "census", "--every", "0.1")
    assert out.returncode == 0, out.stderr
    bundle = codec.decode(out.stdout)
    assert bundle.stacks == () and bundle.processes == ()
    assert [e.stage for e in bundle.errors] == ["select"]


def test_stacks_across_hosts_needs_a_match() -> None:
    out = subprocess.run(
        hangwatch_argv("stacks", "--hosts", "node[1-2]"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "--match REGEX" in out.stderr


def _sleeping(pid: int) -> bool:
    from proc_helpers import proc_state

    return proc_state(pid) == "S"
