"""SqliteStore: real SQLite files in tmp_path, real threads and real processes."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lousho_sync.errors import (
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    ConfigError,
    InvalidSessionIdError,
    StoreClosedError,
    StoreConflictError,
    StoreCorruptError,
    StoreTooNewError,
)
from lousho_sync.messages import Message, ToolCall
from lousho_sync.results import PruneResult
from lousho_sync.sqlite import SCHEMA_VERSION, SqliteStore
from lousho_sync.stores._lease import make_owner
from lousho_sync.stores.base import (
    ApprovalRecord,
    ApprovalStore,
    Checkpoint,
    CheckpointStore,
    SessionStore,
)

TIMEOUT = 60.0


def user(text: str) -> Message:
    return Message("user", text)


def assistant(text: str) -> Message:
    return Message("assistant", text)


def texts(messages: list[Message] | None) -> list[object]:
    assert messages is not None
    return [m.content for m in messages]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def store(db_path: Path):
    with SqliteStore(db_path) as s:
        yield s


def raw(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection to the store's file (to age rows, read counts)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    return conn


def approval(id: str, session_id: str = "s1", **kw: object) -> ApprovalRecord:
    return ApprovalRecord(
        id=id,
        session_id=session_id,
        checkpoint_key=f"{session_id}.turn-0",
        call=ToolCall("call-1", "pay", {"amount": 5}),
        **kw,  # type: ignore[arg-type]
    )


# --- sessions --------------------------------------------------------------------------------


def test_sessions_round_trip_and_replace(store: SqliteStore) -> None:
    sessions = store.sessions
    assert sessions.load("s1") is None
    assert sessions.revision("s1") is None
    sessions.save("s1", [user("hi"), assistant("hello")])
    assert texts(sessions.load("s1")) == ["hi", "hello"]
    sessions.save("s1", [user("only")])
    assert texts(sessions.load("s1")) == ["only"]
    sessions.save("s2", [user("x")])
    assert sessions.ids() == ["s1", "s2"]
    sessions.save("s1", [])
    assert sessions.load("s1") is None
    assert sessions.revision("s1") is None
    assert sessions.ids() == ["s2"]
    sessions.delete("s2")
    sessions.delete("never-there")
    assert sessions.ids() == []
    with raw(Path(store.path)) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_rich_messages_round_trip(store: SqliteStore) -> None:
    call = ToolCall("c1", "search", {"q": "ünïcode", "n": 3})
    messages = [
        user("hi \ud800 there"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "result", tool_call_id="c1", is_error=True),
    ]
    store.sessions.save("s1", messages)
    assert store.sessions.load("s1") == messages


def test_append_adds_rows_and_bumps_revision(store: SqliteStore) -> None:
    sessions = store.sessions
    sessions.append("s1", [user("a"), assistant("b")], expected_length=0)
    r1 = sessions.revision("s1")
    sessions.append("s1", [user("c"), assistant("d")], expected_length=2)
    r2 = sessions.revision("s1")
    sessions.append("s1", [], expected_length=4)  # nothing to add: no write
    assert sessions.revision("s1") == r2
    assert texts(sessions.load("s1")) == ["a", "b", "c", "d"]
    sessions.save("s1", [user("z")])
    r3 = sessions.revision("s1")
    assert len({r1, r2, r3}) == 3
    sessions.delete("s1")
    sessions.save("s1", [user("z")])  # same content again: still a new revision
    assert sessions.revision("s1") not in {r1, r2, r3, None}


def test_append_conflict_names_lengths_and_leaves_store(store: SqliteStore) -> None:
    sessions = store.sessions
    sessions.append("s1", [user("a"), assistant("b")], expected_length=0)
    before = sessions.revision("s1")
    with pytest.raises(StoreConflictError) as info:
        sessions.append("s1", [user("late")], expected_length=1)
    err = info.value
    assert (err.expected_length, err.actual_length, err.session_id) == (1, 2, "s1")
    assert err.path == store.path and store.path in str(err)
    assert err.code == "LOUSHO_STORE_CONFLICT"
    assert texts(sessions.load("s1")) == ["a", "b"]
    assert sessions.revision("s1") == before
    with pytest.raises(StoreConflictError) as info:
        sessions.append("absent", [user("x")], expected_length=3)
    assert info.value.actual_length == 0
    assert sessions.load("absent") is None
    with pytest.raises(StoreConflictError):
        sessions.append("s1", [], expected_length=5)


@pytest.mark.parametrize("bad", ["", "a b", "../etc", "x" * 129, "é"])
def test_invalid_session_id(store: SqliteStore, bad: str) -> None:
    owner = make_owner()
    calls = [
        lambda: store.sessions.load(bad),
        lambda: store.sessions.save(bad, [user("x")]),
        lambda: store.sessions.append(bad, [user("x")], expected_length=0),
        lambda: store.sessions.revision(bad),
        lambda: store.sessions.acquire_lease(bad, owner=owner, ttl_s=1, wait_s=0),
    ]
    for call in calls:
        with pytest.raises(InvalidSessionIdError) as info:
            call()
        assert repr(bad) in str(info.value)
        assert "^[A-Za-z0-9_-]{1,128}$" in str(info.value)
        assert isinstance(info.value, ValueError)


def test_corrupt_message_row_names_path(store: SqliteStore, db_path: Path) -> None:
    store.sessions.save("s1", [user("a"), user("b")])
    with raw(db_path) as conn:
        conn.execute("UPDATE messages SET json = '{not json' WHERE seq = 1")
    with pytest.raises(StoreCorruptError) as info:
        store.sessions.load("s1")
    assert str(db_path) in str(info.value) and "message 1" in str(info.value)
    assert info.value.path == str(db_path) and info.value.session_id == "s1"


def test_usable_as_agent_store(store: SqliteStore) -> None:
    assert isinstance(store.sessions, SessionStore)
    assert isinstance(store.checkpoints, CheckpointStore)
    assert isinstance(store.approvals, ApprovalStore)
    for name in ("append", "revision", "acquire_lease", "renew_lease", "release_lease"):
        assert callable(getattr(store.sessions, name))


# --- checkpoints -----------------------------------------------------------------------------


def checkpoint(key: str, **kw: object) -> Checkpoint:
    return Checkpoint(key=key, session_id=key.split(".")[0], run_id="run-1", **kw)  # type: ignore[arg-type]


def test_checkpoints_round_trip_and_keys(store: SqliteStore) -> None:
    cps = store.checkpoints
    assert cps.load("s1.turn-0") is None
    cp = checkpoint("s1.turn-0", input=(user("q"),), started_call_ids=("c1",), extra={"new": 1})
    cps.save("s1.turn-0", cp)
    assert cps.load("s1.turn-0") == cp
    cps.save("s1.turn-0", checkpoint("s1.turn-0", status="interrupted"))
    loaded = cps.load("s1.turn-0")
    assert loaded is not None and loaded.status == "interrupted"
    for key in ("s1.turn-2", "s10.turn-0", "s2.turn-0", "s1"):
        cps.save(key, checkpoint(key))
    assert cps.keys("s1.") == ["s1.turn-0", "s1.turn-2"]
    assert cps.keys("s1") == ["s1", "s1.turn-0", "s1.turn-2", "s10.turn-0"]
    assert cps.keys("") == ["s1", "s1.turn-0", "s1.turn-2", "s10.turn-0", "s2.turn-0"]
    assert cps.keys("zz") == []
    cps.delete("s1.turn-0")
    cps.delete("not-there")
    assert cps.keys("s1.") == ["s1.turn-2"]


def test_checkpoint_unknown_fields_round_trip(store: SqliteStore, db_path: Path) -> None:
    store.checkpoints.save("s1.turn-0", checkpoint("s1.turn-0"))
    with raw(db_path) as conn:
        (text,) = conn.execute("SELECT json FROM checkpoints").fetchone()
        doc = json.loads(text)
        doc["from_the_future"] = {"a": [1, 2]}
        conn.execute("UPDATE checkpoints SET json = ?", (json.dumps(doc),))
    loaded = store.checkpoints.load("s1.turn-0")
    assert loaded is not None and loaded.extra == {"from_the_future": {"a": [1, 2]}}
    store.checkpoints.save("s1.turn-0", loaded)
    with raw(db_path) as conn:
        (text,) = conn.execute("SELECT json FROM checkpoints").fetchone()
    assert json.loads(text)["from_the_future"] == {"a": [1, 2]}


# --- approvals -------------------------------------------------------------------------------


def test_approvals_create_get_list_resolve(store: SqliteStore) -> None:
    ap = store.approvals
    ap.create(approval("a1", created_at=1.0))
    ap.create(approval("a2", session_id="s2", created_at=2.0))
    ap.create(approval("a0", created_at=0.5))
    assert ap.get("nope") is None
    assert ap.get("a1") == approval("a1", created_at=1.0)
    assert [r.id for r in ap.list_pending()] == ["a0", "a1", "a2"]
    assert [r.id for r in ap.list_pending("s2")] == ["a2"]
    done = ap.resolve("a1", approved=False, reason="too much")
    assert (done.status, done.reason) == ("denied", "too much")
    assert done.resolved_at is not None and done.call.arguments == {"amount": 5}
    assert ap.get("a1") == done
    assert [r.id for r in ap.list_pending()] == ["a0", "a2"]
    with pytest.raises(ApprovalAlreadyResolvedError) as info:
        ap.resolve("a1", approved=True)
    assert info.value.approval_id == "a1" and "denied" in str(info.value)
    with pytest.raises(ApprovalNotFoundError) as nf:
        ap.resolve("ghost", approved=True)
    assert nf.value.approval_id == "ghost" and isinstance(nf.value, KeyError)
    assert ap.get("a1") == done


def test_approval_unknown_fields_round_trip(store: SqliteStore) -> None:
    record = approval("a1", extra={"ticket": "T-9"})
    store.approvals.create(record)
    assert store.approvals.get("a1") == record
    done = store.approvals.resolve("a1", approved=True)
    assert done.extra == {"ticket": "T-9"} and done.status == "approved"
    got = store.approvals.get("a1")
    assert got is not None and got.extra == {"ticket": "T-9"}


def test_resolve_race_between_threads(store: SqliteStore) -> None:
    store.approvals.create(approval("a1"))
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def racer(i: int) -> None:
        barrier.wait(timeout=TIMEOUT)
        try:
            store.approvals.resolve("a1", approved=True, reason=f"t{i}")
            outcomes.append(f"won t{i}")
        except ApprovalAlreadyResolvedError:
            outcomes.append("lost")

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(outcomes) == 8 and len(winners) == 1
    record = store.approvals.get("a1")
    assert record is not None and winners[0] == f"won {record.reason}"


# --- opening, versions, files ----------------------------------------------------------------


def test_new_file_schema_wal_and_parent_dir(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "lousho.db"
    with SqliteStore(path) as s:
        s.sessions.save("s1", [user("kept")])
    conn = raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    with SqliteStore(path, synchronous="normal") as s:
        assert texts(s.sessions.load("s1")) == ["kept"]


def test_not_sqlite_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    content = b"these are my notes, not a database\n" * 50
    path.write_bytes(content)
    with pytest.raises(StoreCorruptError) as info:
        SqliteStore(path)
    assert str(path) in str(info.value) and info.value.path == str(path)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_damaged_sqlite_file_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "damaged.db"
    content = b"SQLite format 3\x00" + bytes(range(256)) * 20
    path.write_bytes(content)
    with pytest.raises(StoreCorruptError) as info:
        SqliteStore(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    conn = raw(path)
    conn.execute("CREATE TABLE t (x)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 41}")
    conn.close()
    with pytest.raises(StoreTooNewError) as info:
        SqliteStore(path)
    message = str(info.value)
    assert str(path) in message and info.value.path == str(path)
    assert f"version {SCHEMA_VERSION + 41}" in message and f"version {SCHEMA_VERSION}" in message
    conn = raw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 41
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL
    conn.close()


def test_memory_store_is_private_and_works() -> None:
    with SqliteStore(":memory:") as a, SqliteStore(":memory:") as b:
        a.sessions.append("s1", [user("a")], expected_length=0)
        assert texts(a.sessions.load("s1")) == ["a"]
        assert b.sessions.load("s1") is None
        assert a.path == ":memory:"


def test_synchronous_setting_is_checked(db_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        SqliteStore(db_path, synchronous="off")  # type: ignore[arg-type]
    assert "'off'" in str(info.value) and "full" in str(info.value)
    assert not db_path.exists()


def test_use_after_close(db_path: Path) -> None:
    s = SqliteStore(db_path)
    s.sessions.save("s1", [user("a")])
    s.close()
    s.close()
    calls = [
        lambda: s.sessions.load("s1"),
        lambda: s.sessions.append("s1", [user("b")], expected_length=1),
        lambda: s.checkpoints.keys(""),
        lambda: s.approvals.list_pending(),
        lambda: s.acquire_lease("s1", owner=make_owner(), ttl_s=1, wait_s=0),
        lambda: s.prune(10),
    ]
    for call in calls:
        with pytest.raises(StoreClosedError) as info:
            call()
        assert str(db_path) in str(info.value)
    with SqliteStore(db_path) as again:
        assert texts(again.sessions.load("s1")) == ["a"]
    with pytest.raises(StoreClosedError):
        again.sessions.ids()


# --- prune -----------------------------------------------------------------------------------


def test_prune_counts_and_keeps_pending(store: SqliteStore, db_path: Path) -> None:
    store.sessions.save("old", [user("a"), user("b")])
    store.sessions.save("new", [user("c")])
    store.checkpoints.save("old.turn-2", checkpoint("old.turn-2"))
    store.checkpoints.save("new.turn-1", checkpoint("new.turn-1"))
    for id in ("resolved-old", "resolved-new", "pending-old"):
        store.approvals.create(approval(id))
    store.approvals.resolve("resolved-old", approved=True)
    store.approvals.resolve("resolved-new", approved=False)
    with raw(db_path) as conn:  # two hours ago, written directly: no waiting
        conn.execute("UPDATE sessions SET updated_at = updated_at - 7200 WHERE id = 'old'")
        conn.execute("UPDATE checkpoints SET updated_at = updated_at - 7200 WHERE key LIKE 'old%'")
        conn.execute(
            "UPDATE approvals SET resolved_at = resolved_at - 7200 WHERE id = 'resolved-old'"
        )
        conn.execute("UPDATE approvals SET created_at = created_at - 7200 WHERE id='pending-old'")
    assert store.prune(3600) == PruneResult(sessions=1, checkpoints=1, approvals=1)
    assert store.sessions.ids() == ["new"]
    assert store.checkpoints.keys("") == ["new.turn-1"]
    assert store.approvals.get("resolved-old") is None
    assert [r.id for r in store.approvals.list_pending()] == ["pending-old"]
    assert store.approvals.get("resolved-new") is not None
    with raw(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    assert store.prune(3600) == PruneResult(0, 0, 0)
    with pytest.raises(ConfigError):
        store.prune(-1)


def test_prune_keeps_a_session_under_a_live_lease(store: SqliteStore, db_path: Path) -> None:
    store.sessions.save("busy", [user("a")])
    assert store.sessions.acquire_lease("busy", owner=make_owner(), ttl_s=600, wait_s=0)
    with raw(db_path) as conn:
        conn.execute("UPDATE sessions SET updated_at = updated_at - 7200")
    assert store.prune(3600).sessions == 0
    assert store.sessions.ids() == ["busy"]


# --- leases ----------------------------------------------------------------------------------


def test_lease_is_exclusive_until_released(store: SqliteStore) -> None:
    a, b = make_owner(), make_owner()
    leases = store.sessions
    assert leases.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    assert leases.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)  # already ours
    assert not leases.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0.05)
    assert leases.renew_lease("s1", owner=a, ttl_s=600)
    assert not leases.renew_lease("s1", owner=b, ttl_s=600)
    leases.release_lease("s1", owner=b)  # not the holder: nothing happens
    assert not leases.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0)
    leases.release_lease("s1", owner=a)
    assert leases.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0)
    assert not store.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)  # on the store too
    with pytest.raises(ConfigError):
        leases.acquire_lease("s1", owner=a, ttl_s=0, wait_s=0)


def test_lease_waiter_gets_it_when_released(store: SqliteStore) -> None:
    a, b = make_owner(), make_owner()
    assert store.sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    got: list[bool] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        got.append(store.sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=TIMEOUT))

    t = threading.Thread(target=waiter)
    t.start()
    assert started.wait(timeout=TIMEOUT)
    store.sessions.release_lease("s1", owner=a)
    t.join(timeout=TIMEOUT)
    assert got == [True]


def test_expired_lease_is_taken_over(store: SqliteStore, db_path: Path) -> None:
    a, b = make_owner(), make_owner()
    assert store.sessions.acquire_lease("s1", owner=a, ttl_s=0.05, wait_s=0)
    with raw(db_path) as conn:  # expire it by writing the past, never by waiting
        conn.execute("UPDATE leases SET expires_at = expires_at - 3600")
    assert store.sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0)
    assert not store.sessions.renew_lease("s1", owner=a, ttl_s=600)
    assert not store.sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)


# --- real processes --------------------------------------------------------------------------

WORKER = r"""
import sys
from lousho_sync.errors import ApprovalAlreadyResolvedError, StoreConflictError
from lousho_sync.messages import Message
from lousho_sync.sqlite import SqliteStore
from lousho_sync.stores._lease import make_owner

