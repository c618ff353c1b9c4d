"""The phase-history database (collect/historydb.py): records and reads back, stays bounded, takes two
writers at once, and never crashes or silently loses a file it cannot use."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hangwatch.collect import historydb
from hangwatch.collect.historydb import HistoryUnavailable
from hangwatch.collect.historydb import history_path
from hangwatch.collect.historydb import open_history
from hangwatch.model.history import BootKey
from hangwatch.model.history import BootRecord
from hangwatch.model.history import PhaseDuration

SRC = Path(__file__).resolve().parents[2] / "src"


def key(model: str = "/models/llama", **changes: object) -> BootKey:
    fields: dict[str, object] = {
        "engine": "vllm", "engine_version": "0.11.0", "model": model, "model_bytes": 15 << 30,
        "program": None, "tp": 2, "pp": 1, "dp": 1, "ep": 1, "switches": (), "gpu_model": "NVIDIA H200",
        "gpu_count": 8, "host": "gpu1", "caches_warm": True,
    }  # fmt: skip
    fields.update(changes)
    return BootKey(**fields)  # type: ignore[arg-type]


def boot(weights: float, cuda_graph: float = 60.0, started: str = "2025-01-01T00:00:00+00:00") -> BootRecord:
    phases = (PhaseDuration("weights", weights), PhaseDuration("cuda_graph", cuda_graph))
    return BootRecord(started, "ready", "run", phases)


def opened(path: Path) -> historydb.HistoryStore:
    store, notes = open_history(path)
    assert store is not None and notes == [], notes
    return store


def read_only(path: Path, monkeypatch: pytest.MonkeyPatch) -> historydb.HistoryStore:
    """The history at ``path`` opened as from a folder that takes no files, with the one note that says so.
    Root writes through a mode of 0500: what the module asks is whether the folder takes files."""
    monkeypatch.setattr(historydb, "_writable", lambda folder: False)
    store, notes = open_history(path)
    assert store is not None and not store.writable
    assert notes == [f"history: {path.parent} is read-only: boots are compared, not recorded"]
    return store


def test_the_history_lives_in_the_state_folder_of_the_test_never_the_users(state_dir):
    assert history_path() == state_dir / "history.sqlite3"
    assert not str(history_path()).startswith(str(Path.home() / ".local"))


def test_boots_are_read_back_newest_first_per_configuration(tmp_path):
    path = tmp_path / "state" / "history.sqlite3"
    with opened(path) as store:
        assert store.past(key().key_id) is None
        store.record(key(), boot(22.0, started="2025-01-01T00:00:00+00:00"))
        store.record(key(), boot(25.0, started="2025-01-02T00:00:00+00:00"))
        store.record(key(model="/models/other"), boot(90.0))
        past = store.past(key().key_id)
    assert past is not None
    assert past.boots == 2 and past.key == key()
    assert past.durations == {"weights": (25.0, 22.0), "cuda_graph": (60.0, 60.0)}
    assert (past.first_at, past.last_at) == ("2025-01-01T00:00:00+00:00", "2025-01-02T00:00:00+00:00")
    assert path.stat().st_mode & 0o777 == 0o600  # the owner's only
    with opened(path) as store:
        configs, unreadable = store.all_configs()
    assert unreadable == 0
    assert [c.key_id for c in configs] == [key(model="/models/other").key_id, key().key_id]  # latest first


def test_history_is_bounded_per_configuration_and_in_configurations(tmp_path, monkeypatch):
    monkeypatch.setattr(historydb, "MAX_BOOTS_PER_CONFIG", 3)
    monkeypatch.setattr(historydb, "MAX_CONFIGS", 2)
    path = tmp_path / "history.sqlite3"
    with opened(path) as store:
        for i in range(5):
            store.record(key(), boot(float(i)))
        past = store.past(key().key_id)
        assert past is not None and past.boots == 3
        assert past.durations["weights"] == (4.0, 3.0, 2.0)  # the oldest went
        store.record(key(model="/b"), boot(1.0))
        store.record(key(model="/c"), boot(1.0))
        configs, _ = store.all_configs()
    # The least recently booted configuration went, its boots and phases with it.
    assert {c.key.model for c in configs} == {"/b", "/c"}
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM boots").fetchone()[0] == 2
    assert conn.execute("SELECT COUNT(*) FROM phases").fetchone()[0] == 4
    conn.close()


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from hangwatch.collect.historydb import open_history
    from hangwatch.model.history import BootKey, BootRecord, PhaseDuration
    path, go, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    while not go.exists():
        time.sleep(0.005)
    for i in range(25):
        store, notes = open_history(path)
        assert store is not None and not notes, notes
        with store:
            key = BootKey("vllm", "1", f"/m/{name}", None, None, 1, 1, 1, 1, (), None, 0, "h", False)
            store.record(key, BootRecord("2025-01-01T00:00:00+00:00", "ready", "run",
                                         (PhaseDuration("weights", float(i)),)))
    print("done")
    """
)


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    path = tmp_path / "state" / "history.sqlite3"
    go = tmp_path / "go"
    argv = [sys.executable, "-c", WRITER, str(path), str(go)]
    env = {"PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen([*argv, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for name in ("a", "b")
    ]
    try:
        time.sleep(0.3)  # both started and waiting: go at once, the database not yet created
        go.touch()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.strip() == "done", err
    with opened(path) as store:
        configs, _ = store.all_configs()
    assert sorted((c.key.model, c.boots) for c in configs) == [("/m/a", 25), ("/m/b", 25)]


