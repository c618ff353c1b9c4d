"""``attach --hosts`` without ssh: census rounds folded into ticks, and the watch loop over a fake fan-out.

The fan-out is replaced by a function that answers what a job of two nodes would (same pids on both
nodes, as pid namespaces give), on a fake clock: ranks burn CPU for a while, then stop; rank 2 on n2
is elsewhere while the others wait in all_reduce. The verdict must be the one assessor's, over both
nodes, with the culprit mapped back to its node and pid; a node that stops answering is evidence.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path

import pytest

import hangwatch
from hangwatch.analyse.nodes import KEY_STRIDE
from hangwatch.analyse.nodewatch import NodeRounds
from hangwatch.model.nodes import BUNDLE_SCHEMA
from hangwatch.model.nodes import ClockReading
from hangwatch.model.nodes import CollectMode
from hangwatch.model.nodes import NodeBundle
from hangwatch.model.nodes import NodeIdentity
from hangwatch.model.nodes import NodeOutcome
from hangwatch.model.nodes import NodeProbe
from hangwatch.model.nodes import NodeProcess
from hangwatch.model.nodes import NodeResult
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import ProcessSample
from hangwatch.model.samples import Tick
from hangwatch.model.stacks import DumpOutcome
from hangwatch.model.stacks import Frame
from hangwatch.model.stacks import ProcessStacks
from hangwatch.model.stacks import StackSample
from hangwatch.model.stacks import ThreadStack
from hangwatch.model.vocabulary import Cause
from hangwatch.model.vocabulary import State
from hangwatch.nodes.gather import result_of
from hangwatch.nodes.watch import NodesAttachOptions
from hangwatch.nodes.watch import NodesWatch
from hangwatch.render.nodes_text import nodes_watch_text
from hangwatch.transports.ssh import SshOptions
from hangwatch.transports.ssh import ssh_session

# node -> (pid namespace, {pid: (global rank, leaf function once stuck)})
JOB = {
    "n1": (11, {7: (0, "all_reduce"), 8: (1, "all_reduce")}),
    "n2": (22, {7: (2, "rank_busy_elsewhere")}),
}
AGENT = 5  # each node's agent, the ranks' parent


def _sample(pid: int, rank: int | None, cpu: float) -> ProcessSample:
    name = "python" if rank is not None else "agent"
    return ProcessSample(
        pid, 1 if rank is None else AGENT, name, ("python", "job.py"), "S", cpu, 0.0, 0, 0, 0, 1, 0, (),
        None if rank is None else "rank", None if rank is None else str(rank),
    )  # fmt: skip


def _bundle(host: str, t: float, cpu: float, full: bool) -> NodeBundle:
    ns, ranks = JOB[host]
    processes = (_sample(AGENT, None, 1.0), *(_sample(pid, r, cpu) for pid, (r, _) in ranks.items()))
    stacks = ()
    if full:
        stacks = (
            StackSample(
                0.0,
                tuple(
                    ProcessStacks(
                        pid,
                        "python",
                        "rank",
                        str(r),
                        DumpOutcome.OK,
                        (
                            ThreadStack(
                                pid,
                                "MainThread",
                                False,
                                False,
                                (Frame("main", "job.py", 1), Frame(leaf, "job.py", 2)),
                            ),
                        ),
                        state="S",
                        cpu_s=cpu,
                        world_size=3,
                    )
                    for pid, (r, leaf) in ranks.items()
                ),
                0.01,
            ),
        )
    node_procs = tuple(
        NodeProcess(p.pid, p.ppid, p.name, p.role, p.rank, "env:RANK" if p.rank else None, 3, {}, 0.0)
        for p in processes
    )
    return NodeBundle(
        BUNDLE_SCHEMA, "0", CollectMode.FULL if full else CollectMode.CENSUS, "match job", NodeIdentity(host, "b", ns, "6"),
        ClockReading(1000.0 + t, t, 0.1), node_procs, (Tick(0.0, processes),), stacks,
    )  # fmt: skip


@dataclass
class FakeJob:
    """Answers each round as the job would at the fake clock's time."""

    progress_until: float = 10.0
    silent: dict[str, float] = field(default_factory=dict)  # host -> refused from this time on
    probes: dict[str, NodeProbe] = field(default_factory=dict)  # host -> what its health URL answers
    now: float = 0.0
    calls: list[str] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    hosts: tuple[str, ...] = ("n1", "n2")

    # The Fanout protocol of nodes/watch.py: what the ssh sessions do, answered from the job's state.
    def census(self) -> list[NodeResult]:
        return self._round("census")

    def stacks(self, native: bool) -> list[NodeResult]:
        return self._round("full-native" if native else "full")

    def close(self) -> None:
        self.calls.append("close")

    def _round(self, request: str) -> list[NodeResult]:
        self.calls.append(request)
        full = request.startswith("full")
        hosts = self.hosts
        self.now += 0.3  # the round's own time on the wire
        # Burning 0.5 CPU seconds a second while progressing; frozen after.
        cpu = 0.5 * min(self.now, self.progress_until)
        out = []
        for h in hosts:
            if h in self.silent and self.now >= self.silent[h]:
                out.append(NodeResult(h, NodeOutcome.REFUSED, "nothing listens for ssh there", None, 0, 0))
            else:
                bundle = _bundle(h, self.now, cpu, full)
                if h in self.probes:
                    bundle = replace(bundle, probes=(self.probes[h],))
                out.append(NodeResult(h, NodeOutcome.OK, "", bundle, 0, 0))
        return out


