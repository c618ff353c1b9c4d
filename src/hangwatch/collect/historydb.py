"""The phase-history database: SQLite (the standard library's, no server) at
``$XDG_STATE_HOME/hangwatch/history.sqlite3`` (default ``~/.local/state/hangwatch/``).

The one module that touches the file. Safe under concurrent runs: every write is one ``BEGIN IMMEDIATE``
transaction, and a run waits up to ``BUSY_TIMEOUT_S`` for another's. The rollback journal, not WAL: WAL
needs shared memory beside the file, which a network home folder (a cluster's NFS) does not give, and a
few writes per boot need no more. Bounded: ``MAX_BOOTS_PER_CONFIG`` boots per configuration (the oldest
go), ``MAX_CONFIGS`` configurations (the least recently booted go), ``MAX_PHASES_PER_BOOT`` phases a boot.

Nothing here raises past the boundary but ``HistoryUnavailable``, whose text is the one line to say:

- a file that is not a readable database (or not ours) is renamed ``history.sqlite3.bad-<stamp>``, kept
  for the user, and a new one is started;
- a file of a newer schema (a newer hangwatch's) is left exactly as it is and history is off for the run:
  setting it aside would take its history from the newer hangwatch, at every boot of the older one;
- a state folder that cannot be written turns recording off; an existing database is still read.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from urllib.parse import quote

from hangwatch.model.history import BootKey
from hangwatch.model.history import BootRecord
from hangwatch.model.history import PastBoots

# 2: each phase's longest quiet spell (``phases.quiet_s``, for --stall-after auto); a version-1 file is
# brought up to 2 when it can be written, else read without them.
SCHEMA_VERSION = 2
FILE_NAME = "history.sqlite3"
BUSY_TIMEOUT_S = 5.0
MAX_BOOTS_PER_CONFIG = 50
MAX_CONFIGS = 200
MAX_PHASES_PER_BOOT = 64
_CORRUPT_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB (primary codes)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS configs ("
    " key_id TEXT PRIMARY KEY, key_json TEXT NOT NULL, first_seen REAL NOT NULL, last_seen REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS boots ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, key_id TEXT NOT NULL, started_at TEXT NOT NULL,"
    " recorded_at REAL NOT NULL, verdict TEXT NOT NULL, mode TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS boots_by_key ON boots (key_id, id)",
    "CREATE TABLE IF NOT EXISTS phases ("
    " boot_id INTEGER NOT NULL, ord INTEGER NOT NULL, phase TEXT NOT NULL, seconds REAL NOT NULL,"
    " quiet_s REAL, PRIMARY KEY (boot_id, ord))",
)
_TABLES = frozenset({"schema_version", "configs", "boots", "phases", "sqlite_sequence"})


class HistoryUnavailable(Exception):
    """History cannot be used for this run; the message is the one line to say (``history: ...``)."""


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """hangwatch's state folder, where run folders go too (``supervise.session.default_run_dir``)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "hangwatch"


def history_path(env: Mapping[str, str] | None = None) -> Path:
    return state_dir(env) / FILE_NAME


def _is_corrupt(exc: sqlite3.Error) -> bool:
    """Damaged, not a database, or not ours: what is set aside (a lock, a full disk, a read-only file are
    this run's trouble, not the file's)."""
    if isinstance(exc, _NotOurs):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _CORRUPT_CODES
    return type(exc) is sqlite3.DatabaseError


def _writable(folder: Path) -> bool:
    """The folder takes new files (the journal beside the database); a read-only mount says no to root too."""
    return os.access(folder, os.W_OK | os.X_OK)


