"""The kubectl transport against a stand-in ``kubectl`` on PATH (tests/fakes/kubectl_standin.py) that
replays LeaderWorkerSet and KubeRay pod listings (tests/fixtures/kube, the API's JSON shapes) and runs
``exec``'s command on this machine, without CAP_SYS_PTRACE unless the container adds it.

No cluster and not /usr/bin/kubectl: the stand-in comes first on PATH. Checked: discovery and its order,
the exact argv (kubectl exec -i POD -c CONTAINER -- hangwatch collect ...), each failure as that pod's
outcome, the SYS_PTRACE advice where stacks were denied, and that nothing but get and exec was asked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hangwatch
from hangwatch.model.nodes import NodeOutcome
from hangwatch.nodes.gather import gather_kubectl
from hangwatch.transports import kubectl
from hangwatch.transports.kubectl import KubectlOptions

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures" / "kube"
SRC = Path(hangwatch.__file__).resolve().parents[1]
REMOTE = (sys.executable, "-m", "hangwatch")
# The "pods" share this machine: one at a time, or each collector would see the other's command line
# (which carries the --match pattern). Real pods do not see each other's processes.
ONE_AT_A_TIME = 1


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in first on PATH as ``kubectl``; returns its call log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "kubectl"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {TESTS / "fakes" / "kubectl_standin.py"} "$@"\n')
    wrapper.chmod(0o755)
    log = tmp_path / "kubectl.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HW_KUBE_LOG", str(log))
    monkeypatch.setenv("HW_KUBE_FIXTURE", str(FIXTURES / "lws-vllm.json"))
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    assert shutil.which("kubectl") == str(wrapper)
    return log


@pytest.fixture
def job() -> Iterator[str]:
    """A process to find in the "pods" (all on this machine): its command line carries a unique token."""
    token = f"hw-kube-job-{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", token], env={"RANK": "0"})
    try:
        yield token
    finally:
        proc.kill()
        proc.wait()


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_lws_pods_are_found_by_selector_in_group_order(standin: Path) -> None:
    options = KubectlOptions(namespace="default", context="prod")
    pods = kubectl.discover("leaderworkerset.sigs.k8s.io/name=vllm", options)
    # Listed worker first by the API; ordered leader (worker index 0) first, as SGLang's node ranks are.
    assert [(p.name, p.role, p.container, p.ptrace_added) for p in pods] == [
        ("vllm-0", "lws group 0 leader", "vllm-leader", False),
        ("vllm-0-1", "lws group 0 worker 1", "vllm-worker", True),
    ]
    assert pods[0].node_name == "gpu-node-1" and pods[0].phase == "Running"
    assert _calls(standin) == [
        ["--context", "prod", "--namespace", "default", "get", "pods", "-l",
         "leaderworkerset.sigs.k8s.io/name=vllm", "-o", "json"],
    ]  # fmt: skip
    # Only the leaders: the worker-index label selects them.
    leaders = kubectl.discover(
        "leaderworkerset.sigs.k8s.io/name=vllm,leaderworkerset.sigs.k8s.io/worker-index=0", options
    )
    assert [p.name for p in leaders] == ["vllm-0"]


def test_kuberay_head_comes_first_and_a_pending_worker_is_evidence(
    standin: Path, monkeypatch: pytest.MonkeyPatch, job: str
) -> None:
    monkeypatch.setenv("HW_KUBE_FIXTURE", str(FIXTURES / "kuberay.json"))
    options = KubectlOptions(namespace="ray", remote=REMOTE, concurrency=ONE_AT_A_TIME)
    pods = kubectl.discover("ray.io/cluster=raycluster-kuberay", options)
    assert [(p.role, p.container, p.phase) for p in pods] == [
        ("ray head", "ray-head", "Running"),
        ("ray worker (workergroup)", "ray-worker", "Running"),
        ("ray worker (workergroup)", "ray-worker", "Pending"),
    ]
    results = gather_kubectl(pods, ["--match", job, "--mode", "census", "--every", "0.1"], options)
    assert [r.outcome for r in results] == [NodeOutcome.OK, NodeOutcome.OK, NodeOutcome.UNREACHABLE]
    assert results[2].detail == "the pod is Pending"
    assert all(len(r.bundle.processes) == 1 for r in results[:2] if r.bundle)
    execs = [c for c in _calls(standin) if "exec" in c]
    assert execs[0] == [
        "--namespace", "ray", "exec", "-i", "raycluster-kuberay-head-8xk2p", "-c", "ray-head", "--",
        *REMOTE, "collect", "--match", job, "--mode", "census", "--every", "0.1",
    ]  # fmt: skip
    assert len(execs) == 2  # never into the Pending pod


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="drops CAP_SYS_PTRACE: root")
def test_stacks_denied_for_lack_of_sys_ptrace_say_so_and_what_would_fix_it(standin: Path, job: str) -> None:
    options = KubectlOptions(namespace="default", remote=REMOTE, concurrency=ONE_AT_A_TIME)
    pods = kubectl.discover("leaderworkerset.sigs.k8s.io/name=vllm", options)
    results = gather_kubectl(pods, ["--match", job, "--samples", "1", "--no-native", "--no-probe"], options)
    leader, worker = results
    assert leader.bundle is not None and worker.bundle is not None
    assert leader.bundle.node.sys_ptrace is False and worker.bundle.node.sys_ptrace is True
    # The leader's container does not add SYS_PTRACE: its stacks were denied, and the advice is exact.
    (advice,) = [e.detail for e in leader.bundle.errors if "SYS_PTRACE" in e.detail]
    assert "in pod vllm-0, container vllm-leader: the container lacks CAP_SYS_PTRACE" in advice
    assert "securityContext.capabilities.add: [SYS_PTRACE] to container vllm-leader" in advice
    assert "kubectl debug -it -n default vllm-0 --profile=general --target=vllm-leader" in advice
    assert "hangwatch changes no pod" in advice
    # The worker's container adds it: its stacks were read, and no advice.
    assert worker.bundle.stacks[0].processes[0].outcome.value == "ok"
    assert not [e for e in worker.bundle.errors if "SYS_PTRACE" in e.detail]
    # Read-only towards the cluster: get and exec, nothing else.
    assert {c[c.index("default") + 1] for c in _calls(standin)} == {"get", "exec"}


@pytest.mark.parametrize(
    ("forbid", "pod", "container", "remote", "outcome", "said"),
    [
        ("exec", "vllm-0", None, REMOTE, NodeOutcome.AUTH, 'cannot create resource "pods/exec"'),
        ("", "vllm-9", None, REMOTE, NodeOutcome.UNREACHABLE, 'pods "vllm-9" not found'),
        ("", "vllm-0", "sidecar", REMOTE, NodeOutcome.UNREACHABLE, 'container not found ("sidecar")'),
        (
            "",
            "vllm-0",
            None,
            ("hangwatch-not-in-image",),
            NodeOutcome.NO_COLLECTOR,
            "executable file not found",
        ),
    ],
)
def test_each_exec_failure_is_that_pods_outcome(
    standin: Path, monkeypatch: pytest.MonkeyPatch, forbid: str, pod: str, container: str | None,
    remote: tuple[str, ...], outcome: NodeOutcome, said: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("HW_KUBE_FORBID", forbid)
    options = KubectlOptions(namespace="default", remote=remote, container=container)
    (leader, _) = kubectl.discover("leaderworkerset.sigs.k8s.io/name=vllm", options)
    target = leader if pod == "vllm-0" else type(leader)(**{**leader.__dict__, "name": pod})
    (result,) = gather_kubectl([target], ["--match", "x", "--mode", "census"], options)
    assert result.outcome is outcome and said in result.detail, result.detail


def test_discovery_failures_are_said_not_raised_raw(standin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HW_KUBE_FORBID", "get")
    with pytest.raises(kubectl.KubectlError, match=r"RBAC.*cannot list resource \"pods\""):
        kubectl.discover("app=x", KubectlOptions())
    with pytest.raises(kubectl.KubectlError, match="not a label selector"):
        kubectl.discover("--all-namespaces", KubectlOptions())
    with pytest.raises(kubectl.KubectlError, match="kubectl was not found"):
        kubectl.discover("app=x", KubectlOptions(kubectl="/nonexistent/kubectl"))


def test_stacks_cli_across_pods(standin: Path, job: str, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "hangwatch", "stacks", "--kube-selector", "leaderworkerset.sigs.k8s.io/name=vllm",
         "--kube-namespace", "default", "--match", job, "--remote-hangwatch", " ".join(REMOTE),
         "--no-native", "--concurrency", str(ONE_AT_A_TIME), "--report-json", str(report)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    assert [(n["host"], n["outcome"]) for n in data["nodes"]] == [("vllm-0", "ok"), ("vllm-0-1", "ok")]
    assert "hangwatch stacks across 2 nodes" in done.stdout


def test_attach_across_pods_keeps_one_exec_stream_per_pod(standin: Path, job: str, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "hangwatch", "attach", "--kube-selector", "leaderworkerset.sigs.k8s.io/name=vllm",
         "--kube-namespace", "default", "--match", job, "--remote-hangwatch", " ".join(REMOTE),
         "--window", "30", "--stall-after", "4", "--interval", "1", "--quiet", "--report-json", str(report)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    data = json.loads(report.read_text())
    assert data["verdict"]["state"] == "stalled", (done.stdout, done.stderr)  # a sleeping "server"
    assert [(n["label"], n["rounds_failed"]) for n in data["nodes"]] == [("vllm-0", 0), ("vllm-0-1", 0)]
    assert all(n["rounds_answered"] >= 3 for n in data["nodes"])
    # One kubectl exec per pod for the whole watch (census and stack rounds are lines on it).
    execs = [c for c in _calls(standin) if "exec" in c]
    assert len(execs) == 2 and all(c[-1] == "--stream" for c in execs), execs
