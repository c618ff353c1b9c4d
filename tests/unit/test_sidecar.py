"""The sidecar's reading, its probes' answers and its Prometheus text, from statuses as the watch gives them
(the real processes are in tests/integration/test_sidecar_watch.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from builders import process_sample
from builders import verdict
from hangwatch.analyse.health import STALE_MIN_S
from hangwatch.analyse.health import HealthTracker
from hangwatch.analyse.health import answer
from hangwatch.cli.watch import listen_address
from hangwatch.errors import UsageError
from hangwatch.model.health import Health
from hangwatch.model.health import ProbeKind
from hangwatch.model.health import Reading
from hangwatch.model.samples import ProbeOutcome
from hangwatch.model.samples import ProbeResult
from hangwatch.model.samples import Tick
from hangwatch.model.status import Status
from hangwatch.model.vocabulary import State
from hangwatch.render.metrics_text import metrics_text
from hangwatch.render.metrics_text import rank_labels
from hangwatch.sidecar.client import ask

WALL = 1_800_000_000.0


def status(t: float, quiet: float, *, serving: bool = False, v=None, probe=None) -> Status:
    return Status(
        t=t, phase="weights" if not serving else "ready", phase_label="", in_phase_s=t, phase_line="",
        quiet_s=quiet, last_progress=f"{quiet:.0f} s ago (a log line)", serving=serving,
        time_to_stall_s=None if serving else max(0.0, 10 - quiet), probe=probe, verdict=v,
    )  # fmt: skip


def tick(t: float, alive: bool = True) -> Tick:
    procs = (process_sample(10, "server", rank="TP1"),) if alive else ()
    return Tick(t, procs)


def fold(tracker: HealthTracker, *steps: tuple[float, Status, bool]) -> Health:
    h = None
    for t, st, alive in steps:
        h = tracker.observe(tick(t, alive), st, phases=(("weights", t),))
    assert h is not None
    return h


def tracker() -> HealthTracker:
    return HealthTracker("pid 10", 1.0, wall=lambda: WALL)


STALL = verdict(State.STALLED, culprits=(10,))


def test_a_stall_stands_until_the_tree_moves_again_and_a_recovery_is_counted():
    tr = tracker()
    h = fold(tr, (1, status(1, 0.5), True), (12, status(12, 11, v=STALL), True))
    assert h.reading is Reading.STALLED and h.stalls == 1 and h.culprit_ranks == ("TP1",)
    # A tick where the stall is not decided again (a capture awaited), the quiet spell still growing: it
    # stands, no recovery.
    h = fold(tr, (13, status(13, 12), True), (14, status(14, 13, v=STALL), True))
    assert h.reading is Reading.STALLED and h.recoveries == 0 and h.stalls == 1
    # Progress again: the quiet spell restarts.
    h = fold(tr, (15, status(15, 0.2), True))
    assert h.reading is Reading.PROGRESSING and h.recoveries == 1 and h.verdict is None
    # A second stall is a new one.
    h = fold(tr, (30, status(30, 12, v=STALL), True))
    assert h.stalls == 2 and dict(h.verdicts) == {"stalled": 2}


def test_ready_then_serving_then_a_wedge_while_serving():
    tr = tracker()
    ready = verdict(State.READY, summary="ready after 5 s")
    green = ProbeResult(5.0, "http://127.0.0.1:8000/health", ProbeOutcome.HTTP, 200)
    h = fold(tr, (5, status(5, 0, serving=True, v=ready, probe=green), True))
    assert h.reading is Reading.READY and h.probe_green is True
    h = fold(tr, (6, status(6, 1, serving=True), True))
    assert h.reading is Reading.READY and dict(h.verdicts) == {"ready": 1}
    assert answer(ProbeKind.READINESS, h, WALL).ok and answer(ProbeKind.LIVENESS, h, WALL).ok
    wedged = fold(tr, (70, status(70, 61, serving=True, v=STALL), True))
    assert not answer(ProbeKind.LIVENESS, wedged, WALL).ok
    assert not answer(ProbeKind.READINESS, wedged, WALL).ok


def test_a_crash_whose_tree_is_gone_stays_the_last_word():
    tr = tracker()
    crash = verdict(State.CRASHED, summary="crashed: TP1 killed by SIGKILL")
    h = fold(tr, (3, status(3, 1, v=crash), False), (4, status(4, 0), False))
    assert h.reading is Reading.CRASHED and h.verdict == crash
    for kind in ProbeKind:
        assert not answer(kind, h, WALL).ok


@pytest.mark.parametrize(
    ("reading", "serving", "startup", "liveness", "readiness"),
    [
        (Reading.PROGRESSING, False, True, True, False),
        (Reading.READY, True, True, True, True),
        (Reading.STALLED, False, False, True, False),  # before ready: the startup probe's to judge
        (Reading.STALLED, True, False, False, False),
        (Reading.CRASHED, False, False, False, False),
        (Reading.EXITED, True, False, False, False),
    ],
)
def test_each_probe_fails_only_where_it_should(reading, serving, startup, liveness, readiness):
    h = replace(_health(), reading=reading, serving=serving)
    got = tuple(answer(k, h, WALL).ok for k in (ProbeKind.STARTUP, ProbeKind.LIVENESS, ProbeKind.READINESS))
    assert got == (startup, liveness, readiness)


def test_hangwatch_without_data_passes_startup_and_liveness_open_and_fails_readiness():
    for h, now in (
        (None, WALL),
        (tracker().waiting("no process matches 'sglang' yet"), WALL),
        (replace(_health(), reading=Reading.STALLED, serving=True), WALL + STALE_MIN_S + 1),  # loop behind
    ):
        assert answer(ProbeKind.STARTUP, h, now).ok and answer(ProbeKind.LIVENESS, h, now).ok
        said = answer(ProbeKind.READINESS, h, now)
        assert not said.ok and said.status == 503
    assert (
        "no process matches"
        in answer(ProbeKind.LIVENESS, tracker().waiting("no process matches x"), WALL).reason
    )


def test_readiness_follows_the_engines_own_answer():
    h = replace(_health(), reading=Reading.READY, serving=True, probe_green=False, probe_said="HTTP 503")
    said = answer(ProbeKind.READINESS, h, WALL)
    assert not said.ok and "HTTP 503" in said.reason


def test_the_metrics_parse_as_prometheus_text_with_bounded_labels():
    tr = tracker()
    h = fold(tr, (12, status(12, 11, v=STALL), True))
    text = metrics_text(replace(h, phases=(("weights", 3.5), ('quote"d\\phase', 1.0))), WALL + 2)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    state = {s.labels["state"]: s.value for s in families["hangwatch_state"].samples}
    assert state["stalled"] == 1.0 and sum(state.values()) == 1.0
    assert families["hangwatch_stalls"].samples[0].value == 1.0  # a counter: the parser drops _total
    assert families["hangwatch_reading_age_seconds"].samples[0].value == 2.0
    assert {s.labels.get("phase") for s in families["hangwatch_phase_duration_seconds"].samples} == {
        "weights",
        'quote"d\\phase',
    }
    assert families["hangwatch_culprit"].samples[0].labels == {"tp_rank": "1"}
    # No pid anywhere in a label.
    assert not any("pid" in s.labels for f in families.values() for s in f.samples)
    # Before any reading: up 0, waiting.
    empty = {f.name: f for f in text_string_to_metric_families(metrics_text(None, WALL))}
    assert empty["hangwatch_up"].samples[0].value == 0.0


def test_ranks_are_labelled_as_the_engines_spell_them():
    assert rank_labels("TP1") == {"tp_rank": "1"}
    assert rank_labels("DP0_TP3") == {"dp_rank": "0", "tp_rank": "3"}
    assert rank_labels("PP1-TP2") == {"pp_rank": "1", "tp_rank": "2"}
    assert rank_labels("5") == {"rank": "5"}


def test_listen_takes_host_and_port_and_refuses_the_rest():
    assert listen_address("127.0.0.1:9310") == ("127.0.0.1", 9310)
    assert listen_address("[::1]:0") == ("::1", 0)
    assert listen_address(":9310") == ("0.0.0.0", 9310)
    for bad in ("9310", "host:", "host:99999", "host:port"):
        with pytest.raises(UsageError):
            listen_address(bad)


def test_the_probe_client_passes_open_when_the_sidecar_is_unreachable():
    # Port 9 on loopback: nothing listens (discard is never run here); refused at once.
    url = "http://127.0.0.1:9"
    live = ask(url, ProbeKind.LIVENESS, 1.0)
    assert live.passed and live.exit_code == 0 and "passing open" in live.line
    ready = ask(url, ProbeKind.READINESS, 1.0)
    assert not ready.passed and ready.exit_code == 1 and len(ready.line) < 1024


def _health() -> Health:
    return fold(tracker(), (1, status(1, 0.5), True))


def test_the_trees_gpus_are_labelled_as_dcgm_exporter_does_with_the_rules_state():
    """A GPU the tree holds, busy with every GPM pipe idle: spinning; one it does not hold: not a series."""
    from hangwatch.model.samples import GpuActivity
    from hangwatch.model.samples import GpuProcessMemory
    from hangwatch.model.samples import GpuReading
    from hangwatch.model.samples import GpuSample

    gpu = GpuSample(
        gpus=(
            GpuReading(0, "NVIDIA H200", 100.0, 0.0, 1 << 30, 141 << 30, 120.0, 1980, uuid="GPU-aaaa"),
            GpuReading(1, "NVIDIA H200", 100.0, 40.0, 1 << 30, 141 << 30, 650.0, 1980, uuid="GPU-bbbb"),
        ),
        processes=(GpuProcessMemory(10, 0, 1 << 30),),
        activity=(GpuActivity(0, 1.0, 100.0, 0.7, 0.0, 0.0, 0.0, 0.0, 0.0),),
    )
    tr = tracker()
    h = tr.observe(Tick(5.0, (process_sample(10, "server", rank="TP0"),), gpu=gpu), status(5, 1), phases=())
    assert h.gpus == ((0, "GPU-aaaa", "spinning"),)
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(h, WALL))}
    on = [s.labels for s in families["hangwatch_gpu_state"].samples if s.value == 1.0]
    assert on == [{"gpu": "0", "UUID": "GPU-aaaa", "state": "spinning"}]


def _proc(root, pid: int, ppid: int, cmdline: str, cgroup: str) -> None:
    d = root / str(pid)
    d.mkdir()
    comm = cmdline.split(maxsplit=1)[0].rsplit("/", 1)[-1][:15]
    fields = ["S", str(ppid)] + ["0"] * 17 + ["100"] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    (d / "cgroup").write_text(cgroup)


def test_a_containers_processes_are_selected_by_their_cgroup_topmost_first(tmp_path):
    """shareProcessNamespace: the pod's pause process, the server's container (its entrypoint and a
    worker), and another container; v2 and v1 cgroup files alike."""
    import re

    from hangwatch.collect.proctree import matching_roots

    _proc(tmp_path, 1, 0, "/pause", "0::/kubepods/pod1/cri-containerd-aaaa\n")
    _proc(tmp_path, 20, 1, "python3 -m sglang.launch_server", "0::/kubepods/pod1/cri-containerd-bbbb\n")
    _proc(tmp_path, 21, 20, "python3 -c worker", "0::/kubepods/pod1/cri-containerd-bbbb\n")
    _proc(tmp_path, 30, 1, "nginx", "12:memory:/kubepods/pod1/cccc\n0::/\n")
    assert matching_roots(None, tmp_path, cgroup=re.compile("bbbb")) == [20]
    assert matching_roots(None, tmp_path, cgroup=re.compile("cccc")) == [30]  # a v1 hierarchy's path
    assert matching_roots(re.compile("worker"), tmp_path, cgroup=re.compile("bbbb")) == [21]
    assert matching_roots(re.compile("sglang"), tmp_path, cgroup=re.compile("cccc")) == []


def test_a_client_given_no_usable_url_says_so_and_exits_2(capsys):
    from hangwatch.cli import main

    for url in ("http://127.0.0.1:", "http://127.0.0.1:abc", "https://x:1", "127.0.0.1:9310"):
        assert main(["probe", "--kind", "liveness", "--url", url]) == 2
        assert "give the sidecar's http://HOST:PORT" in capsys.readouterr().err
    assert main(["dump", "--url", "http://:9310"]) == 2
