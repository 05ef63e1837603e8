"""The WAL-reset bug guard of SqliteStore: which SQLite is used, the warning, and the
checkpoint discipline under several writing processes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from conftest import run_together

from lousho_sync.errors import ConfigError, StoreDurabilityWarning
from lousho_sync.sqlite import SqliteStore
from lousho_sync.stores import _sqlite_driver as driver


@pytest.mark.parametrize(
    ("version", "affected"),
    [
        ((3, 6, 23), False),
        ((3, 7, 0), True),
        ((3, 40, 1), True),
        ((3, 44, 5), True),
        ((3, 44, 6), False),
        ((3, 45, 0), True),
        ((3, 50, 6), True),
        ((3, 50, 7), False),
        ((3, 51, 2), True),
        ((3, 51, 3), False),
        ((3, 52, 0), False),
        ((3, 53, 4), False),
        ((4, 0, 0), False),
    ],
)
def test_which_sqlite_versions_have_the_wal_reset_bug(
    version: tuple[int, int, int], affected: bool
) -> None:
    assert driver.wal_reset_affected(version) is affected


def _module(name: str, version: tuple[int, int, int]) -> types.ModuleType:
    m = types.ModuleType(name)
    m.sqlite_version_info = version  # type: ignore[attr-defined]
    return m


OLD = _module("old", (3, 40, 1))
NEW = _module("new", (3, 53, 4))


@pytest.mark.parametrize(
    ("setting", "stdlib", "alternative", "chosen"),
    [
        ("auto", OLD, NEW, OLD),  # the standard module unless asked (one library per process)
        ("auto", OLD, None, OLD),
        ("auto", NEW, NEW, NEW),
        ("sqlite3", OLD, NEW, OLD),
        ("pysqlite3", NEW, OLD, OLD),
        ("pysqlite3", OLD, NEW, NEW),
        ("", OLD, NEW, OLD),
    ],
)
def test_the_driver_choice(
    setting: str,
    stdlib: types.ModuleType,
    alternative: types.ModuleType | None,
    chosen: types.ModuleType,
) -> None:
    got = driver.choose_driver(setting, stdlib=stdlib, load_alternative=lambda: alternative)
    assert got is chosen


def test_a_bad_driver_setting_or_a_missing_pysqlite3_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="LOUSHO_SQLITE_DRIVER"):
        driver.choose_driver("postgres")
    with pytest.raises(ConfigError, match="lousho\\[sqlite\\]"):
        driver.choose_driver("pysqlite3", load_alternative=lambda: None)


def _child(code: str, *args: str, driver_setting: str | None) -> str:
    """Run ``code`` in a new Python process (its own SQLite library choice)."""
    env = dict(os.environ)
    env.pop(driver.DRIVER_ENV, None)
    if driver_setting is not None:
        env[driver.DRIVER_ENV] = driver_setting
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


_NEEDS_PYSQLITE3 = pytest.mark.skipif(
    driver._load_pysqlite3() is None,
    reason="pysqlite3 is not installed: pip install 'lousho[sqlite]'",
)

_COUNT = """
    import sys, warnings
    warnings.simplefilter("ignore")
    from lousho_sync.sqlite import SqliteStore
    print(len(SqliteStore(sys.argv[1]).sessions.load("s") or []))
