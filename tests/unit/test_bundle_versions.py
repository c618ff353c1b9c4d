"""Bundles a controller may be sent: the current schema, the older one, another hangwatch's, junk, and a
node over its size limit. Each is read, or refused with the reason named for that node alone: one
node's answer never stops the fan-out or the others' analysis."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from typing import Any

import pytest

from hangwatch.analyse.nodes import report_of
from hangwatch.model.nodes import BUNDLE_SCHEMA
from hangwatch.model.nodes import BUNDLE_SCHEMA_V1
from hangwatch.model.nodes import ClockReading
from hangwatch.model.nodes import CollectMode
from hangwatch.model.nodes import LogTail
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.nodes import NodeIdentity
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeProcess
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.nodes import codec
from hangwatch.nodes.collector import within_size
from hangwatch.nodes.gather import result_of
from hangwatch.render.nodes_text import nodes_text
from hangwatch.transports import ssh
from hangwatch.transports.ssh import Exchange
from hangwatch.transports.ssh import SshOptions
from hangwatch.transports.ssh import collect_nodes

WAIT = (Frame("main", "job.py", 3), Frame("all_reduce", "torch/distributed/distributed_c10d.py", 2501))
ODD = (Frame("main", "job.py", 3), Frame("save_checkpoint", "job.py", 40))


def _bundle(host: str, first_rank: int, odd: bool = False, logs: int = 0) -> NodeBundle:
    """Two ranks a node, two stack rounds; ``odd``: the node's second rank is elsewhere."""
    pids = (100, 101)
    ranks = {pid: str(first_rank + i) for i, pid in enumerate(pids)}
    procs = tuple(
        NodeProcess(pid, 1, "python", "rank", ranks[pid], "env:RANK", 4, {"RANK": ranks[pid]}, 0.0)
        for pid in pids
    )

    def stacks(pid: int) -> ProcessStacks:
        frames = ODD if odd and pid == 101 else WAIT
        thread = ThreadStack(pid, "MainThread", False, False, frames)
        return ProcessStacks(
            pid, "python", "rank", ranks[pid], DumpOutcome.OK, (thread,), "S", 1.0, world_size=4
        )

    samples = tuple(StackSample(float(i), tuple(stacks(pid) for pid in pids), 0.01) for i in range(2))
    ticks = tuple(
        Tick(
            float(i),
            tuple(
                ProcessSample(pid, 1, "python", (), "S", 1.0, 0.0, 0, 0, 0, 1, 0, (), "rank", ranks[pid])
                for pid in pids
            ),
        )
        for i in range(2)
    )
    tails = (
        (LogTail("/var/log/job.log", tuple(f"step {i}: " + "x" * 80 for i in range(logs))),) if logs else ()
    )
    return NodeBundle(
        BUNDLE_SCHEMA,
        "0.1.0",
        CollectMode.FULL,
        "match x",
        NodeIdentity(host, f"boot-{host}", 4026531836, "6.1"),
        ClockReading(1000.0, 5.0, 0.5),
        procs,
        ticks,
        samples,
        logs=tails,
    )


def _as_v1(text: str) -> str:
    """What a collector of schema /1 sent: every thread's frames in place, no stack table."""
    data: dict[str, Any] = json.loads(text)
    table, order = data.pop("stack_table"), iter(data.pop("thread_stacks"))
    for sample in data["stacks"]:
        for process in sample["processes"]:
            for thread in process["threads"]:
                thread["frames"] = table[next(order)]
    data["schema"] = BUNDLE_SCHEMA_V1
    return json.dumps(data)


def _fan_out(outputs: dict[str, bytes]) -> list[Any]:
    """The ssh fan-out over fake nodes, each answering with its bytes, finished as the controller does."""

    def runner(argv: list[str], deadline: float) -> Exchange:
        host = next(a for a in argv if a in outputs)
        return Exchange(0, outputs[host], "", 1000.0, 1000.5)

    return collect_nodes(list(outputs), [], SshOptions(concurrency=4), result_of, runner)


# -- the schemas read ---------------------------------------------------------------------------------
def test_each_distinct_stack_is_sent_once_and_the_ranks_share_it() -> None:
    bundle = _bundle("n1", 0)
    text = codec.encode(bundle)
    data = json.loads(text)
    assert data["schema"] == BUNDLE_SCHEMA == "hangwatch.node-bundle/2"
    assert len(data["stack_table"]) == 1 and data["thread_stacks"] == [0, 0, 0, 0]
    back = codec.decode(text.encode())
    assert back == bundle
    threads = [t for s in back.stacks for p in s.processes for t in p.threads]
    assert len({id(t.frames) for t in threads}) == 1  # one interned tuple: the analysis computes it once


def test_the_older_schema_is_still_read() -> None:
    bundle = _bundle("n1", 0, odd=True)
    old = _as_v1(codec.encode(bundle))
    back = codec.decode(old)
    assert back == replace(bundle, schema=BUNDLE_SCHEMA_V1)
    threads = [t for s in back.stacks for p in s.processes for t in p.threads]
    assert len({id(t.frames) for t in threads}) == 2  # equal stacks interned, as /2's are
    assert json.loads(codec.encode(back))["schema"] == BUNDLE_SCHEMA  # written again in the current one


def test_a_float_written_as_null_is_read_as_nan() -> None:
    """``plain`` writes a float that was not finite as null; the typed decoder refuses it, the generic
    one reads it."""
    bundle = _bundle("n1", 0)
    data = json.loads(codec.encode(bundle))
    data["clock"]["duration_s"] = None
    back = codec.decode(json.dumps(data))
    assert math.isnan(back.clock.duration_s)
    assert back.stacks == bundle.stacks