path, mode, name = sys.argv[1], sys.argv[2], sys.argv[3]
store = SqliteStore(path)
if mode == "hold":
    ok = store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=3600, wait_s=0)
    print("held" if ok else "refused", flush=True)
    sys.stdin.readline()  # until killed
    sys.exit(0)
print("ready", flush=True)
sys.stdin.readline()
if mode == "append":
    conflicts = 0
    for i in range(50):
        sid = "shared" if i % 2 == 0 else "own-" + name
        for _ in range(10000):
            length = len(store.sessions.load(sid) or [])
            try:
                store.sessions.append(
                    sid, [Message("user", f"{name}-{i}"), Message("assistant", "ok")],
                    expected_length=length,
                )
                break
            except StoreConflictError:
                conflicts += 1
        else:
            raise SystemExit("gave up")
    print("done", conflicts, flush=True)
elif mode == "resolve":
    try:
        store.approvals.resolve("a1", approved=True, reason=name)
        print("won", flush=True)
    except ApprovalAlreadyResolvedError:
        print("lost", flush=True)
store.close()
"""


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_line(proc: subprocess.Popen[str], timeout: float = TIMEOUT) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the child process said nothing in time"
    return proc.stdout.readline().strip()


def _run_together(procs: list[subprocess.Popen[str]]) -> list[tuple[str, str]]:
    """Wait until every child is ready, release them at once, collect (stdout, stderr)."""
    try:
        for p in procs:
            assert _read_line(p) == "ready", p.stderr.read() if p.stderr else ""
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, stderr
            out.append((stdout, stderr))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=TIMEOUT)


def test_four_processes_append_without_losing_turns(db_path: Path) -> None:
    SqliteStore(db_path).close()  # created and migrated once, like a deployment would
    names = ["p0", "p1", "p2", "p3"]
    results = _run_together([_spawn(str(db_path), "append", n) for n in names])
    for stdout, stderr in results:
        assert stdout.startswith("done")
        assert "locked" not in stderr and "locked" not in stdout
    with SqliteStore(db_path) as s:
        shared = s.sessions.load("shared")
        assert shared is not None and len(shared) == 4 * 25 * 2
        users = [m.content for m in shared[0::2]]
        assert all(m.content == "ok" for m in shared[1::2])  # turns never interleave
        assert sorted(users) == sorted(f"{n}-{i}" for n in names for i in range(0, 50, 2))
        for n in names:
            own = s.sessions.load(f"own-{n}")
            assert texts(own)[0::2] == [f"{n}-{i}" for i in range(1, 50, 2)]


def test_eight_processes_resolve_one_approval_once(db_path: Path) -> None:
    with SqliteStore(db_path) as s:
        s.approvals.create(approval("a1"))
    results = _run_together([_spawn(str(db_path), "resolve", f"w{i}") for i in range(8)])
    said = [stdout.strip() for stdout, _ in results]
    assert sorted(said) == ["lost"] * 7 + ["won"]
    with SqliteStore(db_path) as s:
        record = s.approvals.get("a1")
    assert record is not None and record.status == "approved"
    assert record.reason == f"w{said.index('won')}"


def test_lease_of_killed_process_is_taken_over_at_once(store: SqliteStore, db_path: Path) -> None:
    child = _spawn(str(db_path), "hold", "holder")
    try:
        assert _read_line(child) == "held"
        me = make_owner()
        assert not store.sessions.acquire_lease("s1", owner=me, ttl_s=600, wait_s=0)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=TIMEOUT)
        assert store.sessions.acquire_lease("s1", owner=me, ttl_s=600, wait_s=0)
        assert not store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=TIMEOUT)


CRASH_WORKER = r"""
import os, sys
from lousho_sync import ScriptedProvider, create_agent, tool
from lousho_sync.providers.scripted import Step
from lousho_sync.sqlite import SqliteStore

