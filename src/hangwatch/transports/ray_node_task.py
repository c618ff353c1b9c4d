"""The Ray job that runs the collector on chosen nodes: one node-pinned task per node (``--ray-task``).

Never imported by hangwatch: ``transports/ray.py`` sends this file's source as a Ray job's entrypoint
(``python -c``, through the dashboard's job API), so it runs inside the cluster with the cluster's own
Python and Ray, the one driver that can join it (``ray.init`` needs Ray's exact version and Python's patch
version on both sides). Stdlib and ``ray`` only, imported in ``main``.

Each task is pinned to its node with ``NodeAffinitySchedulingStrategy(node_id, soft=False)`` (it fails
rather than run elsewhere, where the pids would be another node's), takes no CPU (a hung server may hold
all of them), is never retried, and runs the given collector command there as a subprocess: in the node's
own PID namespace, so the state API's actor pids are the ones it reads. One line per node goes to the
job's log (``RESULT_TAG`` + JSON, the collector's stdout in base64), which the controller reads back.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from typing import Any

RESULT_TAG = "HANGWATCH-RAY-TASK "
# What a task keeps of the collector's stderr: the reason it failed, not its whole log.
STDERR_TAIL = 2000


def run_collector(argv: list[str], timeout_s: float) -> dict[str, Any]:
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        return {"rc": 127, "stdout": "", "stderr": str(exc), "elapsed_s": time.monotonic() - start}
    except subprocess.TimeoutExpired:
        return {
            "rc": -1,
            "stdout": "",
            "stderr": f"the collector ran past {timeout_s:g} s",
            "elapsed_s": timeout_s,
        }
    return {
        "rc": done.returncode,
        "stdout": base64.b64encode(done.stdout).decode("ascii"),
        "stderr": done.stderr.decode("utf-8", "replace")[-STDERR_TAIL:],
        "elapsed_s": time.monotonic() - start,
    }


def result_line(node_id: str, result: dict[str, Any]) -> str:
    return RESULT_TAG + json.dumps({"node_id": node_id, **result})


def main(plan_b64: str) -> int:
    import ray  # type: ignore[import-not-found]  # the cluster's own, never hangwatch's
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # type: ignore[import-not-found]

    plan = json.loads(base64.b64decode(plan_b64))
    timeout_s = float(plan["timeout_s"])
    ray.init(log_to_driver=False)
    task = ray.remote(num_cpus=0, max_retries=0)(run_collector)
    refs = {
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["node_id"], soft=False),
            name=f"hangwatch-collect-{node['node_id'][:12]}",
        ).remote(node["argv"], timeout_s): node["node_id"]
        for node in plan["nodes"]
    }
    # The collector's own deadline, plus a worker process's start on each node.
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s + 20)
    for ref in ready:
        try:
            result = ray.get(ref)
        except Exception as exc:  # a task's failure (node died, worker crashed) is that node's answer
            result = {"rc": -2, "stdout": "", "stderr": f"the Ray task failed: {exc!s}"[:STDERR_TAIL]}
        print(result_line(refs[ref], result), flush=True)
    for ref in pending:
        print(result_line(refs[ref], {"rc": -3, "stdout": "", "stderr": "the Ray task did not finish"}))
        ray.cancel(ref, force=True)
    return 0


if __name__ == "__main__":
    # Run as `python -c EXEC SCRIPT PLAN` (transports/ray.py): the plan is the last argument.
    sys.exit(main(sys.argv[-1]))