def _options(**kw: object) -> NodesAttachOptions:
    base = NodesAttachOptions(
        hosts=("n1", "n2"), match="job.py", engine=None, window_s=120.0, stall_after_s=20.0, ready_url=None,
        interval_s=1.0, stacks=True, quiet=True, ssh=SshOptions(), report_json=None,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def _watch(job: FakeJob, **kw: object) -> NodesWatch:
    return NodesWatch(_options(**kw), job, clock=job.clock, sleep=job.sleep)


def test_rounds_compute_deltas_between_rounds_and_keep_silent_nodes_as_last_seen() -> None:
    rounds = NodeRounds(["n1", "n2"])
    ok = [NodeResult(h, NodeOutcome.OK, "", _bundle(h, 0, 1.0, False), 0, 0) for h in ("n1", "n2")]
    first = rounds.tick(1.0, ok)
    assert {p.cpu_delta_s for p in first.processes} == {0.0}
    assert rounds.keys[2 * KEY_STRIDE + 7].node == "n2" and rounds.keys[KEY_STRIDE + 7].node == "n1"
    assert rounds.roots == {KEY_STRIDE + AGENT, 2 * KEY_STRIDE + AGENT}
    later = [NodeResult("n1", NodeOutcome.OK, "", _bundle("n1", 0, 1.75, False), 0, 0)]
    later.append(NodeResult("n2", NodeOutcome.TIMEOUT, "no answer within 4 s", None, 0, 0))
    second = rounds.tick(2.0, later)
    by_key = {p.pid: p for p in second.processes}
    assert by_key[KEY_STRIDE + 7].cpu_delta_s == 0.75  # since the previous round, not the census window
    assert by_key[2 * KEY_STRIDE + 7].cpu_delta_s == 0.0  # silent: as last seen, no progress, no death
    assert by_key[2 * KEY_STRIDE + 7].rank == "n2:rank2"
    assert second.exits == ()
    assert rounds.events() == ["n2 stopped answering at 2.0 s (timeout): no answer within 4 s"]
    # A process gone from a node that answered has ended (status unknown to a fresh collector).
    n2 = _bundle("n2", 0, 1.0, False)
    n2 = replace(n2, ticks=(replace(n2.ticks[0], processes=n2.ticks[0].processes[:1]),))  # the agent only
    third = rounds.tick(3.0, [later[0], NodeResult("n2", NodeOutcome.OK, "", n2, 0, 0)])
    assert [e.pid for e in third.exits] == [2 * KEY_STRIDE + 7]  # n2 answered, without its pid 7 rank
    assert "answered again at 3.0 s" in rounds.events()[-1]


def test_a_job_that_progresses_then_stops_is_stalled_with_the_culprit_on_its_node() -> None:
    job = FakeJob(progress_until=10.0)
    watch = _watch(job)
    verdict = watch.run()
    assert verdict.state is State.STALLED, verdict
    assert verdict.cause is Cause.COLLECTIVE_WAIT, verdict
    # Not before the job stopped progressing: progress on any node was progress of the job.
    assert job.now > 10.0
    (culprit,) = verdict.culprits
    assert watch.rounds.keys[culprit].node == "n2" and watch.rounds.keys[culprit].pid == 7
    assert "n2:rank2" in verdict.summary
    # Census rounds are census; stacks were asked only once it went quiet.
    census = [c for c in job.calls if c == "census"]
    full = [c for c in job.calls if c.startswith("full")]
    assert census and full and len(census) > len(full)
    text = nodes_watch_text(watch.report(verdict, job.now))
    assert "culprits: pid 7 on n2" in text
    assert "n1: answered" in text and "n2: answered" in text


def test_a_node_that_stops_answering_is_evidence_and_the_verdict_is_still_given() -> None:
    job = FakeJob(progress_until=8.0, silent={"n1": 5.0})
    watch = _watch(job)
    verdict = watch.run()
    report = watch.report(verdict, job.now)
    assert verdict.state is State.STALLED
    assert report.verdict.evidence[0].startswith("n1 stopped answering at ")
    (n1, n2) = report.nodes
    assert n1.silent_since_s is not None and n1.last_outcome is NodeOutcome.REFUSED and n1.rounds_failed > 0
    assert n2.silent_since_s is None and n2.rounds_failed == 0
    text = nodes_watch_text(report)
    assert "silent since" in text and "(refused)" in text


def test_a_job_still_progressing_at_the_end_of_the_window_is_a_timeout() -> None:
    job = FakeJob(progress_until=1000.0)
    verdict = _watch(job, window_s=15.0).run()
    assert verdict.state is State.TIMEOUT, verdict
    assert "still progressing" in verdict.summary


def _health(status: int, dummy: str | None = None, rank: int = 0) -> NodeProbe:
    return NodeProbe(
        ProbeResult(0.0, "http://127.0.0.1:30000/health", ProbeOutcome.HTTP, status), rank, dummy
    )


def test_sglangs_dummy_health_on_a_worker_node_is_never_readiness_nor_progress() -> None:
    """n2 answers 200 from SGLang's dummy server the whole time; n1 (the real server) answers 503."""
    dummy = _health(200, "SGLang's dummy health server (node rank 1: /health always 200, /v1/models 404)", 1)
    job = FakeJob(progress_until=6.0, probes={"n1": _health(503), "n2": dummy})
    watch = _watch(job, engine="sglang")
    verdict = watch.run()
    assert verdict.state is State.STALLED, verdict
    (_, n2) = watch.report(verdict, job.now).nodes
    assert any("left out" in e for e in n2.events)


def test_the_real_servers_health_makes_the_job_ready() -> None:
    job = FakeJob(progress_until=1000.0, probes={"n1": _health(200), "n2": _health(200, "dummy", 1)})
    verdict = _watch(job, engine="sglang", window_s=12.0).run()
    assert verdict.state is State.READY, verdict
    assert "serving at the end of the 12 s --window" in verdict.summary


# -- the streaming ssh session, with a stand-in ssh ----------------------------------------------------
FAKE_SSH = """#!/bin/sh
# A stand-in for ssh: the last argument is the remote command; HW_FAKE_SSH says how the "node" behaves.
for last; do :; done
case "$HW_FAKE_SSH" in
  refused) echo "ssh: connect to host n1 port 22: Connection refused" >&2; exit 255 ;;
  silent) exec sleep 60 ;;
esac
exec sh -c "$last"
"""


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SshOptions:
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(Path(hangwatch.__file__).resolve().parents[1]))
    return SshOptions(ssh=str(ssh), remote=(sys.executable, "-m", "hangwatch"), connect_timeout_s=1.0)


