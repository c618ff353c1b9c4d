"""/proc parsers against real text captured from this machine's /proc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hangwatch.collect import procfs


def _stat_line(comm: str) -> str:
    """A /proc/PID/stat line laid out as proc(5) says: fields 3..52 after "(comm)"."""
    fields = ["0"] * 50
    fields[0] = "S"  # 3 state
    fields[1] = fields[2] = fields[3] = "4200"  # 4 ppid, 5 pgrp, 6 session
    fields[11], fields[12] = "250", "50"  # 14 utime, 15 stime
    fields[17] = "49"  # 20 num_threads
    fields[19] = "987654"  # 22 starttime
    fields[21] = "51200"  # 24 rss
    fields[49] = "256"  # 52 exit_code
    return f"4242 ({comm}) " + " ".join(fields)


# setproctitle can put spaces and parentheses in comm.
STAT = _stat_line("VLLM::Work (x) 1")


def test_parse_stat_with_parentheses_in_comm():
    s = procfs.parse_stat(4242, STAT)
    assert s.comm == "VLLM::Work (x) 1"
    assert (s.state, s.ppid, s.pgrp, s.session) == ("S", 4200, 4200, 4200)
    assert s.num_threads == 49
    assert s.starttime_ticks == 987654
    assert s.cpu_s == (250 + 50) / procfs.CLOCK_TICKS
    assert s.exit_code == 256  # waitpid status of exit(1)


def test_read_stat_of_this_process_and_of_a_missing_one():
    me = procfs.read_stat(os.getpid())
    assert me is not None and me.pid == os.getpid() and me.state in "RS"
    assert procfs.read_stat(2**22 + 12345) is None


def test_parse_io():
    text = "rchar: 1234\nwchar: 99\nsyscr: 5\nsyscw: 1\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
    assert procfs.parse_io(text) == (1234, 99)


def test_parse_listening_only_listen_state():
    text = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5555 1\n"
        "   1: 0100007F:A0B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 6666 1\n"
    )
    assert procfs.parse_listening(text) == {5555: 8080}


def test_process_title_prefers_setproctitle_names():
    assert procfs.process_title(("VLLM::Worker_TP1",), "python3") == "VLLM::Worker_TP1"
    assert procfs.process_title(("sglang::scheduler_TP0   ",), "python") == "sglang::scheduler_TP0"
    assert procfs.process_title(("/usr/bin/python3", "-m", "x"), "python3") == "python3"


def test_zombie_exit_code_is_readable_before_reaping(tmp_path: Path):
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
    try:
        import time

        deadline = time.monotonic() + 10
        stat = procfs.read_stat(child.pid)
        while stat is not None and stat.state != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
            stat = procfs.read_stat(child.pid)
        assert stat is not None and stat.state == "Z"
        assert stat.exit_code is not None and os.WEXITSTATUS(stat.exit_code) == 7
    finally:
        child.wait()


def test_environ_reads_only_named_keys():
    env = {**os.environ, "RANK": "3", "HF_TOKEN": "hf_secretsecretsecretsecret"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        import time

        time.sleep(0.2)
        found = procfs.read_environ(child.pid, frozenset({"RANK"}))
        assert found == {"RANK": "3"}
    finally:
        child.kill()
        child.wait()


def test_states_are_named_at_the_boundary_and_print_as_the_kernels_letters():
    """psutil's names for the letters of proc(5); the value stays the letter, so reports do not change."""
    import json

    from hangwatch.model.samples import STOPPED_STATES
    from hangwatch.model.samples import ProcessId
    from hangwatch.model.samples import ProcState
    from hangwatch.render.json_report import plain

    s = procfs.parse_stat(4242, STAT)
    assert s.state is ProcState.SLEEPING and f"{s.state}" == "S" and json.dumps(plain(s.state)) == '"S"'
    assert procfs.parse_stat(1, STAT.replace(") S ", ") t ")).state in STOPPED_STATES
    assert procfs.parse_stat(1, STAT.replace(") S ", ") D ")).state is ProcState.DISK_SLEEP
    assert procfs.parse_stat(1, STAT.replace(") S ", ") x ")).state is ProcState.DEAD  # 2.6.33-3.13
    assert procfs.parse_stat(1, STAT.replace(") S ", ") Q ")).state is ProcState.UNKNOWN  # never raises
    assert s.identity == ProcessId(4242, 987654) == (4242, 987654) and s.identity.start_ticks == 987654
