"""The kubectl boundary: pods by label selector, ``hangwatch collect`` in each through ``kubectl exec -i``.

The user's ``kubectl``, not a Kubernetes client library: the kubeconfig, its exec plugins (cloud token
helpers), the context and RBAC stay with kubectl, and hangwatch never reads a credential. It needs
``pods: get,list`` and ``pods/exec: create`` (and ``get`` on older API servers), nothing else: it reads
pods and execs into them, and never changes one (no patch, no ephemeral container, no restart).

Discovery is ``kubectl get pods -l SELECTOR -o json``; the pods are ordered as their controllers number
them, so node labels read in rank order: a LeaderWorkerSet's group index then worker index (the leader
is worker 0; SGLang's ``--node-rank`` is ``$(LWS_WORKER_INDEX)``), a KubeRay cluster's head before its
workers, else by name. kubectl's exit statuses and messages never leave this module: each pod ends as a
``NodeAnswer`` whose outcome says what happened (forbidden, pod gone, no collector in the image, timeout).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import TypeVar

from hangwatch.model.nodes import NodeAnswer
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import PodTarget
from hangwatch.transports.runner import ClientTransport
from hangwatch.transports.runner import Exchange
from hangwatch.transports.runner import Runner
from hangwatch.transports.runner import collect
from hangwatch.transports.runner import last_line
from hangwatch.transports.runner import run_bounded
from hangwatch.transports.stream import StreamSession

T = TypeVar("T")

# Label keys of the controllers that place an inference server's nodes in pods:
# kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go (SetNameLabelKey, GroupIndexLabelKey,
# WorkerIndexLabelKey) and ray-project/kuberay ray-operator/controllers/ray/utils/constant.go
# (RayClusterLabelKey, RayNodeTypeLabelKey, RayNodeGroupLabelKey).
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
RAY_CLUSTER = "ray.io/cluster"
RAY_NODE_TYPE = "ray.io/node-type"
RAY_GROUP = "ray.io/group"

DEFAULT_CONCURRENCY = 16  # each exec is an API-server-to-kubelet stream; no published limit was found
MAX_OUTPUT_BYTES = 64_000_000
# kubectl's label-selector syntax, and nothing else (no flag can hide in it).
_SELECTOR = re.compile(r"^[A-Za-z0-9_./=!,() -]+$")

_PATTERNS: tuple[tuple[NodeOutcome, tuple[str, ...], str], ...] = (
    (
        NodeOutcome.AUTH,
        ("Forbidden", "forbidden", "Unauthorized", "You must be logged in"),
        "the API server refused (RBAC: hangwatch needs pods get,list and pods/exec create,get)",
    ),
    (NodeOutcome.UNREACHABLE, ("NotFound", "not found"), "the pod or its container is gone"),
    (
        NodeOutcome.UNREACHABLE,
        ("Unable to connect to the server", "connection refused", "no such host", "i/o timeout"),
        "the API server cannot be reached",
    ),
    (
        NodeOutcome.UNREACHABLE,
        ("container not found", "is not running", "ContainerCreating", "pod does not exist"),
        "the container is not running",
    ),
)


class KubectlError(Exception):
    """Discovery failed (kubectl missing, the API refused, not JSON): said to the user, no pod to ask."""


@dataclass(frozen=True)
class KubectlOptions:
    kubectl: str = "kubectl"
    context: str | None = None
    namespace: str | None = None
    container: str | None = None  # default: each pod's first container
    connect_timeout_s: float = 10.0  # what of the node timeout the exec stream's set-up may take
    node_timeout_s: float = 30.0
    concurrency: int = DEFAULT_CONCURRENCY
    remote: tuple[str, ...] = ("hangwatch",)  # how to start hangwatch inside the container


def base_argv(options: KubectlOptions) -> list[str]:
    argv = [options.kubectl]
    if options.context:
        argv += ["--context", options.context]
    if options.namespace:
        argv += ["--namespace", options.namespace]
    return argv


def discover(selector: str, options: KubectlOptions, runner: Runner = run_bounded) -> list[PodTarget]:
    """The pods the selector names, in their controllers' order."""
    if not selector or not _SELECTOR.match(selector) or selector.startswith("-"):
        raise KubectlError(f"not a label selector: {selector!r} (e.g. {LWS_NAME}=vllm)")
    ex = runner([*base_argv(options), "get", "pods", "-l", selector, "-o", "json"], options.node_timeout_s)
    said = last_line(ex.stderr)
    if ex.rc is None:
        raise KubectlError(f"kubectl get pods gave no answer within {options.node_timeout_s:g} s")
    if ex.rc == 127:
        raise KubectlError(f"kubectl was not found ({said}); give its path with --kubectl")
    if ex.rc != 0:
        for _outcome, needles, meaning in _PATTERNS:
            if any(n in ex.stderr for n in needles):
                raise KubectlError(f"{meaning}: {said}")
        raise KubectlError(f"kubectl get pods failed (exit status {ex.rc}): {said}")
    try:
        listing = json.loads(ex.stdout)
    except json.JSONDecodeError as exc:
        raise KubectlError(f"kubectl get pods -o json did not print JSON: {exc}") from None
    items = listing.get("items", []) if isinstance(listing, dict) else []
    pods = [_pod(item, options) for item in items if isinstance(item, dict)]
    return sorted(pods, key=_order)


