"""Multi-node output in the one-node words, and one machine under two names read once.

``attach --hosts`` says its verdict's first line as one machine's does (``hangwatch verdict: STALLED
(cause: collective-wait, high confidence)``) and every count with its noun right ("1 node", "1 process").
Two names of one machine (the same boot id, pid namespace and selection) are one node: on a fake
fan-out whose twin collectors, asked for stacks together, each see the other's py-spy pause as a stopped
rank (what two captures of one process at once give), the watch must leave the second name out at its
first answer, never ask it for stacks, and give the job's real cause; through the real CLI and a
stand-in ``ssh`` that runs the collector here, ``--hosts localhost,127.0.0.1`` is one node, said in a
note, for attach and stacks alike. Every process started here is stopped here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path

import pytest
from test_nodes_watch import FakeJob
from test_nodes_watch import _bundle
from test_nodes_watch import _options

import builders
import hangwatch
from hangwatch.analyse.nodes import report_of
from hangwatch.model.nodes import BundleError
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeResult
from hangwatch.model.nodes import NodesWatchReport
from hangwatch.model.nodes import NodeWatchSummary
from hangwatch.model.nodes import RoundCost
from hangwatch.model.report import Verdict
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import StackSample
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import Confidence
from hangwatch.model.vocabulary import State
from hangwatch.nodes.samemachine import MachineIndex
from hangwatch.nodes.samemachine import once_per_machine
from hangwatch.nodes.watch import LeftOutSession
from hangwatch.nodes.watch import NodesWatch
from hangwatch.nodes.watch import StreamFanout
from hangwatch.render.nodes_text import nodes_text
from hangwatch.render.nodes_text import nodes_watch_text
from hangwatch.render.text import verdict_text
from hangwatch.transports.slurm import SlurmOptions
from hangwatch.transports.ssh import SshOptions
from hangwatch.transports.ssh import ssh_session
from hangwatch.transports.stream import StreamSessions
from proc_helpers import kill_tree

SRC = str(Path(hangwatch.__file__).resolve().parents[1])
NOTE = "n1-alias is the same machine as n1 (same boot id and pid namespace): watched once"


# -- the words ----------------------------------------------------------------------------------------
def _watch_report(v: Verdict, *, processes: int = 1, rounds: int = 1) -> NodesWatchReport:
    node = NodeWatchSummary("n1", "n1", 11, rounds, 0, NodeOutcome.OK, "", None, processes)
    return NodesWatchReport(
        "hangwatch.attach-nodes/1", "--match 'x'", v, 12.0, (node,), {}, RoundCost(rounds, 0.1, 0.1, 1, 0.2)
    )


@pytest.mark.parametrize(
    "v",
    [
        builders.verdict(cause=Cause.COLLECTIVE_WAIT, confidence=Confidence.HIGH),
        builders.verdict(cause=Cause.DEAD_PEER),
        builders.verdict(State.TIMEOUT, confidence=Confidence.LOW),  # a confidence without a cause: none
        builders.verdict(State.READY),
    ],
    ids=["cause-and-confidence", "cause-only", "no-cause", "ready"],
)
def test_the_attach_verdict_line_says_the_cause_as_one_machines_verdict_does(v: Verdict) -> None:
    lines = nodes_watch_text(_watch_report(v)).splitlines()
    assert lines[1] == verdict_text(builders.report(v)).splitlines()[0], lines[:3]
    assert lines[2] == f"  {v.summary}"
    if v.cause is not None:
        assert f"(cause: {v.cause.value}" in lines[1]


def test_one_node_one_process_and_one_round_are_said_in_the_singular() -> None:
    text = nodes_watch_text(_watch_report(builders.verdict()))
    assert "hangwatch attach across 1 node (" in text
    assert "n1: answered 1 of 1 round; 1 process as last seen" in text
    assert "census: 1 round across the nodes, median 0.10 s (max 0.10 s); 1 stack round, median" in text
    plural = nodes_watch_text(_watch_report(builders.verdict(), processes=3, rounds=2))
    assert "answered 2 of 2 rounds; 3 processes as last seen" in plural and "2 rounds across" in plural
    bundle = _bundle("n1", 0.0, 1.0, True)
    errors = tuple(BundleError("procfs", f"error {i}") for i in range(6))
    bundle = replace(bundle, processes=bundle.processes[:1], errors=errors)
    stacks = nodes_text(report_of([NodeResult("n1", NodeOutcome.OK, "", bundle, 0.0, 1.0)], "--match 'x'"))
    assert "hangwatch stacks across 1 node (--match 'x'): 1 answered, 0 failed" in stacks
    assert "n1 (n1, pid ns 11): 1 process, no ranks; " in stacks
    assert "  ... 1 more error\n" in stacks


# -- which answers are one machine ---------------------------------------------------------------------
def _answer(host: str, boot: str, ns: int, selector: str = "match job") -> NodeResult:
    bundle = _bundle("n1", 0.0, 1.0, False)
    bundle = replace(bundle, selector=selector, node=replace(bundle.node, boot_id=boot, pid_ns=ns))
    return NodeResult(host, NodeOutcome.OK, "", bundle, 0.0, 0.0)


def _silent(host: str) -> NodeResult:
    return NodeResult(host, NodeOutcome.REFUSED, "nothing listens", None, 0.0, 0.0)


def test_the_same_boot_id_pid_namespace_and_selection_are_one_machine_and_nothing_less_is() -> None:
    left = MachineIndex().observe(
        [
            _answer("h1", "boot-a", 11),
            _answer("h1-ip", "boot-a", 11),  # the same machine and namespace: one
            _answer("ctr", "boot-a", 12),  # a container, or an emulated node: its own pid namespace
            _answer("other", "boot-b", 11),  # another kernel: an equal inode says nothing
            _answer("ray-node-2", "boot-a", 11, "pid 812,813"),  # Ray: another node's actors
            _answer("no-boot-id", "", 11),  # a bundle that cannot tell
            _answer("no-ns", "boot-a", 0),
        ]
    )
    assert [(s.index, s.host, s.kept_index, s.kept_host) for s in left] == [(1, "h1-ip", 0, "h1")]
    assert left[0].note("watched once") == (
        "h1-ip is the same machine as h1 (same boot id and pid namespace): watched once"
    )


def test_a_name_is_checked_at_its_first_answer_against_every_earlier_one() -> None:
    index = MachineIndex()
    # h2 answers first: the first name silent then is the one left out when it answers.
    assert index.observe([_silent("h1"), _answer("h2", "boot-a", 11)]) == []
    (late,) = index.observe([_answer("h1", "boot-a", 11), _answer("h2", "boot-a", 11)])
    assert (late.host, late.kept_host) == ("h1", "h2")
    # Checked once: later rounds of a name already seen are not compared again.
    assert index.observe([_answer("h1", "boot-a", 11), _answer("h2", "boot-a", 11)]) == []


def test_stacks_collect_the_kept_name_again_alone_and_keep_its_first_answer_if_that_fails() -> None:
    first = [_answer("h1", "boot-a", 11), _answer("h1-ip", "boot-a", 11), _answer("h2", "boot-a", 22)]
    asked: list[list[int]] = []
    again = _answer("h1", "boot-a", 11)

    def collect_again(indices: list[int]) -> list[NodeResult]:
        asked.append(indices)
        return [again]

    once = once_per_machine(first, collect_again)
    assert asked == [[0]]  # only the kept name of a machine read twice, not h2
    assert [r.host for r in once.results] == ["h1", "h2"] and once.results[0] is again
    (note,) = once.notes
    assert note.startswith("h1-ip is the same machine as h1 (same boot id and pid namespace): collected once")
    failed = once_per_machine(first, lambda ix: [_silent("h1")])
    assert failed.results[0] is first[0]
    distinct = [first[0], first[2]]
    assert once_per_machine(distinct, lambda ix: pytest.fail("nothing to collect again")).results == tuple(
        distinct
    )


# -- the watch over a fake fan-out ---------------------------------------------------------------------
def _paused_by_the_other(bundle: NodeBundle) -> NodeBundle:
    """What a capture finds while another collector's py-spy holds the ranks: tracing stop, not dumped."""

    def stopped(s: StackSample) -> StackSample:
        processes = tuple(
            replace(p, outcome=DumpOutcome.STOPPED, state="t", threads=(), detail="stopped (state t)")
            if p.rank is not None
            else p
            for p in s.processes
        )
        return replace(s, processes=processes)

    return replace(bundle, stacks=tuple(stopped(s) for s in bundle.stacks))


