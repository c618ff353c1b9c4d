"""The collectives' own records read at a stall: torch's Flight Recorder dumps (parsed with no class ever
built from them) and their desync in words, and NCCL's RAS service (its protocol against a loopback
stand-in that answers with the JSON a real NCCL 2.28.9 gave on an H100, and two readings compared)."""

from __future__ import annotations

import json
import pickle
import socket
import threading
from pathlib import Path

import pytest

from builders import verdict
from hangwatch.analyse.flightrecorder import desync
from hangwatch.analyse.flightrecorder import refine_with_flight_recorder
from hangwatch.analyse.ncclras import ras_findings
from hangwatch.collect import flightrecorder
from hangwatch.collect import ncclras
from hangwatch.model.flightrecorder import FlightCapture
from hangwatch.model.ncclras import RasCommunicator
from hangwatch.model.ncclras import RasRank
from hangwatch.model.ncclras import RasSnapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def gloo_dump(enqueued: int, completed: int, ranks: str = "[0, 1, 2]") -> dict:
    """The shape torch 2.13's CPU build dumps for a gloo group (pg_config keyed by the empty name)."""
    entries = [
        {"record_id": i, "pg_id": 0, "collective_seq_id": i + 1, "profiling_name": "gloo:all_reduce",
         "state": "scheduled", "process_group": ["", ""]}
        for i in range(enqueued)
    ]  # fmt: skip
    return {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": ranks}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": enqueued,
                "last_started_collective": -1,
                "last_completed_collective": completed,
            }
        },
        "entries": entries,
    }


def capture(*dumps: tuple[int, dict], missing: tuple = ()) -> FlightCapture:
    return FlightCapture(
        tuple(flightrecorder.parse(d, rank, 100 + rank) for rank, d in dumps),
        missing=missing,
        triggered=len(dumps),
    )


def test_the_ranks_that_never_reached_the_collective_are_named_by_sequence_number():
    c = capture((0, gloo_dump(4, 3)), (1, gloo_dump(4, 3)), (2, gloo_dump(3, 3)))
    d = desync(c)
    assert d is not None and d.behind == (2,) and d.waiting == (0, 1) and d.pids == (102,)
    assert d.text == (
        "Flight Recorder, group 0: ranks 0-1 wait in seq 4 (gloo:all_reduce); rank 2 never reached it "
        "(last enqueued: seq 3)"
    )
    v = refine_with_flight_recorder(verdict(culprits=()), c)
    assert v.culprits == (102,) and v.decided_by[-1] == "stall:flight-recorder" and d.text in v.summary


def test_every_rank_inside_one_collective_names_nobody_behind_and_says_who_gave_no_dump():
    c = capture((0, gloo_dump(6, 5, "[0, 1, 2]")), (1, gloo_dump(6, 5, "[0, 1, 2]")))
    d = desync(c)
    assert d is not None and d.behind == () and d.pids == ()
    assert (
        "ranks 0-1 wait in seq 6 (gloo:all_reduce): every rank read entered it and none completed it"
        in d.text
    )
    assert "rank 2, which gave no dump" in d.text


def test_a_rank_still_inside_a_collective_the_others_finished_is_said_so_in_words():
    d = desync(capture((0, gloo_dump(5, 5, "[0, 1]")), (1, gloo_dump(4, 3, "[0, 1]"))))
    assert d is not None and d.behind == (1,) and d.pids == (101,)
    assert (
        d.text == "Flight Recorder, group 0: rank 1 is inside seq 4 (gloo:all_reduce); rank 0 completed seq 5"
    )


def test_groups_idle_on_every_rank_say_nothing():
    assert desync(capture((0, gloo_dump(4, 4)), (1, gloo_dump(4, 4)))) is None
    v = refine_with_flight_recorder(verdict(culprits=(7,)), capture((0, gloo_dump(4, 4))))
    assert v.culprits == (7,) and "stall:flight-recorder" not in v.decided_by
    assert v.evidence[0].startswith("Flight Recorder: 1 rank dumped")


def test_ranks_with_no_pipe_and_no_dump_add_nothing_to_the_verdict():
    """Gloo ranks under run have the recorder on but no pipe: at a stall nothing is read, nothing said."""
    v = verdict()
    empty = FlightCapture((), missing=((0, "no dump pipe (not NCCL) and no dump"),), triggered=0)
    assert refine_with_flight_recorder(v, empty) == v


