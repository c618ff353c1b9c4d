"""The fan-out: the collector on every node through a transport, each answer decoded into a ``NodeResult``.

A node whose answer is not a bundle (not JSON, another schema, a field missing) is that node's
``bad-output``, said with what was wrong; nothing here raises for one node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hangwatch.analyse.nodes import NodeParts
from hangwatch.errors import NoTargets
from hangwatch.model.nodes import BundleError
from hangwatch.model.nodes import NodeAnswer
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeResult
from hangwatch.model.nodes import PodTarget
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import paused_gc
from hangwatch.nodes import codec
from hangwatch.nodes import hosts
from hangwatch.transports import kubectl
from hangwatch.transports import slurm
from hangwatch.transports import ssh
from hangwatch.words import plural


def result_of(answer: NodeAnswer) -> NodeResult:
    size = len(answer.stdout)
    if answer.outcome is not NodeOutcome.OK:
        return NodeResult(
            answer.host, answer.outcome, answer.detail, None, answer.sent_wall_s, answer.received_wall_s
        )
    try:
        bundle = codec.decode(answer.stdout)
    except codec.BundleDecodeError as exc:
        # Another hangwatch's bundle is named as such (its schema, its version), not as junk.
        what = "" if isinstance(exc, codec.BundleVersionError) else "not a node bundle: "
        detail = f"{what}{str(exc)[:300]}"
        return NodeResult(
            answer.host,
            NodeOutcome.BAD_OUTPUT,
            detail,
            None,
            answer.sent_wall_s,
            answer.received_wall_s,
            size,
        )
    return NodeResult(
        answer.host, NodeOutcome.OK, "", bundle, answer.sent_wall_s, answer.received_wall_s, size
    )


def _kept(parts: NodeParts | None, result: NodeResult) -> NodeResult:
    """A node's last step in the fan-out, after its decoding: its part of the merge made as it arrives
    (``analyse.nodes.NodeParts``), while the other nodes are still collecting; none without ``parts``."""
    return parts.add(result) if parts is not None else result


# Each fan-out runs with the cyclic garbage collector paused (model/stacks.py, ``PausedGc``): the answers
# are decoded as they come, thousands of frozen samples a node, and a collection set off by each node's
# would walk every node's decoded before it (two thirds of decoding 1,000 bundles; docs/multinode.md).
def gather_ssh(
    hosts: Sequence[str],
    remote_args: Sequence[str],
    options: ssh.SshOptions,
    parts: NodeParts | None = None,
) -> list[NodeResult]:
    with paused_gc:
        return ssh.collect_nodes(hosts, remote_args, options, finish=lambda a: _kept(parts, result_of(a)))


def gather_kubectl(
    pods: Sequence[PodTarget],
    remote_args: Sequence[str],
    options: kubectl.KubectlOptions,
    parts: NodeParts | None = None,
) -> list[NodeResult]:
    with paused_gc:
        return kubectl.collect_pods(
            pods, remote_args, options, finish=lambda pod, a: _kept(parts, in_pod(pod, result_of(a)))
        )


def in_pod(pod: PodTarget, result: NodeResult) -> NodeResult:
    """A pod's result, with what its stack failures mean there: the container's missing SYS_PTRACE."""
    bundle = result.bundle
    if bundle is None:
        return result
    denied = sorted({p.pid for s in bundle.stacks for p in s.processes if p.outcome is DumpOutcome.DENIED})
    if not denied:
        return result
    note = BundleError("stacks", ptrace_advice(pod, bundle.node.sys_ptrace, len(denied)))
    return replace(result, bundle=replace(bundle, errors=(*bundle.errors, note)))


def ptrace_advice(pod: PodTarget, has_ptrace: bool | None, denied: int) -> str:
    """Exactly why stacks failed in a pod, and what would fix it; hangwatch never changes a pod."""
    debug = (
        f"kubectl debug -it -n {pod.namespace} {pod.name} --profile=general --target={pod.container} "
        "--image=python:3.12-slim (an ephemeral container with SYS_PTRACE in the target's PID namespace; "
        "it stays in the pod's spec until the pod is deleted)"
    )
    head = f"stacks denied for {plural(denied, 'process')} in pod {pod.name}, container {pod.container}"
    if has_ptrace is False and not pod.ptrace_added:
        return (
            f"{head}: the container lacks CAP_SYS_PTRACE, which Kubernetes drops by default and py-spy "
            "needs. hangwatch changes no pod; to allow it, add "
            f"securityContext.capabilities.add: [SYS_PTRACE] to container {pod.container} (the pod is "
            "recreated; the baseline and restricted Pod Security Standards forbid it), or take the stacks "
            f"from {debug}"
        )
    if has_ptrace is False:
        return (
            f"{head}: the pod spec adds SYS_PTRACE, but the collector does not hold it (another container, "
            f"or a runtime or admission policy that strips it); or take the stacks from {debug}"
        )
    return (
        f"{head} although the collector holds CAP_SYS_PTRACE: a seccomp or AppArmor profile, or another "
        f"user's processes; or take the stacks from {debug}"
    )


def slurm_nodes(options: slurm.SlurmOptions) -> list[str]:
    """The running job's nodes: squeue's list, expanded by scontrol, else by the same syntax here."""
    node_list = slurm.job_node_list(options)
    expanded = slurm.show_hostnames(node_list, options)
    return expanded if expanded is not None else hosts.expand(node_list) if node_list else []


def job_nodes(options: slurm.SlurmOptions) -> list[str]:
    """The job's nodes for stacks and attach alike; no node, or Slurm failing, stops with the reason."""
    try:
        nodes = slurm_nodes(options)
    except slurm.SlurmError as exc:
        raise NoTargets(f"slurm: {exc}") from None
    if not nodes:
        raise NoTargets(f"job {options.job} has no node yet (pending?)")
    return nodes


def selected_pods(selector: str, options: kubectl.KubectlOptions) -> list[PodTarget]:
    """The selector's pods for stacks and attach alike; none, or kubectl failing, stops with the reason."""
    try:
        pods = kubectl.discover(selector, options)
    except kubectl.KubectlError as exc:
        raise NoTargets(f"kubectl: {exc}") from None
    if not pods:
        where = f" in namespace {options.namespace}" if options.namespace else " in the context's namespace"
        raise NoTargets(f"no pod matches -l {selector!r}{where}")
    return pods


def gather_slurm(
    nodes: Sequence[str],
    remote_args: Sequence[str],
    options: slurm.SlurmOptions,
    parts: NodeParts | None = None,
) -> list[NodeResult]:
    """One step over all the job's nodes (slurmd's launch tree fans it out), or one srun per node."""

    def finish(answer: NodeAnswer) -> NodeResult:
        return _kept(parts, result_of(answer))

    with paused_gc:
        if slurm.one_step(options, len(nodes)):
            return slurm.collect_step(nodes, remote_args, options, finish=finish)
        return slurm.collect_nodes(nodes, remote_args, options, finish=finish)