class HistoryStore:
    """An open history database. Use ``open_history``; close it (or use it as a context manager)."""

    def __init__(self, path: Path, conn: sqlite3.Connection, writable: bool) -> None:
        self.path = path
        self.writable = writable
        self._conn = conn

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.rollback()
                raise
            self._conn.commit()
        except sqlite3.Error as exc:
            raise self._failure(what, exc) from None

    def _failure(self, what: str, exc: sqlite3.Error) -> HistoryUnavailable:
        if _is_corrupt(exc):
            return HistoryUnavailable(_set_aside(self.path, str(exc), self.writable, self._conn))
        if "locked" in str(exc) or "busy" in str(exc):
            return HistoryUnavailable(
                f"history: {what}: {self.path} was held by another hangwatch for over {BUSY_TIMEOUT_S:g} s: "
                "skipped this time"
            )
        return HistoryUnavailable(f"history: {what}: {self.path}: {exc}")

    def past(self, key_id: str) -> PastBoots | None:
        """What the history holds for one configuration; None when it holds no boot of it."""
        found, _ = self._read(key_id)
        return found[0] if found else None

    def all_configs(self) -> tuple[list[PastBoots], int]:
        """Every configuration, the most recently booted first; and how many could not be read (a key
        another version wrote)."""
        return self._read(None)

    def _read(self, key_id: str | None) -> tuple[list[PastBoots], int]:
        # One configuration, or all (``?1 IS NULL``): fixed statements, the id bound.
        try:
            configs = self._conn.execute(
                "SELECT c.key_id, c.key_json, COUNT(b.id), MIN(b.started_at), MAX(b.started_at)"
                " FROM configs c JOIN boots b ON b.key_id = c.key_id WHERE ?1 IS NULL OR c.key_id = ?1"
                " GROUP BY c.key_id ORDER BY c.last_seen DESC",
                (key_id,),
            ).fetchall()
            quiet = "p.quiet_s" if _has_quiet(self._conn) else "NULL"
            rows = self._conn.execute(
                f"SELECT b.key_id, p.phase, p.seconds, {quiet} FROM phases p JOIN boots b ON b.id = p.boot_id"  # noqa: S608 - one of two fixed words
                " WHERE ?1 IS NULL OR b.key_id = ?1 ORDER BY b.id DESC, p.ord",
                (key_id,),
            ).fetchall()
        except sqlite3.Error as exc:
            raise self._failure("reading", exc) from None
        durations: dict[str, dict[str, list[float]]] = {}
        spells: dict[str, dict[str, list[float]]] = {}
        for kid, phase, seconds, quiet_s in rows:
            durations.setdefault(kid, {}).setdefault(phase, []).append(float(seconds))
            if quiet_s is not None:
                spells.setdefault(kid, {}).setdefault(phase, []).append(float(quiet_s))
        out = []
        unreadable = 0
        for kid, key_json, boots, first_at, last_at in configs:
            key = _decode_key(key_json)
            if key is None:
                unreadable += 1
                continue
            phases = {name: tuple(values) for name, values in durations.get(kid, {}).items()}
            quiet_of = {name: tuple(values) for name, values in spells.get(kid, {}).items()}
            out.append(PastBoots(kid, key, int(boots), first_at or "", last_at or "", phases, quiet_of))
        return out, unreadable

    def record(self, key: BootKey, boot: BootRecord) -> None:
        """Add one boot, then drop what is over the bounds (oldest boots, least recently booted configs)."""
        if not self.writable:
            raise HistoryUnavailable(f"history: {self.path.parent} is read-only: this boot is not recorded")
        now = time.time()
        key_id = key.key_id
        with self._transaction("recording") as conn:
            conn.execute(
                "INSERT INTO configs (key_id, key_json, first_seen, last_seen) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (key_id) DO UPDATE SET last_seen = excluded.last_seen",
                (key_id, json.dumps(asdict(key), sort_keys=True), now, now),
            )
            cur = conn.execute(
                "INSERT INTO boots (key_id, started_at, recorded_at, verdict, mode) VALUES (?, ?, ?, ?, ?)",
                (key_id, boot.started_at, now, boot.verdict, boot.mode),
            )
            boot_id = cur.lastrowid
            conn.executemany(
                "INSERT INTO phases (boot_id, ord, phase, seconds, quiet_s) VALUES (?, ?, ?, ?, ?)",
                [
                    (boot_id, i, p.phase, p.seconds, p.quiet_s)
                    for i, p in enumerate(boot.phases[:MAX_PHASES_PER_BOOT])
                ],
            )
            old = conn.execute(
                "SELECT id FROM boots WHERE key_id = ? ORDER BY id DESC LIMIT -1 OFFSET ?",
                (key_id, MAX_BOOTS_PER_CONFIG),
            ).fetchall()
            _delete_boots(conn, [row[0] for row in old])
            stale = conn.execute(
                "SELECT key_id FROM configs ORDER BY last_seen DESC LIMIT -1 OFFSET ?", (MAX_CONFIGS,)
            ).fetchall()
            for (kid,) in stale:
                _delete_config(conn, kid)

    def key_ids(self) -> list[str]:
        try:
            return [row[0] for row in self._conn.execute("SELECT key_id FROM configs ORDER BY key_id")]
        except sqlite3.Error as exc:
            raise self._failure("reading", exc) from None

    def forget(self, key_id: str) -> int:
        """Remove one configuration and its boots; how many boots went."""
        if not self.writable:
            raise HistoryUnavailable(f"history: {self.path.parent} is read-only: nothing can be forgotten")
        with self._transaction("forgetting") as conn:
            (boots,) = conn.execute("SELECT COUNT(*) FROM boots WHERE key_id = ?", (key_id,)).fetchone()
            _delete_config(conn, key_id)
        return int(boots)


