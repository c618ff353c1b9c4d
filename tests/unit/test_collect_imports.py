"""`hangwatch collect` runs on every node of a fan-out, once per node and watch round: its interpreter's
imports are part of every node's exchange (docs/multinode.md). It imports the collector, not the watch,
the analysis or the renderers of the other commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import contextlib, io, json, sys
from hangwatch.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["collect", "--pid", str(__import__("os").getpid()), "--samples", "1", "--mode", "census",
                 "--no-probe"])
bundle = json.loads(out.getvalue())
print(json.dumps({"code": code, "schema": bundle["schema"], "modules": sorted(sys.modules)}))
"""


def test_collect_imports_only_what_it_runs():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0 and result["schema"].startswith("hangwatch.node-bundle/")
    heavy = [
        m
        for m in result["modules"]
        if m.startswith(
            ("hangwatch.analyse", "hangwatch.supervise", "hangwatch.render.html", "hangwatch.cli.run")
        )
    ]
    assert heavy == [], heavy
