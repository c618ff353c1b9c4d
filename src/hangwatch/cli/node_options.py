"""The options that point a command at several nodes (``--hosts``, ``--hostfile``, the ssh transport),
the same in every command that takes them."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from hangwatch.cli.values import seconds
from hangwatch.errors import UsageError
from hangwatch.nodes import hosts as hostlist
from hangwatch.transports.kubectl import DEFAULT_CONCURRENCY as KUBE_CONCURRENCY
from hangwatch.transports.kubectl import KubectlOptions
from hangwatch.transports.ray import RayOptions
from hangwatch.transports.ray import token_from_env
from hangwatch.transports.slurm import FANOUTS
from hangwatch.transports.slurm import STEP_MIN_NODES
from hangwatch.transports.slurm import SlurmOptions
from hangwatch.transports.ssh import DEFAULT_CONCURRENCY
from hangwatch.transports.ssh import SshOptions


def add_node_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("across nodes (ssh)")
    g.add_argument("--hosts", metavar="LIST", help="nodes to collect from: 'node[1-16]', 'a,b,gpu[01-04]'")
    g.add_argument("--hostfile", type=Path, metavar="FILE", help="one node per line (MPI host files work)")
    g.add_argument(
        "--match", metavar="REGEX", help="the server's processes on each node: title or command line matches"
    )
    g.add_argument(
        "--remote-hangwatch",
        default="hangwatch",
        metavar="CMD",
        help="how to start hangwatch on the nodes (default: 'hangwatch' on the remote PATH; "
        "e.g. '/opt/venv/bin/python -m hangwatch')",
    )
    g.add_argument("--ssh-config", type=Path, metavar="FILE", help="ssh -F FILE (default: ~/.ssh/config)")
    g.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE", help="ssh -o KEY=VALUE")
    g.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help="nodes at once (default: 32)",
    )
    g.add_argument(
        "--node-timeout",
        type=seconds("--node-timeout"),
        default=30.0,
        metavar="S",
        help="per node (default: 30)",
    )


def add_kube_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "across pods (kubectl: pods get,list and pods/exec create,get; no pod is changed)"
    )
    g.add_argument(
        "--kube-selector",
        metavar="SEL",
        help="pods by label selector, e.g. 'leaderworkerset.sigs.k8s.io/name=vllm' or 'ray.io/cluster=rc'",
    )
    g.add_argument("--kube-namespace", metavar="NS", help="kubectl --namespace (default: the context's)")
    g.add_argument("--kube-context", metavar="CTX", help="kubectl --context (default: the current one)")
    g.add_argument(
        "--kube-container", metavar="NAME", help="the container to run in (default: each pod's first)"
    )
    g.add_argument(
        "--kubectl", default="kubectl", metavar="PATH", help="the kubectl to run (default: on PATH)"
    )


def add_slurm_options(parser: argparse.ArgumentParser, fanout: bool = False) -> None:
    """``fanout``: the one-shot command's choice of one step over all the nodes or one srun per node
    (attach holds one srun per node for the whole watch: its sessions are each node's own)."""
    g = parser.add_argument_group("across a Slurm job (srun --jobid J --overlap on each of its nodes)")
    g.add_argument(
        "--slurm-job", metavar="J", help="a running job's id: its nodes from squeue, the collector by srun"
    )
    if not fanout:
        return
    g.add_argument(
        "--slurm-fanout",
        choices=FANOUTS,
        default="auto",
        help="'step': one srun over all the job's nodes (Slurm's launch tree starts the collectors); "
        "'per-node': one srun per node, --concurrency at once; 'auto' (default): the step from "
        f"{STEP_MIN_NODES} nodes",
    )


def slurm_options_of(args: argparse.Namespace) -> SlurmOptions:
    remote = tuple(shlex.split(args.remote_hangwatch))
    if not remote:
        raise UsageError("--remote-hangwatch is empty")
    return SlurmOptions(
        job=args.slurm_job,
        connect_timeout_s=min(5.0, args.node_timeout / 4),
        node_timeout_s=args.node_timeout,
        concurrency=args.concurrency,
        remote=remote,
        fanout=getattr(args, "slurm_fanout", "auto"),
    )


def kube_options_of(args: argparse.Namespace) -> KubectlOptions:
    remote = tuple(shlex.split(args.remote_hangwatch))
    if not remote:
        raise UsageError("--remote-hangwatch is empty")
    return KubectlOptions(
        kubectl=args.kubectl,
        context=args.kube_context,
        namespace=args.kube_namespace,
        container=args.kube_container,
        connect_timeout_s=min(10.0, args.node_timeout / 4),
        node_timeout_s=args.node_timeout,
        concurrency=args.concurrency if args.concurrency != DEFAULT_CONCURRENCY else KUBE_CONCURRENCY,
        remote=remote,
    )


def hosts_of(args: argparse.Namespace) -> list[str]:
    found = hostlist.expand(args.hosts) if args.hosts else []
    if args.hostfile is not None:
        found += hostlist.read_hostfile(args.hostfile)
    return list(dict.fromkeys(found))


def ssh_options_of(args: argparse.Namespace) -> SshOptions:
    if args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    remote = tuple(shlex.split(args.remote_hangwatch))
    if not remote:
        raise UsageError("--remote-hangwatch is empty")
    return SshOptions(
        config=args.ssh_config,
        options=tuple(args.ssh_option),
        # A quarter of the node's time at most for the handshake: the rest is for collecting.
        connect_timeout_s=min(10.0, args.node_timeout / 4),
        node_timeout_s=args.node_timeout,
        concurrency=args.concurrency,
        remote=remote,
    )


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "across a Ray cluster (the dashboard's state API; stacks from its traceback endpoint, else ssh)"
    )
    g.add_argument("--ray", metavar="URL", help="the Ray dashboard, e.g. http://HEAD:8265")
    g.add_argument(
        "--ray-actor-class",
        action="append",
        default=[],
        metavar="CLASS",
        help="actor classes that are ranks (default: RayWorkerWrapper, RayWorkerProc, SchedulerActor)",
    )
    g.add_argument(
        "--ray-task",
        action="store_true",
        help="stacks: where the dashboard refuses them (profiling off) and ssh does not reach a node, run "
        "the collector there as a node-pinned Ray task (a Ray job through the dashboard: code run in the "
        "cluster, so only when asked; --remote-hangwatch is the command on the node)",
    )
    g.add_argument(
        "--ray-python",
        default="python",
        metavar="CMD",
        help="--ray-task: the head's Python with Ray, which runs the job's driver (default: 'python' on "
        "the PATH of Ray's job supervisor)",
    )


def ray_options_of(args: argparse.Namespace) -> RayOptions:
    url = args.ray if "://" in args.ray else f"http://{args.ray}"
    return RayOptions(url=url, timeout_s=min(10.0, args.node_timeout), token=token_from_env())


def check_one_transport(args: argparse.Namespace) -> None:
    """Nodes come from one place: an ssh host list, a pod selector, a Slurm job or a Ray dashboard."""
    chosen = [
        bool(args.hosts or args.hostfile),
        bool(args.kube_selector),
        bool(args.slurm_job),
        bool(args.ray),
    ]
    if sum(chosen) > 1:
        raise UsageError(
            "give one of --hosts/--hostfile (ssh), --kube-selector (kubectl), --slurm-job (srun), "
            "--ray (a Ray dashboard)"
        )