def _delete_boots(conn: sqlite3.Connection, ids: list[int]) -> None:
    for boot_id in ids:
        conn.execute("DELETE FROM phases WHERE boot_id = ?", (boot_id,))
        conn.execute("DELETE FROM boots WHERE id = ?", (boot_id,))


def _delete_config(conn: sqlite3.Connection, key_id: str) -> None:
    conn.execute("DELETE FROM phases WHERE boot_id IN (SELECT id FROM boots WHERE key_id = ?)", (key_id,))
    conn.execute("DELETE FROM boots WHERE key_id = ?", (key_id,))
    conn.execute("DELETE FROM configs WHERE key_id = ?", (key_id,))


def _decode_key(text: str) -> BootKey | None:
    try:
        data = json.loads(text)
        data["switches"] = tuple(data.get("switches", ()))
        return BootKey(**data)
    except (ValueError, TypeError, AttributeError):
        return None


def open_history(path: Path, *, create: bool = True) -> tuple[HistoryStore | None, list[str]]:
    """The database at ``path`` (created with its folder when ``create``), and the lines to say about it.

    None where there is no history to use: none yet and ``create`` False, a newer schema, a folder that
    cannot be written and no database in it. A damaged file is set aside and a new one started."""
    notes: list[str] = []
    for _ in range(2):  # a second time after a damaged file was set aside
        try:
            store = _open(path, create)
        except _Damaged as exc:
            notes.append(str(exc))
            if exc.set_aside:
                continue
            return None, notes
        except HistoryUnavailable as exc:
            notes.append(str(exc))
            return None, notes
        if store is not None and not store.writable:
            # Said once, at open: the comparison is still read, nothing is added.
            notes.append(f"history: {path.parent} is read-only: boots are compared, not recorded")
        return store, notes
    return None, notes


class _Damaged(HistoryUnavailable):
    def __init__(self, note: str, set_aside: bool) -> None:
        super().__init__(note)
        self.set_aside = set_aside