@dataclass
class OneMachineTwice(FakeJob):
    """n1 also named n1-alias: the same machine, pid namespace and selection, answering as n1 does."""

    hosts: tuple[str, ...] = ("n1", "n1-alias", "n2")
    alias_silent_until: float = 0.0
    dropped: dict[int, str] = field(default_factory=dict)
    asked: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def drop(self, index: int, detail: str) -> None:
        self.dropped[index] = detail

    def _round(self, request: str) -> list[NodeResult]:
        self.calls.append(request)
        full = request.startswith("full")
        self.now += 0.3
        cpu = 0.5 * min(self.now, self.progress_until)
        asked = tuple(h for i, h in enumerate(self.hosts) if i not in self.dropped)
        self.asked.append((request, asked))
        together = {"n1", "n1-alias"} <= set(asked) and self.now >= self.alias_silent_until
        out = []
        for i, h in enumerate(self.hosts):
            if i in self.dropped:
                out.append(NodeResult(h, NodeOutcome.REMOTE_ERROR, self.dropped[i], None, 0, 0))
            elif h == "n1-alias" and self.now < self.alias_silent_until:
                out.append(_silent(h))
            else:
                bundle = _bundle("n1" if h == "n1-alias" else h, self.now, cpu, full)
                bundle = _paused_by_the_other(bundle) if together else bundle
                out.append(NodeResult(h, NodeOutcome.OK, "", bundle, 0, 0))
        return out