def test_a_damaged_file_is_set_aside_with_one_note_and_a_new_history_started(tmp_path):
    path = tmp_path / "history.sqlite3"
    path.write_bytes(b"\x00garbage" * 512)
    store, notes = open_history(path)
    assert store is not None
    with store:
        store.record(key(), boot(22.0))  # the new one works
    assert len(notes) == 1 and "not a readable history" in notes[0]
    [aside] = tmp_path.glob("history.sqlite3.bad-*")
    assert notes[0].endswith(f"kept as {aside.name}; a new one is started")
    assert aside.read_bytes() == b"\x00garbage" * 512


def test_a_database_that_is_not_a_history_is_set_aside_too(tmp_path):
    path = tmp_path / "history.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE mine (x)")
    conn.commit()
    conn.close()
    store, notes = open_history(path)
    assert store is not None
    store.close()
    assert len(notes) == 1 and "not a hangwatch history (tables: mine)" in notes[0]
    assert len(list(tmp_path.glob("history.sqlite3.bad-*"))) == 1


def test_a_newer_schema_is_left_as_it_is_and_history_is_off(tmp_path):
    path = tmp_path / "history.sqlite3"
    with opened(path) as store:
        store.record(key(), boot(22.0))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    store, notes = open_history(path)
    assert store is None
    assert notes == [
        f"history: off: {path} was written by a newer hangwatch (schema 99; this one knows "
        f"{historydb.SCHEMA_VERSION}): left as it is"
    ]
    assert path.read_bytes() == before and not list(tmp_path.glob("*.bad-*"))