def test_a_real_nccl_dump_from_an_h100_parses():
    """torch 2.11 / NCCL 2.28.9: five all-reduces and a barrier, every one completed."""
    data = flightrecorder.load(FIXTURES / "flightrecorder" / "h100_nccl_rank0.pickle")
    dump = flightrecorder.parse(data, 0, 533)
    (g,) = dump.groups
    assert (g.pg, g.desc, g.ranks, g.last_enqueued, g.last_completed) == ("0", "default_pg", (0,), 6, 6)
    assert g.op(6) == "nccl:all_reduce_barrier" and dump.version == "2.10"


def test_a_dump_builds_no_class_and_a_huge_one_is_refused(tmp_path, monkeypatch):
    evil = tmp_path / "fr_rank_0"
    evil.write_bytes(pickle.dumps({"entries": [Path("/etc/passwd")]}))  # a class from another module
    with pytest.raises(pickle.UnpicklingError, match="plain data only"):
        flightrecorder.load(evil)
    monkeypatch.setattr(flightrecorder, "MAX_DUMP_BYTES", 10)
    evil.write_bytes(pickle.dumps(gloo_dump(3, 3)))
    with pytest.raises(ValueError, match="over"):
        flightrecorder.load(evil)
    with pytest.raises(ValueError, match="not a Flight Recorder dump"):
        flightrecorder.parse([1, 2], 0, None)


def test_a_launch_turns_the_recorder_on_unless_the_user_runs_it_their_way(tmp_path):
    env = flightrecorder.launch_environment(tmp_path, {"PATH": "/bin"})
    assert env == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_rank_"),
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_"),
    }
    assert flightrecorder.launch_environment(tmp_path, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}) == {}


# -- NCCL RAS ----------------------------------------------------------------------------------------

REAL = (FIXTURES / "ncclras" / "h100_one_rank.json").read_text()


class StandIn:
    """A loopback RAS service speaking NCCL's client protocol, answering with ``answer``."""

    def __init__(self, answer: str, json_ok: bool = True) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.answer, self.json_ok = answer, json_ok
        self.heard: list[str] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.server.accept()
        with conn, conn.makefile("rwb", buffering=0) as f:
            for line in f:
                text = line.decode().strip()
                self.heard.append(text)
                if text.startswith("CLIENT PROTOCOL"):
                    f.write(b"SERVER PROTOCOL 2\n")
                elif text == "SET FORMAT json":
                    f.write(b"OK\n" if self.json_ok else b"ERROR unknown command\n")
                elif text.endswith("STATUS"):
                    f.write(self.answer.encode())
                    break

    def close(self) -> None:
        self.server.close()


def test_the_ras_client_speaks_the_protocol_and_reads_the_real_answer():
    ras = StandIn(REAL)
    try:
        snap = ncclras.query("127.0.0.1", ras.port, 1.0, timeout_s=5)
    finally:
        ras.close()
    assert ras.heard == ["CLIENT PROTOCOL 2", "SET FORMAT json", "VERBOSE STATUS"]
    assert snap.nccl_version == "2.28.9"
    (comm,) = snap.communicators
    assert comm.size == 1 and comm.missing == () and comm.ranks[0].pid == 686
    assert dict(comm.ranks[0].counts)["AllReduce"] == 0 and comm.ranks[0].errors == ()


def test_a_ras_service_without_json_or_not_there_is_said_so():
    ras = StandIn("", json_ok=False)
    try:
        with pytest.raises(ncclras.RasUnavailable, match=r"NCCL before 2\.28"):
            ncclras.query("127.0.0.1", ras.port, 1.0, timeout_s=5)
    finally:
        ras.close()
    with pytest.raises(ncclras.RasUnavailable, match=r"127\.0\.0\.1:9"):
        ncclras.query("127.0.0.1", 9, 1.0, timeout_s=2)