def _open(path: Path, create: bool) -> HistoryStore | None:
    folder = path.parent
    if not path.exists():
        if not create:
            return None
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise HistoryUnavailable(f"history: off: cannot create {folder}: {exc.strerror}") from None
        if not _writable(folder):
            raise HistoryUnavailable(f"history: off: {folder} is read-only: boots are not recorded")
        try:  # the owner's only: it names the models and hosts this user boots
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            raise HistoryUnavailable(f"history: off: cannot create {path}: {exc.strerror}") from None
    writable = _writable(folder) and os.access(path, os.W_OK)
    try:
        identity = path.stat()
        conn = sqlite3.connect(
            f"file:{quote(str(path))}?mode={'rw' if writable else 'ro'}",
            uri=True,
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,  # transactions are ours: BEGIN IMMEDIATE for every write
        )
    except (OSError, sqlite3.Error) as exc:
        raise HistoryUnavailable(f"history: off: cannot open {path}: {exc}") from None
    try:
        usable = _prepare(conn, path, writable)
    except sqlite3.Error as exc:
        if _is_corrupt(exc):
            raise _Damaged(_set_aside(path, str(exc), writable, conn, identity), writable) from None
        conn.close()
        raise HistoryUnavailable(f"history: off: {path}: {exc}") from None
    except BaseException:
        conn.close()
        raise
    if not usable:
        conn.close()
        return None
    return HistoryStore(path, conn, writable)


class _NotOurs(sqlite3.DatabaseError):
    """A database, but not a history: its tables are someone else's."""


def _prepare(conn: sqlite3.Connection, path: Path, writable: bool) -> bool:
    """Check the schema version; create the tables in a new (empty) database. False: an empty database
    that cannot be written (nothing to read, nothing to add)."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        if not writable:
            return False
        conn.execute("BEGIN IMMEDIATE")  # two runs creating it at once: one creates, the other finds it
        try:
            for statement in _SCHEMA:
                conn.execute(statement)
            if conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 0:
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        return True
    if "schema_version" not in tables or not tables <= _TABLES:
        raise _NotOurs(f"not a hangwatch history (tables: {', '.join(sorted(tables))})")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    version = row[0] if row else None
    if not isinstance(version, int) or version < 1:
        raise _NotOurs(f"schema version {version!r}")
    if version > SCHEMA_VERSION:
        conn.close()
        raise HistoryUnavailable(
            f"history: off: {path} was written by a newer hangwatch (schema {version}; this one knows "
            f"{SCHEMA_VERSION}): left as it is"
        )
    if version < SCHEMA_VERSION and writable:
        _upgrade(conn)
    return True


def _has_quiet(conn: sqlite3.Connection) -> bool:
    return any(row[1] == "quiet_s" for row in conn.execute("PRAGMA table_info(phases)"))


def _upgrade(conn: sqlite3.Connection) -> None:
    """Schema 1 -> 2: the quiet spells' column (empty for the boots before). Two runs upgrading at once:
    one does, the other finds it done."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not _has_quiet(conn):
            conn.execute("ALTER TABLE phases ADD COLUMN quiet_s REAL")
        if conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] < SCHEMA_VERSION:
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def _set_aside(
    path: Path,
    why: str,
    writable: bool,
    conn: sqlite3.Connection,
    identity: os.stat_result | None = None,
) -> str:
    """Rename a damaged database ``history.sqlite3.bad-<stamp>`` (kept, never deleted); the line to say."""
    conn.close()
    if not writable:
        return f"history: off: {path} is damaged ({why}) and its folder is read-only: left as it is"
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.bad-{stamp}")
    if aside.exists():
        aside = path.with_name(f"{aside.name}-{os.getpid()}")
    try:
        now = path.stat()
        # Another run may have set it aside already and started a new one: never move that one.
        if identity is not None and (now.st_ino, now.st_dev) != (identity.st_ino, identity.st_dev):
            return f"history: {path} was damaged ({why}); another hangwatch has already set it aside"
        path.rename(aside)
        journal = path.with_name(path.name + "-journal")
        if journal.exists():
            journal.rename(aside.with_name(aside.name + "-journal"))
    except FileNotFoundError:
        return f"history: {path} was damaged ({why}); another hangwatch has already set it aside"
    except OSError as exc:
        return f"history: off: {path} is damaged ({why}) and could not be set aside: {exc.strerror}"
    return f"history: {path} is not a readable history ({why}): kept as {aside.name}; a new one is started"