"""


def test_a_plain_sqlite3_read_in_the_same_process_loses_no_acknowledged_turn(
    tmp_path: Path,
) -> None:
    # With no setting (pysqlite3 installed or not), a process whose code also reads the
    # file through the standard sqlite3 module keeps every acknowledged turn.
    db = str(tmp_path / "chat.db")
    out = _child(
        """
        import sqlite3, sys, warnings
        warnings.simplefilter("ignore")
        from lousho_sync import create_agent, ScriptedProvider
        from lousho_sync.sqlite import SqliteStore
        db = sys.argv[1]
        store = SqliteStore(db)
        agent = create_agent(provider=ScriptedProvider(default="ok"), store=store)
        agent.session(id="s").send("turn A")
        c = sqlite3.connect(db); c.execute("select count(*) from messages").fetchone(); c.close()
        for text in ("turn B", "turn C"):
            agent.session(id="s").send(text)
        print(len(SqliteStore(db).sessions.load("s") or []))
        store.close()
        """,
        db,
        driver_setting=None,
    )
    assert out == "6"
    assert _child(_COUNT, db, driver_setting=None) == "6"


@_NEEDS_PYSQLITE3
def test_pysqlite3_when_asked_and_it_refuses_a_file_the_standard_module_holds_open(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "chat.db")
    out = _child(
        """
        import sqlite3, sys, warnings
        warnings.simplefilter("error")
        from lousho_sync.errors import ConfigError
        from lousho_sync.sqlite import SqliteStore
        db = sys.argv[1]
        store = SqliteStore(db)  # no WAL-reset warning: the fixed library
        auto = store._db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        print(store._db.driver.__name__, auto)
        second = SqliteStore(db)  # a second store of the same library is fine
        second.close(); store.close()
        other = sqlite3.connect(db); other.execute("select 1 from messages").fetchall()
        try:
            SqliteStore(db)
        except ConfigError as exc:
            print(exc.code, "|", exc)
        """,
        db,
        driver_setting="pysqlite3",
    )
    first, refusal = out.splitlines()
    assert first == "pysqlite3.dbapi2 1000"  # SQLite's automatic checkpoints stay on
    assert refusal.startswith("LOUSHO_CONFIG |")
    assert "already open in this process through another SQLite library" in refusal
    assert "LOUSHO_SQLITE_DRIVER=sqlite3" in refusal


@_NEEDS_PYSQLITE3
def test_one_sqlite_library_per_process(tmp_path: Path) -> None:
    out = _child(
        """
        import os, sys, warnings
        warnings.simplefilter("ignore")
        from lousho_sync.errors import ConfigError
        from lousho_sync.sqlite import SqliteStore
        SqliteStore(os.path.join(sys.argv[1], "a.db")).close()
        os.environ["LOUSHO_SQLITE_DRIVER"] = "pysqlite3"
        try:
            SqliteStore(os.path.join(sys.argv[1], "b.db"))
        except ConfigError as exc:
            print(exc)
        """,
        str(tmp_path),
        driver_setting="sqlite3",
    )
    assert "this process already uses sqlite3 for SQLite stores" in out
    assert "set LOUSHO_SQLITE_DRIVER once" in out


@pytest.mark.skipif(
    not driver.wal_reset_affected(sqlite3.sqlite_version_info),
    reason=f"the linked SQLite {sqlite3.sqlite_version} does not have the WAL-reset bug",
)
def test_an_affected_sqlite_is_guarded_quietly_an_info_log_and_no_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The checkpoint discipline covers the store's own connections, so nothing user-visible
    is said: one INFO record per process, no warning; automatic checkpoints are off."""
    import warnings

    monkeypatch.setenv(driver.DRIVER_ENV, "sqlite3")
    driver.reset_warning_for_tests()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level("INFO", "lousho_sync"):
        warnings.simplefilter("always")
        first = SqliteStore(tmp_path / "a.db")
        second = SqliteStore(tmp_path / "b.db")
    assert [w for w in caught if issubclass(w.category, StoreDurabilityWarning)] == []
    said = [r for r in caplog.records if "WAL-reset bug" in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO"]
    assert sqlite3.sqlite_version in said[0].getMessage()
    assert "lousho[sqlite]" in said[0].getMessage()
    for store in (first, second):
        with store:
            assert store._db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0


@pytest.mark.skipif(
    not driver.wal_reset_affected(sqlite3.sqlite_version_info),
    reason=f"the linked SQLite {sqlite3.sqlite_version} does not have the WAL-reset bug",
)
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc")
def test_a_connection_lousho_did_not_make_on_the_file_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where lousho cannot guard: the process already writes the file through a plain
    sqlite3 connection, whose automatic checkpoints can race the store's commits."""
    monkeypatch.setenv(driver.DRIVER_ENV, "sqlite3")
    db = tmp_path / "shared.db"
    plain = sqlite3.connect(db)
    plain.execute("PRAGMA journal_mode=WAL")
    plain.execute("CREATE TABLE app (x)")
    plain.commit()
    try:
        with pytest.warns(StoreDurabilityWarning, match="connection lousho did not make") as w:
            store = SqliteStore(db)
        assert str(db) in str(w[0].message)
        assert "wal_autocheckpoint=0" in str(w[0].message)
        store.close()
    finally:
        plain.close()
    # alone on the file (and a second store beside the first): nothing to warn about
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreDurabilityWarning)
        with SqliteStore(db), SqliteStore(db):
            pass


WRITER = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("ignore")
    from lousho_sync.messages import Message
    from lousho_sync.sqlite import SqliteStore
    path, sid, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = SqliteStore(path)
    big = "x" * 12000
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(turns):
        store.sessions.append(
            sid, [Message("user", f"{sid} q{i} {big}"), Message("assistant", f"{sid} a{i}")],
            expected_length=2 * i,
        )
    print(store._db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0], flush=True)
    store.close()
    """
)


def test_several_processes_writing_keep_the_wal_bounded_and_the_file_sound(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.db"
    SqliteStore(path).close()
    turns = 150  # 4 writers x 150 turns x ~12 KB: about 7 MB through the WAL
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"w{n}", str(turns)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for n in range(4)
    ]
    keeper = sqlite3.connect(path)  # keeps the WAL when the writers close
    keeper.execute("SELECT count(*) FROM sessions").fetchall()
    outputs = run_together(procs)
    if driver.wal_reset_affected(sqlite3.sqlite_version_info):  # the guard's checkpoints
        assert [out.split() for out, _ in outputs] == [["0"]] * 4
    wal = Path(f"{path}-wal")
    # checkpoints ran while they wrote: the WAL stayed near the threshold, not ~7 MB
    assert 0 < wal.stat().st_size < 2 * driver.CHECKPOINT_WAL_BYTES
    keeper.close()
    with SqliteStore(path) as store:
        for n in range(4):
            messages = store.sessions.load(f"w{n}")
            assert messages is not None and len(messages) == 2 * turns
            assert [m.text.split(" ")[1] for m in messages[::2]] == [
                f"q{i}" for i in range(turns)
            ]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()