def _twice_watch(job: OneMachineTwice) -> NodesWatch:
    return NodesWatch(_options(hosts=job.hosts), job, clock=job.clock, sleep=job.sleep)


@pytest.mark.parametrize("alias_silent_until", [0.0, 3.0], ids=["answers-at-once", "answers-late"])
def test_a_machine_under_two_names_is_watched_once_and_its_pauses_are_not_a_stopped_cause(
    alias_silent_until: float,
) -> None:
    job = OneMachineTwice(progress_until=10.0, alias_silent_until=alias_silent_until)
    watch = _twice_watch(job)
    verdict = watch.run()
    report = watch.report(verdict, job.now)
    assert verdict.state is State.STALLED, verdict
    assert verdict.cause is Cause.COLLECTIVE_WAIT, (verdict.cause, verdict.summary)
    (culprit,) = verdict.culprits
    assert watch.rounds.keys[culprit].node == "n2"
    # Left out at its first answer, a census; no stack round ever asked it.
    assert job.dropped == {1: NOTE}
    first = next(i for i, (_, hosts) in enumerate(job.asked) if "n1-alias" not in hosts)
    assert all(request == "census" for request, _ in job.asked[:first])
    assert all("n1-alias" not in hosts for request, hosts in job.asked if request.startswith("full"))
    # Its processes were never merged, its silence is no evidence, and the report says why it is not there.
    assert {k.node for k in watch.rounds.keys.values()} == {"n1", "n2"}
    assert [n.label for n in report.nodes] == ["n1", "n2"]
    assert report.notes == (NOTE,)
    assert not [e for e in report.verdict.evidence if "n1-alias" in e]
    text = nodes_watch_text(report)
    assert "hangwatch attach across 2 nodes (" in text and f"  note: {NOTE}" in text
    assert "\nhangwatch verdict: STALLED (cause: collective-wait, " in text


def test_discovered_nodes_are_never_left_out() -> None:
    """Pods, a Slurm job's nodes and Ray's nodes are each its own (the check is for --hosts' names)."""
    job = OneMachineTwice(progress_until=6.0)
    o = _options(hosts=job.hosts, slurm=SlurmOptions(job="7"))
    watch = NodesWatch(o, job, clock=job.clock, sleep=job.sleep)
    watch.run()
    assert job.dropped == {} and watch.left_out == {}


