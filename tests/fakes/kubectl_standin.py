"""A stand-in for ``kubectl`` (there is no cluster here): the two verbs hangwatch uses, from pod fixtures.

Put on PATH as ``kubectl`` by the tests (a wrapper script). It answers

* ``[--context C] [--namespace NS] get pods -l SELECTOR -o json`` from the fixture ``$HW_KUBE_FIXTURE``
  (tests/fixtures/kube: real API shapes), filtered by the selector's ``k=v``, ``k!=v`` and ``k`` terms
  and the namespace, printed as the API server's ``List``;
* ``[--context C] --namespace NS exec -i POD -c CONTAINER -- CMD...`` by running CMD on this machine with
  its stdin, as kubectl exec does in the container: inside an emulated node when ``$HW_KUBE_NODES`` (JSON,
  pod -> the node's pid 1) maps the pod, and without CAP_SYS_PTRACE (``setpriv --bounding-set
  -sys_ptrace``, root only) unless the container's securityContext adds it, which is Kubernetes' default.

Its failures are kubectl's own messages: an unknown pod (NotFound), an unknown container, RBAC refusals
(``$HW_KUBE_FORBID`` = get | exec), an executable missing in the container (exit 126). Every call is
appended to ``$HW_KUBE_LOG`` (one JSON argv a line), so a test can check that nothing but get and exec
was ever asked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any


def main(argv: list[str]) -> int:
    log = os.environ.get("HW_KUBE_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps(argv) + "\n")
    context, namespace, rest = None, None, list(argv)
    while rest and rest[0].startswith("--"):
        flag = rest.pop(0)
        if flag in ("--context", "--namespace") and rest:
            value = rest.pop(0)
            context, namespace = (value, namespace) if flag == "--context" else (context, value)
        else:
            return _error(f"error: unknown flag: {flag}")
    with open(os.environ["HW_KUBE_FIXTURE"]) as fh:
        pods: list[dict[str, Any]] = json.load(fh)["items"]
    if namespace is not None:
        pods = [p for p in pods if p["metadata"]["namespace"] == namespace]
    if rest[:2] == ["get", "pods"]:
        return _get(rest[2:], pods, namespace)
    if rest[:1] == ["exec"]:
        return _exec(rest[1:], pods, namespace or "default")
    return _error(f"error: the stand-in knows only get pods and exec: {rest[:2]}")


def _get(args: list[str], pods: list[dict[str, Any]], namespace: str | None) -> int:
    if os.environ.get("HW_KUBE_FORBID") == "get":
        return _error(
            'Error from server (Forbidden): pods is forbidden: User "system:serviceaccount:default:hw" '
            f'cannot list resource "pods" in API group "" in the namespace "{namespace or "default"}"'
        )
    if "-l" not in args or args[args.index("-l") + 1 :][:1] == [] or args[-2:] != ["-o", "json"]:
        return _error("error: the stand-in expects get pods -l SELECTOR -o json")
    selector = args[args.index("-l") + 1]
    chosen = [p for p in pods if _matches(p["metadata"].get("labels", {}), selector)]
    print(
        json.dumps({"apiVersion": "v1", "items": chosen, "kind": "List", "metadata": {"resourceVersion": ""}})
    )
    return 0


def _matches(labels: dict[str, str], selector: str) -> bool:
    for raw in selector.split(","):
        term = raw.strip()
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif term and term not in labels:
            return False
    return True


def _exec(args: list[str], pods: list[dict[str, Any]], namespace: str) -> int:
    if "--" not in args:
        return _error("error: you must specify at least one command for the container")
    head, command = args[: args.index("--")], args[args.index("--") + 1 :]
    if head[:1] != ["-i"] or "-c" not in head:
        return _error("error: the stand-in expects exec -i POD -c CONTAINER -- CMD")
    name, container = head[1], head[head.index("-c") + 1]
    if os.environ.get("HW_KUBE_FORBID") == "exec":
        return _error(
            f'Error from server (Forbidden): pods "{name}" is forbidden: User "system:serviceaccount:default:hw" '
            f'cannot create resource "pods/exec" in API group "" in the namespace "{namespace}"'
        )
    pod = next((p for p in pods if p["metadata"]["name"] == name), None)
    if pod is None:
        return _error(f'Error from server (NotFound): pods "{name}" not found')
    spec = next((c for c in pod["spec"]["containers"] if c["name"] == container), None)
    if spec is None:
        return _error(f'error: unable to upgrade connection: container not found ("{container}")')
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        sys.stderr.write(
            "OCI runtime exec failed: exec failed: unable to start container process: exec: "
            f'"{command[0]}": executable file not found in $PATH: unknown\n'
            "command terminated with exit code 126\n"
        )
        return 126
    prefix: list[str] = []
    nodes = json.loads(os.environ.get("HW_KUBE_NODES", "{}"))
    if name in nodes:
        prefix += ["nsenter", "--target", str(nodes[name]), "--net", "--pid", "--mount", "--uts", "--"]
    added = ((spec.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
    if "SYS_PTRACE" not in added and os.geteuid() == 0 and shutil.which("setpriv"):
        prefix += ["setpriv", "--bounding-set", "-sys_ptrace", "--"]
    return subprocess.run([*prefix, *command], check=False).returncode


def _error(text: str) -> int:
    sys.stderr.write(text + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