def snap(
    t: float, counts: dict[int, int], missing: tuple[int, ...] = (), errors: dict[int, tuple] | None = None
) -> RasSnapshot:
    errors = errors or {}
    ranks = tuple(
        RasRank(r, "n1", 100 + r, r, (("AllReduce", n),), errors.get(r, ())) for r, n in counts.items()
    )
    return RasSnapshot(t, "2.28.9", (RasCommunicator("0xabcdef123456", 4, ranks, missing),), 0)


def test_two_readings_tell_a_stuck_collective_from_a_mismatch_from_progress():
    frozen_equal = ras_findings(snap(0, {0: 9, 1: 9, 2: 9, 3: 9}), snap(3, {0: 9, 1: 9, 2: 9, 3: 9}))
    assert frozen_equal == (
        "NCCL RAS, communicator 123456 (4 ranks): every rank read has run 9 collectives and none ran one in 3 s:"
        " all are stuck in the same one (a kernel or a host that does not come back)",
    )
    spread = ras_findings(snap(0, {0: 9, 1: 9, 2: 8, 3: 9}), snap(3, {0: 9, 1: 9, 2: 8, 3: 9}))
    assert "frozen, and spread: rank 2 ran fewer collectives (8 against 9)" in spread[0]
    moving = ras_findings(snap(0, {0: 9, 1: 9}), snap(3, {0: 15, 1: 15}))
    assert "ranks 0-1 ran collectives in the 3 s between two readings" in moving[0]
    gone = ras_findings(snap(0, {0: 9}, (1, 2, 3)), snap(3, {0: 9}, (1, 2, 3), {0: ("async error 5",)}))
    assert "ranks 1-3 unreachable (dead, or never started)" in gone[0] and "rank 0 async error 5" in gone[0]


def test_junk_where_a_dump_or_a_ras_answer_should_be_is_a_note_never_a_crash(tmp_path):
    import os
    import random

    rng = random.Random(7)
    for n in range(40):
        path = tmp_path / f"fr_rank_{n}"
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))))
    for shape in ({"pg_status": [1, 2]}, {"pg_status": {"0": "x"}, "pg_config": [3]}, {"entries": "e"}):
        assert flightrecorder.parse(shape, 0, None).groups == ()
    targets = [flightrecorder.Target(n, os.getpid(), None, tmp_path / f"fr_rank_{n}") for n in range(40)]
    got = flightrecorder.capture(targets, not_before=0.0, wait_s=0.1)
    assert len(got.dumps) + len(got.missing) == 40
    assert all("unreadable" in why for _, why in got.missing)
    for junk in ("[1, 2]", '{"communicators": [1]}', '{"communicators": [{"ranks": "x"}]}'):
        with pytest.raises(ncclras.RasUnavailable, match="not the JSON expected"):
            ncclras.parse(json.loads(junk), 0.0)


def test_a_ranks_pipe_is_found_by_name_poked_and_its_dump_read_with_no_rank_in_the_environment(tmp_path):
    """vLLM's and SGLang's workers carry no RANK: the pipes NCCL made are found by their names. A thread
    stands in for the rank's NCCL monitor (validated for real on an H100): it reads the byte and dumps."""
    import os
    import select
    import subprocess
    import sys
    import threading

    from builders import process_sample

    env = {
        **os.environ,
        "TORCH_FR_BUFFER_SIZE": "10",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_rank_"),
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_"),
    }
    env.pop("RANK", None)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    pipe = tmp_path / "pipe_rank_1.pipe"
    os.mkfifo(pipe)
    (tmp_path / "pipe_rank_x.pipe").write_text("not a fifo, not a rank")
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)

    def monitor() -> None:
        select.select([fd], [], [], 10)
        os.read(fd, 16)
        (tmp_path / "fr_rank_1").write_bytes(pickle.dumps(gloo_dump(5, 4, "[0, 1]")))

    thread = threading.Thread(target=monitor, daemon=True)
    thread.start()
    try:
        found = flightrecorder.targets([process_sample(worker.pid, "worker")])
        assert [(t.rank, t.pid, t.pipe) for t in found] == [(1, None, pipe)]
        got = flightrecorder.capture(found, not_before=0.0, wait_s=5)
    finally:
        worker.kill()
        worker.wait()
        os.close(fd)
    assert got.triggered == 1 and [d.rank for d in got.dumps] == [1] and got.missing == ()
    assert got.dumps[0].groups[0].last_enqueued == 5