path, mode = sys.argv[1], sys.argv[2]

@tool
def charge(amount: int) -> str:
    "Charge the card."
    if mode == "crash":
        os._exit(17)  # the process dies while the tool runs
    return f"charged {amount}"

store = SqliteStore(path)
if mode == "crash":
    provider = ScriptedProvider([Step(tool_calls=[("charge", {"amount": 5})]), "unused"])
else:
    provider = ScriptedProvider(["done"])
session = create_agent(provider=provider, tools=[charge], store=store).session(id="buyer")
if mode == "crash":
    session.send("buy it")
else:
    print(session.pending().status, flush=True)
    result = session.resume()
    print(result.text, flush=True)
"""


def test_turn_crashed_in_one_process_resumes_in_another(db_path: Path) -> None:
    def run(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", CRASH_WORKER, str(db_path), mode],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )

    crashed = run("crash")
    assert crashed.returncode == 17, crashed.stderr
    resumed = run("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split("\n")[:2] == ["interrupted", "done"]
    with SqliteStore(db_path) as s:
        messages = s.sessions.load("buyer")
        assert messages is not None
        assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[2].content == "charged 5"
        assert s.checkpoints.keys("") == []


# --- threads ---------------------------------------------------------------------------------


def test_sixteen_threads_write_different_sessions(store: SqliteStore) -> None:
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            barrier.wait(timeout=TIMEOUT)
            sid = f"t{n}"
            for i in range(20):
                store.sessions.append(
                    sid, [user(f"{n}-{i}"), assistant("ok")], expected_length=2 * i
                )
                store.checkpoints.save(f"{sid}.turn-{2 * i}", checkpoint(f"{sid}.turn-{2 * i}"))
                assert len(store.sessions.load(sid) or []) == 2 * i + 2
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
    assert errors == []
    assert store.sessions.ids() == sorted(f"t{n}" for n in range(16))
    for n in range(16):
        assert texts(store.sessions.load(f"t{n}"))[0::2] == [f"{n}-{i}" for i in range(20)]
    assert len(store.checkpoints.keys("")) == 16 * 20


def test_package_root_does_not_import_sqlite3() -> None:
    code = "import sys, lousho_sync; print('sqlite3' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_open_from_forked_child_uses_its_own_connection(store: SqliteStore) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    store.sessions.save("s1", [user("parent")])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: use the inherited store, report, exit without cleanup
        code = 1
        try:
            store.sessions.append("s1", [user("child")], expected_length=1)
            code = 0
        finally:
            os.write(write, b"x")
            os._exit(code)
    os.close(write)
    ready, _, _ = select.select([read], [], [], TIMEOUT)
    os.close(read)
    assert ready
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert texts(store.sessions.load("s1")) == ["parent", "child"]
