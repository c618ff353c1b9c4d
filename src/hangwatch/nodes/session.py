"""``hangwatch stacks --hosts ...``: the collector on every node, one merged report across them.

Read-only everywhere, as on one machine. A node that does not answer is listed with why, and the
others are still merged: a hang report must not wait on the node that is itself the problem.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hangwatch.analyse.nodes import report_of
from hangwatch.errors import UsageError
from hangwatch.nodes.gather import gather_ssh
from hangwatch.redact import scrub
from hangwatch.render.files import write_atomically
from hangwatch.render.files import write_outputs
from hangwatch.render.json_report import json_text
from hangwatch.render.json_report import plain
from hangwatch.render.nodes_text import nodes_text
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


def remote_args(o: NodesStacksOptions) -> list[str]:
    margin = min(TRANSPORT_MARGIN_S, o.ssh.node_timeout_s / 4)
    deadline = max(1.0, o.ssh.node_timeout_s - o.ssh.connect_timeout_s - margin)
    args = ["--match", o.match, "--mode", "full", "--samples", str(o.samples), "--every", f"{o.every_s:g}"]
    args += ["--deadline", f"{deadline:g}"]
    if not o.native:
        args.append("--no-native")
    if o.engine:
        args += ["--engine", o.engine]
    return args


def stacks_across_nodes(o: NodesStacksOptions) -> int:
    if not o.hosts:
        raise UsageError("--hosts/--hostfile named no node")
    results = gather_ssh(o.hosts, remote_args(o), o.ssh)
    report = report_of(results, f"--match {o.match!r}")
    print(scrub(nodes_text(report)), flush=True)
    if o.report_json is not None:
        data = plain(dataclasses.asdict(report))
        write_outputs(
            [("--report-json", o.report_json, lambda path: write_atomically(path, json_text(data)))]
        )
    return 0 if any(r.bundle is not None for r in results) else 1
