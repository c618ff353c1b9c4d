"""``--ray-task`` without a Ray cluster: the driver's task body, its result lines, and the job API's failures.

The driver (``transports/ray_node_task.py``) runs inside a cluster; here its collector step runs as
a real subprocess, its result lines are read back into node answers, and a loopback HTTP server in the
shapes of Ray 2.60's job API (``POST /api/jobs/``, ``GET /api/jobs/ID``, ``/logs``) stands
for a dashboard that refuses the job, or whose job fails before any task ran (the entrypoint's Python has
no Ray): every planned node then says why. The whole path on a real two-node cluster is in
tests/integration/test_nodes_ray_cluster.py.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator

import pytest

from hangwatch.model.nodes import NodeOutcome
from hangwatch.transports import ray
from hangwatch.transports.ray_node_task import result_line
from hangwatch.transports.ray_node_task import run_collector
from loopback_http import QuietHandler
from loopback_http import serving

PLANS = [
    ray.TaskPlan("a" * 56, "10.0.0.1", ("hangwatch", "collect", "--pid", "7")),
    ray.TaskPlan("b" * 56, "10.0.0.2", ("hangwatch", "collect", "--pid", "8")),
]


def test_the_task_runs_the_collector_and_keeps_its_output_and_failure() -> None:
    ok = run_collector([sys.executable, "-c", "print('bundle')"], 10)
    assert ok["rc"] == 0 and base64.b64decode(ok["stdout"]) == b"bundle\n"
    missing = run_collector(["/nonexistent/hangwatch", "collect"], 10)
    assert missing["rc"] == 127 and "nonexistent" in missing["stderr"]
    slow = run_collector([sys.executable, "-c", "import time; time.sleep(5)"], 0.3)
    assert slow["rc"] == -1 and "ran past" in slow["stderr"]


def test_result_lines_become_each_nodes_answer_and_the_rest_is_ignored() -> None:
    logs = "\n".join(
        [
            "2026-12-02 06:03:09,458 INFO job_manager.py:581 -- Runtime env is setting up.",
            result_line("b" * 56, {"rc": 127, "stdout": "", "stderr": "No such file: hangwatch"}),
            result_line("a" * 56, {"rc": 0, "stdout": base64.b64encode(b"{}").decode(), "stderr": ""}),
            "HANGWATCH-RAY-TASK {not json",
        ]
    )
    a, b = ray.task_answers(PLANS, logs, 0.0)
    assert a is not None and a.outcome is NodeOutcome.OK and a.stdout == b"{}" and a.host == "10.0.0.1"
    assert b is not None and b.outcome is NodeOutcome.NO_COLLECTOR and "hangwatch was not found" in b.detail
    assert ray.task_answers(PLANS, "", 0.0) == [None, None]


class JobApi:
    """Ray's job API in miniature: what POST answers, and the status and log the job then has."""

    def __init__(self, submit: int, status: str, logs: str) -> None:
        self.submit, self.status, self.logs = submit, status, logs
        self.calls: list[tuple[str, str]] = []
        self.entrypoint = ""


@pytest.fixture
def job_api(request: pytest.FixtureRequest) -> Iterator[tuple[str, JobApi]]:
    api = JobApi(*request.param)

    class Handler(QuietHandler):
        def do_POST(self) -> None:  # http.server calls them by these names
            self._record()
            if self.path == "/api/jobs/":
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.entrypoint = body["entrypoint"]
                self.answer(api.submit, {"job_id": body["submission_id"]})
            else:
                self.answer(200, {"stopped": True})

        def do_GET(self) -> None:
            self._record()
            if self.path.endswith("/logs"):
                self.answer(200, {"logs": api.logs})
            else:
                self.answer(
                    200, {"status": api.status, "message": "Job entrypoint command failed with exit code 1"}
                )

        def _record(self) -> None:
            api.calls.append((self.command, self.path))

    with serving(Handler) as url:
        yield url, api


@pytest.mark.parametrize("job_api", [(500, "PENDING", "")], indirect=True)
def test_a_refused_job_is_every_planned_nodes_answer(job_api: tuple[str, JobApi]) -> None:
    url, api = job_api
    run = ray.collect_by_task(ray.RayOptions(url), PLANS, 5)
    assert api.calls == [("POST", "/api/jobs/")]  # nothing polled for a job never made
    assert [a.outcome for a in run.answers] == [NodeOutcome.REMOTE_ERROR] * 2
    assert all("refused the collector's Ray job: HTTP 500" in a.detail for a in run.answers)
    assert [a.host for a in run.answers] == ["10.0.0.1", "10.0.0.2"]


NO_RAY = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'ray'\n"


@pytest.mark.parametrize("job_api", [(200, "FAILED", NO_RAY)], indirect=True)
def test_a_job_that_fails_before_its_tasks_says_why(job_api: tuple[str, JobApi]) -> None:
    url, api = job_api
    run = ray.collect_by_task(ray.RayOptions(url), PLANS, 5, python="/opt/ray env/bin/python")
    assert [a.outcome for a in run.answers] == [NodeOutcome.REMOTE_ERROR] * 2
    assert all("ended FAILED without this node's answer" in a.detail for a in run.answers)
    assert all("No module named 'ray'" in a.detail and "--ray-python" in a.detail for a in run.answers)
    assert shlex.split(api.entrypoint)[0] == "/opt/ray env/bin/python"  # quoted for the head's shell
    # Kept in the job list (see collect_by_task): nothing but submit, status and logs was asked.
    assert run.status == "FAILED" and {c[0] for c in api.calls} == {"POST", "GET"}
    # The entrypoint carries the driver's source and the plan base64-encoded: no shell quoting of argv.
    words = api.entrypoint.split()
    plan = json.loads(base64.b64decode(words[-1]))
    assert [n["argv"] for n in plan["nodes"]] == [list(p.argv) for p in PLANS]
    assert b"NodeAffinitySchedulingStrategy" in base64.b64decode(words[-2])


def test_attach_refuses_ray_task_saying_why() -> None:
    cmd = [sys.executable, "-m", "hangwatch", "attach", "--ray", "http://127.0.0.1:9", "--ray-task"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--ray-task is for stacks --ray" in out.stderr, out.stderr