def test_a_read_only_state_folder_reads_the_history_and_records_nothing(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite3"
    with opened(path) as store:
        store.record(key(), boot(22.0))
    with read_only(path, monkeypatch) as store:
        past = store.past(key().key_id)
        assert past is not None and past.durations["weights"] == (22.0,)
        with pytest.raises(HistoryUnavailable, match="read-only: this boot is not recorded"):
            store.record(key(), boot(23.0))


def test_a_read_only_state_folder_without_a_history_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setattr(historydb, "_writable", lambda folder: False)
    store, notes = open_history(tmp_path / "history.sqlite3")
    assert store is None
    assert notes == [f"history: off: {tmp_path} is read-only: boots are not recorded"]
    assert not (tmp_path / "history.sqlite3").exists()


def test_a_state_folder_that_cannot_be_made_is_one_note(tmp_path):
    (tmp_path / "file").write_text("x")
    store, notes = open_history(tmp_path / "file" / "hangwatch" / "history.sqlite3")
    assert store is None and len(notes) == 1 and notes[0].startswith("history: off: cannot create")


def test_a_database_held_by_another_run_past_the_wait_skips_this_boot(tmp_path, monkeypatch):
    monkeypatch.setattr(historydb, "BUSY_TIMEOUT_S", 0.2)
    path = tmp_path / "history.sqlite3"
    store = opened(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with store, pytest.raises(HistoryUnavailable, match="held by another hangwatch"):
            store.record(key(), boot(22.0))
    finally:
        holder.rollback()
        holder.close()


def test_without_create_a_missing_history_is_none_and_nothing_is_made(tmp_path):
    assert open_history(tmp_path / "state" / "history.sqlite3", create=False) == (None, [])
    assert not (tmp_path / "state").exists()


def test_forget_removes_one_configuration_and_its_boots(tmp_path):
    path = tmp_path / "history.sqlite3"
    with opened(path) as store:
        store.record(key(), boot(22.0))
        store.record(key(), boot(23.0))
        store.record(key(model="/other"), boot(1.0))
        assert store.forget(key().key_id) == 2
        assert store.key_ids() == [key(model="/other").key_id]
        assert store.past(key().key_id) is None


# The version-1 schema as it was released (no quiet spells): a history written by an older hangwatch.
_SCHEMA_1 = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "INSERT INTO schema_version (version) VALUES (1)",
    "CREATE TABLE configs (key_id TEXT PRIMARY KEY, key_json TEXT NOT NULL, first_seen REAL NOT NULL,"
    " last_seen REAL NOT NULL)",
    "CREATE TABLE boots (id INTEGER PRIMARY KEY AUTOINCREMENT, key_id TEXT NOT NULL, started_at TEXT NOT NULL,"
    " recorded_at REAL NOT NULL, verdict TEXT NOT NULL, mode TEXT NOT NULL)",
    "CREATE INDEX boots_by_key ON boots (key_id, id)",
    "CREATE TABLE phases (boot_id INTEGER NOT NULL, ord INTEGER NOT NULL, phase TEXT NOT NULL,"
    " seconds REAL NOT NULL, PRIMARY KEY (boot_id, ord))",
)


def _schema_1(path: Path) -> None:
    conn = sqlite3.connect(path)
    for statement in _SCHEMA_1:
        conn.execute(statement)
    k = key()
    conn.execute("INSERT INTO configs VALUES (?, ?, 0, 0)", (k.key_id, json.dumps(dataclasses.asdict(k))))
    conn.execute(
        "INSERT INTO boots VALUES (1, ?, '2025-01-01T00:00:00+00:00', 0, 'ready', 'run')", (k.key_id,)
    )
    conn.execute("INSERT INTO phases VALUES (1, 0, 'weights', 21.0)")
    conn.commit()
    conn.close()


def test_a_version_1_history_is_brought_up_to_date_and_its_boots_kept(tmp_path):
    path = tmp_path / "history.sqlite3"
    _schema_1(path)
    with opened(path) as store:
        past = store.past(key().key_id)
        assert past is not None and past.durations == {"weights": (21.0,)} and past.quiet == {}
        store.record(
            key(),
            BootRecord("2025-01-02T00:00:00+00:00", "ready", "run", (PhaseDuration("weights", 23.0, 4.5),)),
        )
        past = store.past(key().key_id)
    assert past is not None
    assert past.durations == {"weights": (23.0, 21.0)} and past.quiet == {"weights": (4.5,)}
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT MAX(version), COUNT(*) FROM schema_version").fetchone() == (2, 2)
    conn.close()
    with opened(path) as store:  # opened again: already up to date, nothing added
        assert store.past(key().key_id) is not None
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone() == (2,)
    conn.close()


def test_a_read_only_version_1_history_is_read_without_quiet_spells(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite3"
    _schema_1(path)
    before = path.read_bytes()
    with read_only(path, monkeypatch) as store:
        past = store.past(key().key_id)
    assert past is not None and past.durations == {"weights": (21.0,)} and past.quiet == {}
    assert path.read_bytes() == before  # not upgraded: it could not be written
