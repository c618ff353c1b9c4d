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
* ``srun --jobid J --overlap --nodes=N --ntasks=N --ntasks-per-node=1 --nodelist=LIST --label ... CMD...``
  runs CMD once on each node of LIST at once, task K on the K-th node in the job's order, and writes
  their output as the real srun 22.05 does with ``--label``: every line prefixed ``K: `` (padded to the
  widest task id), a line longer than slurmstepd's 1,024-byte message cut into labelled lines of 1,024
  bytes, the last shorter; a task that fails is srun's ``srun: error: NODE: task K: Exited with exit
  code C`` on stderr and srun's exit status the largest. A job's ``"tasks"`` (node -> {"print": TEXT,
  "rc": C}) makes that node's task print TEXT and exit C instead of running CMD.

Every call is appended to ``$HW_SLURM_LOG`` (one JSON argv a line).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from typing import IO
from typing import Any

# slurmstepd's I/O message: a longer line reaches srun in pieces of this size (--label labels each).
IO_CHUNK = 1024


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
        if flag.startswith("--") and "=" in flag:
            key, _, value = flag.partition("=")
            options[key] = value
        elif flag in ("--jobid", "-w", "-N", "-n") and rest:
            options[flag] = rest.pop(0)
        elif flag.startswith(("-N", "-n")) and len(flag) > 2:
            options[flag[:2]] = flag[2:]
        else:
            options[flag] = True
    job, node = str(options.get("--jobid")), str(options.get("-w", options.get("--nodelist")))
    if job not in jobs:
        return _error(f"srun: error: Unable to confirm allocation for job {job}: Invalid job id specified")
    if jobs[job].get("state", "RUNNING") == "PENDING":
        return _error(f"srun: error: Unable to confirm allocation for job {job}: Job is pending execution")
    if "--nodes" in options:
        return _step(job, jobs[job], options, rest)
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
    prefix = enter(nodes[node]) if node in nodes else []
    return subprocess.run([*prefix, *rest], env=env, check=False).returncode


def enter(pid: int) -> list[str]:
    """Into an emulated node's network, PID, mount and UTS namespaces, as slurmd starts a step there."""
    return ["nsenter", "--target", str(pid), "--net", "--pid", "--mount", "--uts", "--"]


def _step(job: str, spec: dict[str, Any], options: dict[str, str | bool], command: list[str]) -> int:
    """One step of one task per node (``--nodes=N --ntasks-per-node=1``), every task at once."""
    in_job = expand(spec["nodes"])
    nodes = expand(str(options["--nodelist"])) if "--nodelist" in options else in_job
    if any(n not in in_job for n in nodes) or int(str(options["--nodes"])) != len(nodes):
        return _error(
            f"srun: error: Unable to create step for job {job}: Requested node configuration is not available"
        )
    if "--overlap" not in options:
        time.sleep(3600)  # as for one node: the step waits silently for the job's CPUs
    nodes = sorted(nodes, key=in_job.index)  # Slurm lays the tasks out in the job's node order
    width = len(str(len(nodes) - 1))
    lock = threading.Lock()
    canned: dict[str, Any] = spec.get("tasks", {})
    pinned = json.loads(os.environ.get("HW_SLURM_NODES", "{}"))

    def relay(k: int, stream: IO[bytes], out: IO[bytes]) -> None:
        label = f"{k:>{width}}: ".encode() if "--label" in options else b""
        while piece := stream.readline(IO_CHUNK):
            with lock:
                out.write(label + piece + (b"" if piece.endswith(b"\n") else b"\n"))
                out.flush()

    def task(k: int, node: str) -> int:
        if node in canned:
            text = str(canned[node].get("print", ""))
            argv = [sys.executable, "-c", "import sys; sys.stdout.write(sys.argv[1])", text]
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        elif shutil.which(command[0]) is None and not os.path.exists(command[0]):
            with lock:
                sys.stdout.flush()
                sys.stderr.write(
                    f"{k:>{width}}: slurmstepd-{node}: error: execve(): {command[0]}: No such file or directory\n"
                )
            return 2
        else:
            env = {**os.environ, "SLURM_JOB_ID": job, "SLURM_STEP_ID": "1", "SLURM_PROCID": str(k),
                   "SLURM_NODEID": str(k), "SLURMD_NODENAME": node}  # fmt: skip
            prefix = [] if node not in pinned else enter(pinned[node])
            proc = subprocess.Popen(
                [*prefix, *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        assert proc.stdout is not None and proc.stderr is not None
        err = threading.Thread(target=relay, args=(k, proc.stderr, sys.stderr.buffer))
        err.start()
        relay(k, proc.stdout, sys.stdout.buffer)
        err.join()
        rc = proc.wait()
        return int(canned[node].get("rc", 0)) if node in canned else rc

    codes = [0] * len(nodes)

    def run(k: int) -> None:
        codes[k] = task(k, nodes[k])
        if codes[k]:
            with lock:
                sys.stderr.write(f"srun: error: {nodes[k]}: task {k}: Exited with exit code {codes[k]}\n")
                sys.stderr.flush()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(codes)


def _error(text: str) -> int:
    sys.stderr.write(text + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
