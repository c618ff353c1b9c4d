"""A real Prometheus (Debian's package, installed by `make test-deps`) scrapes two `hangwatch watch`
sidecars, one over a program that hangs and one over a program that keeps progressing, and evaluates the
alert rules shipped in docs/alerts: the stall alert fires for the hung one only. The rules also pass their
own `promtool test rules`. Everything listens on loopback and is stopped by the test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from hwrun import hangwatch_argv
from hwrun import program
from proc_helpers import free_port
from proc_helpers import spawn
from proc_helpers import wait_until

pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(
        not (shutil.which("prometheus") and shutil.which("promtool")),
        reason="prometheus/promtool not installed (make test-deps installs Debian's prometheus)",
    ),
]
ALERTS = Path(__file__).resolve().parents[2] / "docs" / "alerts"


def test_the_shipped_rules_pass_their_own_promtool_tests():
    done = subprocess.run(
        ["promtool", "test", "rules", "hangwatch-rules.test.yml"], cwd=ALERTS, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _api(base: str, path: str, **query: str) -> dict:
    url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())["data"]


def test_prometheus_scrapes_the_sidecars_and_the_stall_alert_fires_for_the_hung_one_only(tmp_path):
    # The rules as shipped, their holds shortened so that the test need not wait two minutes.
    rules = (ALERTS / "hangwatch-rules.yml").read_text()
    (tmp_path / "rules.yml").write_text(rules.replace("for: 2m", "for: 3s").replace("for: 1m", "for: 3s"))
    ports = {"hung": free_port(), "healthy": free_port()}
    targets = "\n".join(
        f"      - targets: ['127.0.0.1:{port}']\n        labels: {{program: {name}}}"
        for name, port in ports.items()
    )
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files: ['rules.yml']\n"
        f"scrape_configs:\n  - job_name: hangwatch\n    static_configs:\n{targets}\n"
    )
    prom_port = free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    hung = program("progress_then_hang", "--seconds", "2")
    healthy = program("progress_then_hang", "--seconds", "1", "--resume-after", "0")
    # Each writes its log to a file, which the sidecar finds and follows (its stdout's target).
    with (
        (tmp_path / "hung.log").open("w") as hung_log,
        (tmp_path / "healthy.log").open("w") as healthy_log,
        spawn(hung, stdout=hung_log, stderr=subprocess.STDOUT) as hung_p,
        spawn(healthy, stdout=healthy_log, stderr=subprocess.STDOUT) as healthy_p,
        spawn(_sidecar(hung_p.pid, ports["hung"], tmp_path / "ev-hung"), stdout=subprocess.DEVNULL),
        spawn(_sidecar(healthy_p.pid, ports["healthy"], tmp_path / "ev-ok"), stdout=subprocess.DEVNULL),
        spawn(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),  # fmt: skip
    ):

        def firing() -> list[dict]:
            try:
                alerts = _api(prom, "alerts")["alerts"]
            except OSError:
                return []
            return [
                a for a in alerts if a["state"] == "firing" and a["labels"]["alertname"] == "HangwatchStalled"
            ]

        alerts = wait_until(firing, 90, interval=1.0, what="HangwatchStalled to fire")
        assert {a["labels"]["program"] for a in alerts} == {"hung"}, alerts
        # Both were scraped, and the healthy one reads progressing.
        series = _api(prom, "query", query='hangwatch_state{state="progressing"}')["result"]
        values = {s["metric"]["program"]: s["value"][1] for s in series}
        assert values == {"hung": "0", "healthy": "1"}, values
        assert _api(prom, "query", query="hangwatch_stalls_total")["result"]
        assert hung_p.poll() is None and healthy_p.poll() is None  # the sidecars signal nothing


def _sidecar(pid: int, port: int, evidence: Path) -> list[str]:
    return hangwatch_argv(
        "watch", "--quiet", "--pid", str(pid), "--stall-after", "4", "--listen", f"127.0.0.1:{port}",
        "--evidence-dir", str(evidence),
    )  # fmt: skip
