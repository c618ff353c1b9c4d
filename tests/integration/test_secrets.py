"""Secrets a server prints never reach a report or a text hangwatch writes: the known token shapes, and the
exact values of the secret-named variables of the environment hangwatch passed to the tree."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.timeout(120)

API_KEY = "s3cr3t-Value-0f-MY-API-KEY"  # no known shape: only its name says it is a secret
HF_TOKEN = "hf_" + "Zq8RvT2mNx4LpW6yKc1BdF3hJs5GaE7u"


def test_server_printed_secrets_are_redacted_everywhere(hw, tmp_path):
    server = tmp_path / "leaky_server.py"
    server.write_text(
        "import os, sys, time\n"
        "key = os.environ['MY_API_KEY']\n"
        f"print('token {HF_TOKEN}', flush=True)\n"
        "print(f'connecting to the hub with {key}', flush=True)\n"
        "print(f'RuntimeError: upstream refused key {key}', file=sys.stderr, flush=True)\n"
        f"time.sleep(3600)  # {API_KEY} {HF_TOKEN}: the source line py-spy reads\n"
    )
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    out = hw(
        "run", "--quiet", "--no-doctor", "--stall-after", "4", "--report-html", str(html), "--report-md", str(md),
        "--", sys.executable, str(server), "--label", API_KEY,
        env={"MY_API_KEY": API_KEY},
    )  # fmt: skip
    assert out.rc == 3, (out.stdout, out.stderr)
    log = (tmp_path / "run" / "output.log").read_text()
    assert API_KEY in log and HF_TOKEN in log  # the server really printed them (its own log keeps them)
    json_text = (tmp_path / "report.json").read_text()
    run_record = (tmp_path / "run" / "run.json").read_text()
    for name, text in [
        ("report.json", json_text), ("html", html.read_text()), ("markdown", md.read_text()),
        ("verdict text", out.stdout), ("stderr", out.stderr), ("run.json", run_record),
    ]:  # fmt: skip
        assert API_KEY not in text, name
        assert HF_TOKEN not in text, name
    lines = [t["log"]["last_line"] for t in out.report["timeline"] if t["log"]["last_line"]]
    assert lines and all("***" in line for line in lines), lines  # the timeline is covered, not just empty
    assert any("***" in a for a in out.report["command"])
    codes = [f["code"] for s in out.report["stacks"] for p in s["processes"] for th in p["threads"]
             for f in th["frames"] if f.get("code")]  # fmt: skip
    assert any("time.sleep(3600)" in c and "***" in c for c in codes), codes