def exec_argv(pod: PodTarget, remote_args: Sequence[str], options: KubectlOptions) -> list[str]:
    """``kubectl exec -i POD -c CONTAINER -- hangwatch collect ARGS``: an argv, no shell in between."""
    argv = [options.kubectl]
    if options.context:
        argv += ["--context", options.context]
    argv += ["--namespace", pod.namespace, "exec", "-i", pod.name, "-c", pod.container, "--"]
    return [*argv, *options.remote, "collect", *remote_args]


@dataclass(frozen=True)
class KubectlTransport(ClientTransport[KubectlOptions, PodTarget]):
    """``kubectl exec POD -c C -- hangwatch collect ...`` (runner.Transport)."""

    def argv(self, target: PodTarget, remote_args: Sequence[str]) -> list[str]:
        return exec_argv(target, remote_args, self.options)

    def answer_of(self, target: PodTarget, ex: Exchange) -> NodeAnswer:
        return answer_of(target, ex, self.options)

    def unreachable(self, target: PodTarget) -> NodeAnswer | None:
        if target.phase == "Running":
            return None
        # kubectl exec into a Pending or Failed pod can only fail: say what the API says instead.
        return NodeAnswer(target.name, NodeOutcome.UNREACHABLE, f"the pod is {target.phase}", b"", 0.0, 0.0)


def collect_pods(
    pods: Sequence[PodTarget],
    remote_args: Sequence[str],
    options: KubectlOptions,
    finish: Callable[[PodTarget, NodeAnswer], T],
    runner: Runner = run_bounded,
) -> list[T]:
    """The collector in every pod, in parallel; one result per pod, in pod order."""
    return collect(KubectlTransport(options), pods, remote_args, finish, runner)


def answer_of(pod: PodTarget, ex: Exchange, options: KubectlOptions) -> NodeAnswer:
    def failed(outcome: NodeOutcome, detail: str) -> NodeAnswer:
        return NodeAnswer(pod.name, outcome, detail, b"", ex.sent_wall_s, ex.received_wall_s)

    said = last_line(ex.stderr)
    if ex.rc is None:
        return failed(
            NodeOutcome.TIMEOUT, f"no answer within {options.node_timeout_s:g} s (exec and collect)"
        )
    if ex.rc == 0:
        if len(ex.stdout) > MAX_OUTPUT_BYTES:
            over = f"{len(ex.stdout)} bytes, over the {MAX_OUTPUT_BYTES} limit"
            return failed(NodeOutcome.BAD_OUTPUT, over)
        return NodeAnswer(pod.name, NodeOutcome.OK, "", ex.stdout, ex.sent_wall_s, ex.received_wall_s)
    # kubectl passes the remote command's status on ("command terminated with exit code 127").
    if ex.rc in (126, 127) or "executable file not found" in ex.stderr or "no such file or directory" in said:
        # The runtime's line says which executable; kubectl's last line only the status.
        said = next((line.strip() for line in ex.stderr.splitlines() if "not found" in line), said)[:300]
        return failed(
            NodeOutcome.NO_COLLECTOR,
            f"hangwatch was not found in container {pod.container} ({said}); give its path with "
            "--remote-hangwatch, or use an image that has it",
        )
    for outcome, needles, meaning in _PATTERNS:
        if any(n in ex.stderr for n in needles):
            return failed(outcome, f"{meaning}: {said}")
    return failed(NodeOutcome.REMOTE_ERROR, f"kubectl exec failed (exit status {ex.rc}): {said}")


def _pod(item: dict[str, Any], options: KubectlOptions) -> PodTarget:
    meta = item.get("metadata") or {}
    spec = item.get("spec") or {}
    status = item.get("status") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    names = tuple(str(c.get("name", "")) for c in containers)
    chosen = options.container or (names[0] if names else "")
    spec_of = next((c for c in containers if c.get("name") == chosen), {})
    added = ((spec_of.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
    return PodTarget(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", options.namespace or "default")),
        node_name=str(spec.get("nodeName", "")),
        phase=str(status.get("phase", "Unknown")),
        container=chosen,
        containers=names,
        role=_role(labels),
        ptrace_added=any(str(c).upper() in ("SYS_PTRACE", "CAP_SYS_PTRACE", "ALL") for c in added),
        labels=labels,
    )


def _role(labels: dict[str, str]) -> str:
    if LWS_WORKER in labels:
        worker = labels[LWS_WORKER]
        group = labels.get(LWS_GROUP, "?")
        return f"lws group {group} leader" if worker == "0" else f"lws group {group} worker {worker}"
    if RAY_NODE_TYPE in labels:
        kind = labels[RAY_NODE_TYPE]
        return "ray head" if kind == "head" else f"ray {kind} ({labels.get(RAY_GROUP, '?')})"
    return ""


def _order(pod: PodTarget) -> tuple[int, int, int, str]:
    def number(key: str) -> int:
        value = pod.labels.get(key, "")
        return int(value) if value.isdigit() else 1 << 30

    if LWS_WORKER in pod.labels:
        return (0, number(LWS_GROUP), number(LWS_WORKER), pod.name)
    if RAY_NODE_TYPE in pod.labels:
        return (1, 0 if pod.labels[RAY_NODE_TYPE] == "head" else 1, 0, pod.name)
    return (2, 0, 0, pod.name)


def kubectl_session(pod: PodTarget, remote_args: Sequence[str], options: KubectlOptions) -> StreamSession:
    """``kubectl exec -i POD -c C -- hangwatch collect --stream ...`` held open for a watch."""
    return StreamSession(
        pod.name,
        exec_argv(pod, [*remote_args, "--stream"], options),
        lambda ex: answer_of(pod, ex, options),
        open_timeout_s=options.connect_timeout_s,
    )
