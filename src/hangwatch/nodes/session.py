"""``hangwatch stacks --hosts ...``: the collector on every node, one merged report across them.

Read-only everywhere, as on one machine. A node that does not answer is listed with why, and the
others are still merged: a hang report must not wait on the node that is itself the problem. One
machine under two of the names --hosts gave (the same boot id, pid namespace and selection) is collected
once, and said in a note (``nodes/samemachine.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hangwatch.analyse.nodes import NodeParts
from hangwatch.analyse.nodes import report_of
from hangwatch.errors import NoTargets
from hangwatch.errors import UsageError
from hangwatch.model.stacks import paused_gc
from hangwatch.nodes.gather import gather_kubectl
from hangwatch.nodes.gather import gather_slurm
from hangwatch.nodes.gather import gather_ssh
from hangwatch.nodes.gather import job_nodes
from hangwatch.nodes.gather import selected_pods
from hangwatch.nodes.ray import WORKER_CLASSES
from hangwatch.nodes.ray import gather_ray
from hangwatch.nodes.samemachine import once_per_machine
from hangwatch.redact import scrub
from hangwatch.render.files import write_atomically
from hangwatch.render.files import write_outputs
from hangwatch.render.json_report import json_text
from hangwatch.render.json_report import plain
from hangwatch.render.nodes_text import nodes_text
from hangwatch.transports import kubectl
from hangwatch.transports import ray
from hangwatch.transports import slurm
from hangwatch.transports.ray import DEFAULT_PYTHON as RAY_PYTHON
from hangwatch.transports.ssh import SshOptions

# Room on each node's timeout for the ssh handshake and the transfer, so the collector's own deadline
# ends its rounds before the transport gives up on it.
TRANSPORT_MARGIN_S = 3.0  # at most; a quarter of the node's timeout when that is shorter


@dataclass(frozen=True)
class NodesStacksOptions:
    hosts: tuple[str, ...]
    match: str
    engine: str | None
    samples: int
    every_s: float
    native: bool
    ssh: SshOptions
    report_json: Path | None
    # Pods instead of hosts: ``kubectl get pods -l kube_selector``, the collector through kubectl exec.
    kube: kubectl.KubectlOptions | None = None
    kube_selector: str | None = None
    # The nodes of a running Slurm job, the collector through ``srun --jobid J --overlap``.
    slurm: slurm.SlurmOptions | None = None
    # A Ray cluster's dashboard: ranks from the state API, stacks from its traceback endpoint or over ssh.
    ray: ray.RayOptions | None = None
    ray_classes: tuple[str, ...] = WORKER_CLASSES
    # --ray-task: where ssh does not reach a Ray node, the collector as a node-pinned Ray task there.
    ray_task: bool = False
    ray_python: str = RAY_PYTHON  # the head's interpreter with Ray, for the task's job


def remote_args(o: NodesStacksOptions) -> list[str]:
    transport = o.kube or o.slurm or o.ssh
    node_timeout, connect = transport.node_timeout_s, transport.connect_timeout_s
    margin = min(TRANSPORT_MARGIN_S, node_timeout / 4)
    deadline = max(1.0, node_timeout - connect - margin)
    args = ["--match", o.match, "--mode", "full", "--samples", str(o.samples), "--every", f"{o.every_s:g}"]
    args += ["--deadline", f"{deadline:g}"]
    if not o.native:
        args.append("--no-native")
    if o.engine:
        args += ["--engine", o.engine]
    return args


def stacks_across_nodes(o: NodesStacksOptions) -> int:
    # One pass that reads every node's answer, analyses it and prints it, then ends: the cyclic collector
    # stays off for all of it (model/stacks.py, ``PausedGc``), not only for the decoding and the analysis.
    # Between those two, the first allocation set off a collection that walked every bundle decoded
    # (0.27 s after 1,000 bundles of 10 ranks, 2026-12-06), and after the analysis again every view and
    # copy it made; none of them is in a cycle, and all are freed by their reference counts.
    with paused_gc:
        return _stacks_across_nodes(o)


def _stacks_across_nodes(o: NodesStacksOptions) -> int:
    notes: tuple[str, ...] = ()
    selector = f"--match {o.match!r}"
    parts: NodeParts | None = None  # each node's part of the merge, made as its answer arrives
    if o.ray is not None:
        try:
            gathered = gather_ray(
                o.ray,
                classes=o.ray_classes,
                samples=o.samples,
                every_s=o.every_s,
                native=o.native,
                ssh=o.ssh,
                remote_args=ray_remote_args(o),
                task=o.ray_task,
                task_python=o.ray_python,
            )
        except ray.RayError as exc:
            raise NoTargets(f"ray: {exc}") from None
        if not gathered.results:
            raise NoTargets(f"no actor of class {', '.join(o.ray_classes)} in the Ray cluster at {o.ray.url}")
        results = gathered.results
        notes = (
            *gathered.notes,
            f"discovery (state API: nodes and actors) took {gathered.discovery_s:.3f} s",
        )
        selector = f"--ray {o.ray.url}, actors {'|'.join(o.ray_classes)}"
    elif o.kube is not None and o.kube_selector is not None:
        pods = selected_pods(o.kube_selector, o.kube)
        parts = NodeParts([pod.name for pod in pods])
        results = gather_kubectl(pods, remote_args(o), o.kube, parts)
    elif o.slurm is not None:
        nodes = job_nodes(o.slurm)
        parts = NodeParts(nodes)
        results = gather_slurm(nodes, remote_args(o), o.slurm, parts)
    elif not o.hosts:
        raise UsageError("--hosts/--hostfile named no node")
    else:
        # Names the user gave, two of which may be one machine (localhost and 127.0.0.1); pods and a
        # job's nodes are discovered, each its own.
        hosts, args = o.hosts, remote_args(o)
        parts = NodeParts(hosts)  # where one machine answers under two names, the merge makes its part
        once = once_per_machine(
            gather_ssh(hosts, args, o.ssh, parts), lambda ix: gather_ssh([hosts[i] for i in ix], args, o.ssh)
        )
        results, notes = list(once.results), once.notes
    report = dataclasses.replace(report_of(results, selector, parts), notes=notes)
    print(scrub(nodes_text(report)), flush=True)
    if o.report_json is not None:
        data = plain(dataclasses.asdict(report))
        write_outputs(
            [("--report-json", o.report_json, lambda path: write_atomically(path, json_text(data)))]
        )
    return 0 if any(r.bundle is not None for r in results) else 1


def ray_remote_args(o: NodesStacksOptions) -> list[str]:
    """The collector's arguments over ssh for a Ray node: the actors' pids are added per node."""
    args = remote_args(o)
    i = args.index("--match")
    return args[:i] + args[i + 2 :]