def test_text_that_is_not_utf8_throughout_is_read_with_the_bad_bytes_replaced() -> None:
    bundle = _bundle("n1", 0, logs=1)
    raw = codec.encode(bundle).encode().replace(b"step 0: ", b"step 0: \xff\xfe")
    back = codec.decode(raw)
    assert back.logs[0].lines[0].startswith("step 0: \ufffd\ufffd")


# -- refused, per node ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ("hangwatch.node-bundle/3", "'hangwatch.node-bundle/3' (hangwatch 9.0.0 on the node) is newer"),
        ("hangwatch.node-bundle/0", "'hangwatch.node-bundle/0' (hangwatch 9.0.0 on the node) is older"),
        ("hangwatch.report/1", "'hangwatch.report/1' (hangwatch 9.0.0 on the node) is not a node bundle"),
    ],
)
def test_another_hangwatchs_bundle_is_refused_with_its_version_named(schema: str, needle: str) -> None:
    data = json.loads(codec.encode(_bundle("n2", 2)))
    data["schema"], data["collector_version"] = schema, "9.0.0"
    # A newer schema may reshape anything: the version is what is said.
    data["stacks"], data["stack_table"] = "reshaped", {"reshaped": True}
    with pytest.raises(codec.BundleVersionError, match=re.escape(f"{BUNDLE_SCHEMA_V1} and {BUNDLE_SCHEMA}")):
        codec.decode(json.dumps(data))
    result = result_of_text(json.dumps(data).encode())
    assert result.outcome is NodeOutcome.BAD_OUTPUT and needle in result.detail
    assert not result.detail.startswith("not a node bundle")  # named as another version, not as junk


def result_of_text(stdout: bytes) -> Any:
    (result,) = _fan_out({"n2": stdout})
    return result


@pytest.mark.parametrize(
    ("stdout", "needle"),
    [
        (b"Traceback (most recent call last):\n  File ...", "not a node bundle: not JSON"),
        (bytes(range(256)) * 4, "not a node bundle: not JSON"),
        (b"", "not a node bundle: not JSON"),
        (b"[1, 2, 3]", "not a node bundle: not a JSON object"),
        (b'{"schema": "hangwatch.node-bundle/2"' + b"[" * 100_000, "not a node bundle"),
        (b"[" * 100_000 + b"]" * 100_000, "not a node bundle"),
        (json.dumps({"schema": BUNDLE_SCHEMA}).encode(), "missing"),
    ],
)
def test_junk_is_that_nodes_bad_output_and_the_others_are_read(stdout: bytes, needle: str) -> None:
    good = codec.encode(_bundle("n1", 0)).encode()
    old = _as_v1(codec.encode(_bundle("n3", 2, odd=True))).encode()
    results = _fan_out({"n1": good, "n2": stdout, "n3": old})
    assert [r.outcome for r in results] == [NodeOutcome.OK, NodeOutcome.BAD_OUTPUT, NodeOutcome.OK]
    assert needle in results[1].detail
    report = report_of(results, "match x")
    # The two nodes that answered are analysed together: rank 3 on n3 is the odd one out of the job.
    assert report.diagnosis.cause.value == "collective-wait"
    assert "n2: no bundle (bad-output)" in nodes_text(report)


def test_a_stack_table_that_does_not_match_the_threads_is_refused() -> None:
    data = json.loads(codec.encode(_bundle("n1", 0)))
    data["thread_stacks"] = [0, 0, 0]
    with pytest.raises(codec.BundleDecodeError, match="names 3 stacks for 4 threads"):
        codec.decode(json.dumps(data))
    data["thread_stacks"] = [0, 0, 0, 7]
    with pytest.raises(codec.BundleDecodeError, match="7 is not an entry of the stack table"):
        codec.decode(json.dumps(data))


# -- a node over its size limit ------------------------------------------------------------------------
def test_a_node_over_max_bytes_is_cut_and_the_controller_says_so() -> None:
    """The collector's --max-bytes: the parts least needed are dropped, and the controller's report names
    the node and what was dropped, beside the other nodes' evidence."""
    big = _bundle("n2", 2, odd=True, logs=200)
    assert len(codec.encode(big)) > 5000
    cut = within_size(big, 5000)
    assert len(codec.encode(cut).encode()) <= 5000 and cut.truncated and cut.logs == ()
    results = _fan_out({"n1": codec.encode(_bundle("n1", 0)).encode(), "n2": codec.encode(cut).encode()})
    assert all(r.outcome is NodeOutcome.OK for r in results)
    assert results[1].bundle is not None and results[1].bundle.truncated
    report = report_of(results, "match x")
    text = nodes_text(report)
    assert "error (limits): over 5000 bytes: dropped log tails" in text
    assert report.diagnosis.cause.value == "collective-wait"  # the stacks that fit are still analysed


def test_output_over_the_transports_limit_is_refused_with_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose collector ignores its limit (another version, a broken one) cannot swamp the
    controller: its answer is cut off at the transport, with the size named."""
    monkeypatch.setattr(ssh, "MAX_OUTPUT_BYTES", 1000)
    good = codec.encode(_bundle("n1", 0))
    results = _fan_out({"n1": b"x" * 500, "n2": good.encode()})
    assert results[1].outcome is NodeOutcome.BAD_OUTPUT
    assert f"{len(good)} bytes, over the 1000 limit" in results[1].detail
