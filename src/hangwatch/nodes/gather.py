"""The fan-out: the collector on every node through a transport, each answer decoded into a ``NodeResult``.

A node whose answer is not a bundle (not JSON, another schema, a field missing) is that node's
``bad-output``, said with what was wrong; nothing here raises for one node.
"""

from __future__ import annotations

from collections.abc import Sequence

from hangwatch.model.nodes import NodeAnswer
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeResult
from hangwatch.nodes import codec
from hangwatch.transports import ssh


def result_of(answer: NodeAnswer) -> NodeResult:
    size = len(answer.stdout)
    if answer.outcome is not NodeOutcome.OK:
        return NodeResult(
            answer.host, answer.outcome, answer.detail, None, answer.sent_wall_s, answer.received_wall_s
        )
    try:
        bundle = codec.decode(answer.stdout.decode("utf-8", "replace"))
    except codec.BundleDecodeError as exc:
        detail = f"not a node bundle: {str(exc)[:300]}"
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


def gather_ssh(hosts: Sequence[str], remote_args: Sequence[str], options: ssh.SshOptions) -> list[NodeResult]:
    return ssh.collect_nodes(hosts, remote_args, options, finish=result_of)