def test_a_session_answers_every_request_from_one_remote_process(fake_ssh: SshOptions) -> None:
    session = ssh_session("n1", ["--match", "no-such-process-xyz", "--every", "0.1"], fake_ssh)
    try:
        answers = [result_of(session.ask(r, 20.0)) for r in ("census", "full", "census")]
    finally:
        session.close()
    assert [a.outcome for a in answers] == [NodeOutcome.OK] * 3, [a.detail for a in answers]
    assert [a.bundle.mode.value for a in answers if a.bundle] == ["census", "full", "census"]
    assert session.started == 1  # one handshake, one interpreter for the whole watch


def test_a_session_that_fails_is_that_nodes_outcome_and_is_opened_again(
    fake_ssh: SshOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HW_FAKE_SSH", "refused")
    session = ssh_session("n1", ["--match", "x"], fake_ssh)
    first = session.ask("census", 5.0)
    assert first.outcome is NodeOutcome.REFUSED and "Connection refused" in first.detail
    monkeypatch.setenv("HW_FAKE_SSH", "silent")  # accepts, never answers (a stopped sshd)
    started = time.monotonic()
    second = session.ask("census", 0.5)
    assert second.outcome is NodeOutcome.TIMEOUT
    assert time.monotonic() - started < 5  # the timeout plus the handshake allowance, then killed
    assert session.started == 2
    session.close()