# -- real sessions and the CLI, with a stand-in ssh that runs the collector here -------------------------
FAKE_SSH = """#!/bin/sh
for last; do :; done
exec sh -c "$last"
"""


@pytest.fixture
def fake_ssh_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", SRC)
    return bin_dir


@pytest.fixture
def server() -> Iterator[str]:
    """A sleeping "rank 0" to find on "both hosts"; its command line carries a unique token."""
    token = f"hw-same-machine-{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", token],
        env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"},
        start_new_session=True,
    )
    try:
        yield token
    finally:
        kill_tree(proc)


def test_dropping_a_name_closes_its_session_and_it_is_never_asked_again(
    fake_ssh_dir: Path, server: str
) -> None:
    ssh = SshOptions(ssh=str(fake_ssh_dir / "ssh"), remote=(sys.executable, "-m", "hangwatch"))
    args = ["--match", server, "--every", "0.1", "--no-probe"]
    sessions = [ssh_session(h, args, ssh) for h in ("localhost", "127.0.0.1")]
    o = _options(hosts=("localhost", "127.0.0.1"), ssh=ssh)
    fanout = StreamFanout(o, StreamSessions(sessions, 2))
    try:
        first = fanout.census()
        assert [r.outcome for r in first] == [NodeOutcome.OK] * 2, [r.detail for r in first]
        assert all(r.bundle is not None and len(r.bundle.processes) == 1 for r in first)
        twin = sessions[1]._proc
        assert twin is not None
        fanout.drop(1, "127.0.0.1 is the same machine as localhost")
        assert twin.poll() is not None  # its collector ended with its input
        assert isinstance(fanout.sessions.sessions[1], LeftOutSession)
        (kept, left) = fanout.stacks(False)
        assert kept.bundle is not None and kept.bundle.stacks
        assert left.bundle is None and left.detail == "127.0.0.1 is the same machine as localhost"
        assert sessions[1].started == 1  # never opened again
    finally:
        fanout.close()


def _cli(fake_ssh_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{fake_ssh_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": SRC}
    remote = f"{sys.executable} -m hangwatch"
    return subprocess.run(
        [sys.executable, "-m", "hangwatch", *args, "--remote-hangwatch", remote],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_attach_hosts_localhost_and_127_0_0_1_is_one_node(
    fake_ssh_dir: Path, server: str, tmp_path: Path
) -> None:
    report = tmp_path / "r.json"
    done = _cli(
        fake_ssh_dir, "attach", "--hosts", "localhost,127.0.0.1", "--match", server, "--window", "20",
        "--stall-after", "3", "--interval", "0.5", "--quiet", "--report-json", str(report),
    )  # fmt: skip
    data = json.loads(report.read_text())
    note = "127.0.0.1 is the same machine as localhost (same boot id and pid namespace): watched once"
    assert [n["label"] for n in data["nodes"]] == ["localhost"], (done.stdout, done.stderr)
    assert data["notes"] == [note]
    assert data["verdict"]["state"] == "stalled" and data["verdict"]["cause"] != "stopped", done.stdout
    assert "hangwatch attach across 1 node (" in done.stdout and f"  note: {note}" in done.stdout
    assert "\nhangwatch verdict: STALLED" in done.stdout


def test_stacks_hosts_localhost_and_127_0_0_1_is_one_node(
    fake_ssh_dir: Path, server: str, tmp_path: Path
) -> None:
    report = tmp_path / "r.json"
    done = _cli(
        fake_ssh_dir, "stacks", "--hosts", "localhost,127.0.0.1", "--match", server, "--no-native",
        "--samples", "2", "--every", "0.5", "--report-json", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    assert [n["host"] for n in data["nodes"]] == ["localhost"], done.stdout
    assert data["ranks"]["duplicated"] == [] and [r["rank"] for r in data["ranks"]["found"]] == [0]
    (note,) = data["notes"]
    assert note.startswith("127.0.0.1 is the same machine as localhost (same boot id and pid namespace)")
    assert "collected once, localhost again alone" in note
    assert "hangwatch stacks across 1 node (" in done.stdout and "1 process, rank0" in done.stdout
    assert data["diagnosis"]["cause"] != "stopped"
