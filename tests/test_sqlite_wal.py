"""The WAL-reset bug guard of SqliteStore: which SQLite is used, the warning, and the
checkpoint discipline under several writing processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import types
import warnings
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
        ("auto", OLD, NEW, NEW),  # the fixed library wins
        ("auto", OLD, None, OLD),  # nothing better installed
        ("auto", OLD, OLD, OLD),  # the alternative is no better
        ("auto", NEW, NEW, NEW),  # the standard module is fine: keep it
        ("sqlite3", OLD, NEW, OLD),
        ("pysqlite3", NEW, OLD, OLD),
        ("", OLD, NEW, NEW),
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


def test_the_sqlite_extra_is_used_automatically_when_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed = pytest.importorskip(
        "pysqlite3.dbapi2", reason="pysqlite3 is not installed: pip install 'lousho[sqlite]'"
    )
    assert not driver.wal_reset_affected(fixed.sqlite_version_info)
    monkeypatch.setenv(driver.DRIVER_ENV, "auto")
    driver.reset_warning_for_tests()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreDurabilityWarning)
        store = SqliteStore(tmp_path / "a.db")
    with store:
        uses = store._db.conn.execute("SELECT sqlite_version()").fetchone()[0]
        assert uses == fixed.sqlite_version
        if driver.wal_reset_affected(sqlite3.sqlite_version_info):
            assert store._db.driver is fixed
        # no guard: SQLite's own automatic checkpoints stay on
        assert store._db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000


@pytest.mark.skipif(
    not driver.wal_reset_affected(sqlite3.sqlite_version_info),
    reason=f"the linked SQLite {sqlite3.sqlite_version} does not have the WAL-reset bug",
)
def test_an_affected_sqlite_warns_once_and_turns_automatic_checkpoints_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(driver.DRIVER_ENV, "sqlite3")
    driver.reset_warning_for_tests()
    with pytest.warns(StoreDurabilityWarning, match="WAL-reset bug") as caught:
        first = SqliteStore(tmp_path / "a.db")
        second = SqliteStore(tmp_path / "b.db")
    assert len([w for w in caught if w.category is StoreDurabilityWarning]) == 1
    assert sqlite3.sqlite_version in str(caught[0].message)
    assert "lousho[sqlite]" in str(caught[0].message)
    for store in (first, second):
        with store:
            assert store._db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0


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
