"""Stand-ins for ``squeue``, ``scontrol`` and ``srun`` (no Slurm cluster here): what hangwatch calls, for
the jobs in ``$HW_SLURM_JOBS`` (JSON: job id -> {"nodes": "hwnode[1-3]", "state": "RUNNING"}; a PENDING job has nodes "").

Run as ``slurm_standin.py TOOL ARGS`` by wrapper scripts named after each tool on PATH.

* ``squeue -j J -h -o %N`` prints the job's node list, as squeue does (``slurm_load_jobs error: Invalid
  job id specified`` for an unknown one), ``-o %T`` its state;
* ``scontrol show hostnames LIST`` expands it, one name a line (leave it off PATH to test the fallback);
* ``srun --jobid J --overlap -N1 -n1 -w NODE [--quiet] CMD...`` runs CMD on that node: inside the
  emulated node when ``$HW_SLURM_NODES`` (JSON: node -> its pid 1) maps it (nsenter into its network, PID,
  mount and UTS namespaces, as slurmd would start the step there), else on this machine, with the step's
  Slurm variables. Its failures are srun's own messages: an unknown job, a node outside the allocation,
  a step without ``--overlap`` (it waits silently, as the real 22.05 does while the job's steps hold
  every CPU), a pending job, a command slurmstepd cannot exec (the messages are the real srun's,
  tests/integration/test_nodes_slurm_real.py).

Every call is appended to ``$HW_SLURM_LOG`` (one JSON argv a line).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any


def expand(spec: str) -> list[str]:
    out: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", spec):
        m = re.match(r"^(.*)\[([^\]]*)\](.*)$", item)
        if m is None:
            out.append(item)
            continue
        for part in m.group(2).split(","):
            lo, _, hi = part.partition("-")
            for n in range(int(lo), int(hi or lo) + 1):
                out.append(f"{m.group(1)}{str(n).zfill(len(lo))}{m.group(3)}")
    return out


def main(tool: str, args: list[str]) -> int:
    log = os.environ.get("HW_SLURM_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps([tool, *args]) + "\n")
    jobs: dict[str, Any] = json.loads(os.environ.get("HW_SLURM_JOBS", "{}"))
    if tool == "squeue":
        job = args[args.index("-j") + 1]
        if job not in jobs:
            return _error("slurm_load_jobs error: Invalid job id specified")
        fmt = args[args.index("-o") + 1] if "-o" in args else "%N"
        # A pending job has no nodes: squeue 22.05 prints an empty line for its %N.
        print(jobs[job].get("state", "RUNNING") if fmt == "%T" else jobs[job]["nodes"])
        return 0
    if tool == "scontrol":
        if args[:2] != ["show", "hostnames"]:
            return _error(f"scontrol: the stand-in knows only show hostnames: {args}")
        print("\n".join(expand(args[2])))
        return 0
    if tool == "srun":
        return _srun(args, jobs)
    return _error(f"unknown tool {tool}")


def _srun(args: list[str], jobs: dict[str, Any]) -> int:
    options: dict[str, str | bool] = {}
    rest = list(args)
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in ("--jobid", "-w", "-N", "-n") and rest:
            options[flag] = rest.pop(0)
        elif flag.startswith(("-N", "-n")) and len(flag) > 2:
            options[flag[:2]] = flag[2:]
        else:
            options[flag] = True
    job, node = str(options.get("--jobid")), str(options.get("-w"))
    if job not in jobs:
        return _error(f"srun: error: Unable to confirm allocation for job {job}: Invalid job id specified")
    if jobs[job].get("state", "RUNNING") == "PENDING":
        return _error(f"srun: error: Unable to confirm allocation for job {job}: Job is pending execution")
    if node not in expand(jobs[job]["nodes"]):
        return _error(
            f"srun: error: Unable to create step for job {job}: Requested node configuration is not available"
        )
    if "--overlap" not in options:
        # The job's own steps hold the CPUs: a step that may not overlap waits for them, and srun 22.05
        # says nothing about it at its default verbosity.
        time.sleep(3600)
    if not rest or (shutil.which(rest[0]) is None and not os.path.exists(rest[0])):
        # In the order and shape the real srun 22.05 prints them (slurmstepd names its node).
        sys.stderr.write(f"srun: error: {node}: task 0: Exited with exit code 2\n")
        sys.stderr.write(
            f"slurmstepd-{node}: error: execve(): {rest[0] if rest else '?'}: No such file or directory\n"
        )
        return 2
    env = {
        **os.environ,
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": "1",
        "SLURM_PROCID": "0",
        "SLURMD_NODENAME": node,
    }
    nodes = json.loads(os.environ.get("HW_SLURM_NODES", "{}"))
    prefix = []
    if node in nodes:
        prefix = ["nsenter", "--target", str(nodes[node]), "--net", "--pid", "--mount", "--uts", "--"]
    return subprocess.run([*prefix, *rest], env=env, check=False).returncode


def _error(text: str) -> int:
    sys.stderr.write(text + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
