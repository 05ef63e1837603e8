"""RedisStore on a real redis-server; the store contract also runs on SqliteStore.

The server: ``LOUSHO_TEST_REDIS_URL`` when set (``.ci/run`` starts one), otherwise a
``redis-server`` started here on a free loopback port for the session. Without a
``redis-server`` binary the Redis tests are skipped, unless ``CI`` is set: then they fail.

The contract tests take a ``kit`` (the store plus the few raw operations a test needs:
ageing entries, damaging data, reading stored JSON), so they can move into a shared
contract suite parametrized over every store.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    StoreUnavailableError,
)
from lousho_sync.messages import Message, ToolCall
from lousho_sync.results import PruneResult
from lousho_sync.stores._lease import make_owner, poll_until
from lousho_sync.stores.base import (
    ApprovalRecord,
    ApprovalStore,
    Checkpoint,
    CheckpointStore,
    SessionStore,
)

TIMEOUT = 60.0
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")

try:
    import redis

    from lousho_sync.redis import LAYOUT_VERSION, RedisStore
except ImportError as exc:  # pragma: no cover - depends on the environment
    if IN_CI:
        raise
    pytest.skip(f"redis-py is not installed ({exc}): pip install 'lousho[redis]'",
                allow_module_level=True)


# --- the server ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL: LOUSHO_TEST_REDIS_URL, or a redis-server started for this session."""
    url = os.environ.get("LOUSHO_TEST_REDIS_URL")
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        if IN_CI:
            pytest.fail("CI is set but there is no redis-server binary and no "
                        "LOUSHO_TEST_REDIS_URL: install redis-server")
        pytest.skip("no redis-server binary on PATH and LOUSHO_TEST_REDIS_URL is not set "
                    "(apt-get install redis-server to run the Redis tests)")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly",
         "no", "--daemonize", "no", "--loglevel", "notice"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        while True:  # its log says when it accepts connections
            ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
            line = proc.stdout.readline() if ready else ""
            if not line:
                raise AssertionError(f"redis-server did not start: {''.join(seen)}")
            seen.append(line)
            if "Ready to accept connections" in line:
                break
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    p = f"lousho-test:{uuid.uuid4().hex[:12]}:"
    yield p
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=p + "*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain redis-py client (to age entries, damage data, read keys)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


# --- the kits: one store kind each, with the raw operations tests need ----------------------


class Kit:
    """A store kind under test. ``where`` is what its errors name (path or address);
    ``where_attr`` the error attribute holding it."""

    name = ""
    where = ""
    where_attr = ""

    def open(self) -> Any:
        """A new store on the same data."""
        raise NotImplementedError

    def age(self, what: str, id: str, seconds: float) -> None:
        """Make a session / checkpoint / resolved approval look ``seconds`` older."""
        raise NotImplementedError

    def damage_message(self, id: str, index: int) -> None:
        """Overwrite message ``index`` of session ``id`` with bad JSON."""
        raise NotImplementedError

    def checkpoint_json(self, key: str) -> str:
        """The stored JSON of a checkpoint."""
        raise NotImplementedError

    def set_checkpoint_json(self, key: str, text: str) -> None:
        """Overwrite the stored JSON of a checkpoint."""
        raise NotImplementedError

    def child_args(self) -> list[str]:
        """How a child process opens the same store (see WORKER)."""
        raise NotImplementedError


class SqliteKit(Kit):
    name, where_attr = "sqlite", "path"

    def __init__(self, path: Path) -> None:
        self.where = str(path)

    def open(self) -> Any:
        from lousho_sync.sqlite import SqliteStore

        return SqliteStore(self.where)

    def _sql(self, sql: str, *params: object) -> list[Any]:
        with sqlite3.connect(self.where, isolation_level=None, timeout=10) as conn:
            return conn.execute(sql, params).fetchall()

    def age(self, what: str, id: str, seconds: float) -> None:
        sql = {
            "session": "UPDATE sessions SET updated_at = updated_at - ? WHERE id = ?",
            "checkpoint": "UPDATE checkpoints SET updated_at = updated_at - ? WHERE key = ?",
            "approval": "UPDATE approvals SET resolved_at = resolved_at - ? WHERE id = ?",
        }[what]
        self._sql(sql, seconds, id)

    def damage_message(self, id: str, index: int) -> None:
        self._sql("UPDATE messages SET json = '{not json' WHERE seq = ? AND session_key ="
                  " (SELECT key FROM sessions WHERE id = ?)", index, id)

    def checkpoint_json(self, key: str) -> str:
        return str(self._sql("SELECT json FROM checkpoints WHERE key = ?", key)[0][0])

    def set_checkpoint_json(self, key: str, text: str) -> None:
        self._sql("UPDATE checkpoints SET json = ? WHERE key = ?", text, key)

    def child_args(self) -> list[str]:
        return ["sqlite", self.where, ""]


class RedisKit(Kit):
    name, where_attr = "redis", "address"

    def __init__(self, url: str, prefix: str, raw: redis.Redis) -> None:
        self.url, self.prefix, self.raw = url, prefix, raw
        self.where = url  # the test URLs carry no password: the address is the URL

    def open(self) -> Any:
        return RedisStore(self.url, prefix=self.prefix)

    def age(self, what: str, id: str, seconds: float) -> None:
        index = {"session": "sessions", "checkpoint": "checkpoints",
                 "approval": "approvals-resolved"}[what]
        assert self.raw.zscore(self.prefix + index, id) is not None
        self.raw.zincrby(self.prefix + index, -seconds, id)

    def damage_message(self, id: str, index: int) -> None:
        self.raw.lset(f"{self.prefix}session:{id}", index, "{not json")

    def checkpoint_json(self, key: str) -> str:
        return str(self.raw.get(f"{self.prefix}checkpoint:{key}"))

    def set_checkpoint_json(self, key: str, text: str) -> None:
        self.raw.set(f"{self.prefix}checkpoint:{key}", text)

    def child_args(self) -> list[str]:
        return ["redis", self.url, self.prefix]


@pytest.fixture(params=["sqlite", "redis"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Kit:
    if request.param == "sqlite":
        return SqliteKit(tmp_path / "store.db")
    return RedisKit(request.getfixturevalue("redis_url"), request.getfixturevalue("prefix"),
                    request.getfixturevalue("raw"))


@pytest.fixture
def store(kit: Kit) -> Iterator[Any]:
    s = kit.open()
    yield s
    s.close()


@pytest.fixture
def rstore(redis_url: str, prefix: str) -> Iterator[RedisStore]:
    with RedisStore(redis_url, prefix=prefix) as s:
        yield s


def user(text: str) -> Message:
    return Message("user", text)


def assistant(text: str) -> Message:
    return Message("assistant", text)


def texts(messages: list[Message] | None) -> list[object]:
    assert messages is not None
    return [m.content for m in messages]


def approval(id: str, session_id: str = "s1", **kw: Any) -> ApprovalRecord:
    return ApprovalRecord(id=id, session_id=session_id, checkpoint_key=f"{session_id}.turn-0",
                          call=ToolCall("call-1", "pay", {"amount": 5}), **kw)


def checkpoint(key: str, **kw: Any) -> Checkpoint:
    return Checkpoint(key=key, session_id=key.split(".")[0], run_id="run-1", **kw)


# --- contract: sessions ----------------------------------------------------------------------


def test_sessions_round_trip_replace_ids_delete(store: Any) -> None:
    sessions = store.sessions
    assert sessions.load("s1") is None and sessions.revision("s1") is None
    sessions.save("s1", [user("hi"), assistant("hello")])
    assert texts(sessions.load("s1")) == ["hi", "hello"]
    sessions.save("s1", [user("only")])
    assert texts(sessions.load("s1")) == ["only"]
    sessions.save("s2", [user("x")])
    assert sessions.ids() == ["s1", "s2"]
    sessions.save("s1", [])
    assert sessions.load("s1") is None and sessions.revision("s1") is None
    assert sessions.ids() == ["s2"]
    sessions.delete("s2")
    sessions.delete("never-there")
    assert sessions.ids() == []


def test_rich_messages_and_long_transcripts_round_trip(store: Any) -> None:
    call = ToolCall("c1", "search", {"q": "ünïcode", "n": 3})
    messages = [
        user("hi \ud800 there"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "result", tool_call_id="c1", is_error=True),
    ]
    store.sessions.save("s1", messages)
    assert store.sessions.load("s1") == messages
    long = [user(f"m{i}") for i in range(2_500)]  # more than one Lua unpack chunk
    store.sessions.save("long", long)
    store.sessions.append("long", long[:1_200], expected_length=2_500)
    assert texts(store.sessions.load("long")) == texts(long) + texts(long[:1_200])


def test_append_adds_and_bumps_revision(store: Any) -> None:
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


def test_append_conflict_names_lengths_and_leaves_store(kit: Kit, store: Any) -> None:
    sessions = store.sessions
    sessions.append("s1", [user("a"), assistant("b")], expected_length=0)
    before = sessions.revision("s1")
    with pytest.raises(StoreConflictError) as info:
        sessions.append("s1", [user("late")], expected_length=1)
    err = info.value
    assert (err.expected_length, err.actual_length, err.session_id) == (1, 2, "s1")
    assert getattr(err, kit.where_attr) == kit.where and kit.where in str(err)
    assert err.code == "LOUSHO_STORE_CONFLICT"
    assert texts(sessions.load("s1")) == ["a", "b"]
    assert sessions.revision("s1") == before
    with pytest.raises(StoreConflictError) as info:
        sessions.append("absent", [user("x")], expected_length=3)
    assert info.value.actual_length == 0
    assert sessions.load("absent") is None
    with pytest.raises(StoreConflictError):
        sessions.append("s1", [], expected_length=5)


@pytest.mark.parametrize("bad", ["", "a b", "../etc", "x" * 129, "é", "a:b"])
def test_invalid_session_id(store: Any, bad: str) -> None:
    owner = make_owner()
    calls: list[Callable[[], object]] = [
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


def test_corrupt_message_names_where_and_which(kit: Kit, store: Any) -> None:
    store.sessions.save("s1", [user("a"), user("b")])
    kit.damage_message("s1", 1)
    with pytest.raises(StoreCorruptError) as info:
        store.sessions.load("s1")
    assert kit.where in str(info.value) and "message 1" in str(info.value)
    assert getattr(info.value, kit.where_attr) == kit.where
    assert info.value.session_id == "s1"


def test_usable_as_agent_store(store: Any) -> None:
    assert isinstance(store.sessions, SessionStore)
    assert isinstance(store.checkpoints, CheckpointStore)
    assert isinstance(store.approvals, ApprovalStore)
    for name in ("append", "revision", "ids", "acquire_lease", "renew_lease", "release_lease"):
        assert callable(getattr(store.sessions, name))


def test_commit_turn_appends_drops_checkpoint_and_releases_lease(store: Any) -> None:
    sessions, owner = store.sessions, make_owner()
    sessions.append("s1", [user("a"), assistant("b")], expected_length=0)
    store.checkpoints.save("s1.turn-2", checkpoint("s1.turn-2"))
    store.checkpoints.save("s1.turn-9", checkpoint("s1.turn-9"))
    assert sessions.acquire_lease("s1", owner=owner, ttl_s=600, wait_s=0)
    kw: dict[str, Any] = {"checkpoints": store.checkpoints, "checkpoint_key": "s1.turn-2"}
    with pytest.raises(StoreConflictError) as info:  # nothing changes on a conflict
        sessions.commit_turn("s1", [user("c")], expected_length=1, release_owner=owner, **kw)
    assert info.value.actual_length == 2
    assert store.checkpoints.keys("s1.") == ["s1.turn-2", "s1.turn-9"]
    assert not sessions.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0)
    revision = sessions.commit_turn("s1", [user("c"), assistant("d")], expected_length=2,
                                    release_owner=owner, **kw)
    assert revision is not None and revision == sessions.revision("s1")
    assert texts(sessions.load("s1")) == ["a", "b", "c", "d"]
    assert store.checkpoints.keys("s1.") == ["s1.turn-9"]
    other = make_owner()
    assert sessions.acquire_lease("s1", owner=other, ttl_s=600, wait_s=0)  # released
    # not the holder: the lease stays; no checkpoint key: nothing else is deleted
    assert sessions.commit_turn("s1", [user("e")], expected_length=4, checkpoints=None,
                                checkpoint_key=None, release_owner=owner) is not None
    assert not sessions.acquire_lease("s1", owner=owner, ttl_s=600, wait_s=0)
    assert store.checkpoints.keys("s1.") == ["s1.turn-9"]
    # nothing to append, or another store's checkpoints: None, nothing done
    assert sessions.commit_turn("s1", [], expected_length=5, release_owner=other, **kw) is None
    foreign = {"checkpoints": object(), "checkpoint_key": "s1.turn-9"}
    assert sessions.commit_turn("s1", [user("f")], expected_length=5, release_owner=None,
                                **foreign) is None
    assert len(sessions.load("s1")) == 5 and store.checkpoints.keys("s1.") == ["s1.turn-9"]


# --- contract: checkpoints -------------------------------------------------------------------


def test_checkpoints_round_trip_and_keys(store: Any) -> None:
    cps = store.checkpoints
    assert cps.load("s1.turn-0") is None
    cp = checkpoint("s1.turn-0", input=(user("q"),), started_call_ids=("c1",), extra={"new": 1})
    cps.save("s1.turn-0", cp)
    assert cps.load("s1.turn-0") == cp
    cps.save("s1.turn-0", checkpoint("s1.turn-0", status="interrupted"))
    loaded = cps.load("s1.turn-0")
    assert loaded is not None and loaded.status == "interrupted"
    for key in ("s1.turn-2", "s10.turn-0", "s2.turn-0", "s1", "ü.turn-0"):
        cps.save(key, checkpoint(key))
    assert cps.keys("s1.") == ["s1.turn-0", "s1.turn-2"]
    assert cps.keys("s1") == ["s1", "s1.turn-0", "s1.turn-2", "s10.turn-0"]
    assert cps.keys("") == ["s1", "s1.turn-0", "s1.turn-2", "s10.turn-0", "s2.turn-0",
                            "ü.turn-0"]
    assert cps.keys("ü") == ["ü.turn-0"]
    assert cps.keys("zz") == []
    cps.delete("s1.turn-0")
    cps.delete("not-there")
    assert cps.keys("s1.") == ["s1.turn-2"]


def test_checkpoint_unknown_fields_round_trip(kit: Kit, store: Any) -> None:
    store.checkpoints.save("s1.turn-0", checkpoint("s1.turn-0"))
    doc = json.loads(kit.checkpoint_json("s1.turn-0"))
    doc["from_the_future"] = {"a": [1, 2]}
    kit.set_checkpoint_json("s1.turn-0", json.dumps(doc))
    loaded = store.checkpoints.load("s1.turn-0")
    assert loaded is not None and loaded.extra == {"from_the_future": {"a": [1, 2]}}
    store.checkpoints.save("s1.turn-0", loaded)
    assert json.loads(kit.checkpoint_json("s1.turn-0"))["from_the_future"] == {"a": [1, 2]}
    kit.set_checkpoint_json("s1.turn-0", "[broken")
    with pytest.raises(StoreCorruptError) as info:
        store.checkpoints.load("s1.turn-0")
    assert kit.where in str(info.value) and "s1.turn-0" in str(info.value)


# --- contract: approvals ---------------------------------------------------------------------


def test_approvals_create_get_list_resolve(store: Any) -> None:
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
    approved = ap.resolve("a0", approved=True)  # no reason
    assert (approved.status, approved.reason) == ("approved", None)
    assert ap.get("a0") == approved
    ap.create(approval("a2", session_id="s2", status="approved", created_at=2.0))  # replace
    assert ap.list_pending() == []


def test_approval_unknown_fields_round_trip(store: Any) -> None:
    record = approval("a1", extra={"ticket": "T-9"})
    store.approvals.create(record)
    assert store.approvals.get("a1") == record
    done = store.approvals.resolve("a1", approved=True)
    assert done.extra == {"ticket": "T-9"} and done.status == "approved"
    got = store.approvals.get("a1")
    assert got is not None and got.extra == {"ticket": "T-9"}


def test_resolve_race_between_threads(store: Any) -> None:
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


def test_sixteen_threads_write_different_sessions(store: Any) -> None:
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            barrier.wait(timeout=TIMEOUT)
            sid = f"t{n}"
            for i in range(20):
                store.sessions.append(sid, [user(f"{n}-{i}"), assistant("ok")],
                                      expected_length=2 * i)
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


# --- contract: close, prune, leases ----------------------------------------------------------


def test_use_after_close(kit: Kit) -> None:
    s = kit.open()
    s.sessions.save("s1", [user("a")])
    s.close()
    s.close()
    calls: list[Callable[[], object]] = [
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
        assert kit.where in str(info.value)
    with kit.open() as again:
        assert texts(again.sessions.load("s1")) == ["a"]


def test_prune_counts_and_keeps_pending(kit: Kit, store: Any) -> None:
    store.sessions.save("old", [user("a"), user("b")])
    store.sessions.save("new", [user("c")])
    store.checkpoints.save("old.turn-2", checkpoint("old.turn-2"))
    store.checkpoints.save("new.turn-1", checkpoint("new.turn-1"))
    for id in ("resolved-old", "resolved-new", "pending-old"):
        store.approvals.create(approval(id, created_at=1.0 if id == "pending-old" else 2.0))
    store.approvals.resolve("resolved-old", approved=True)
    store.approvals.resolve("resolved-new", approved=False)
    kit.age("session", "old", 7200)  # two hours ago, written directly: no waiting
    kit.age("checkpoint", "old.turn-2", 7200)
    kit.age("approval", "resolved-old", 7200)
    assert store.prune(3600) == PruneResult(sessions=1, checkpoints=1, approvals=1)
    assert store.sessions.ids() == ["new"]
    assert store.sessions.load("old") is None
    assert store.checkpoints.keys("") == ["new.turn-1"]
    assert store.approvals.get("resolved-old") is None
    assert [r.id for r in store.approvals.list_pending()] == ["pending-old"]
    assert store.approvals.get("resolved-new") is not None
    assert store.prune(3600) == PruneResult(0, 0, 0)
    with pytest.raises(ConfigError):
        store.prune(-1)


def test_prune_keeps_a_session_under_a_live_lease(kit: Kit, store: Any) -> None:
    store.sessions.save("busy", [user("a")])
    assert store.sessions.acquire_lease("busy", owner=make_owner(), ttl_s=600, wait_s=0)
    kit.age("session", "busy", 7200)
    assert store.prune(3600).sessions == 0
    assert store.sessions.ids() == ["busy"]


def test_lease_is_exclusive_until_released(store: Any) -> None:
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
    assert store.renew_lease("s1", owner=b, ttl_s=600)
    store.release_lease("s1", owner=b)
    assert store.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    with pytest.raises(ConfigError):
        leases.acquire_lease("s1", owner=a, ttl_s=0, wait_s=0)
    with pytest.raises(ConfigError):
        leases.renew_lease("s1", owner=a, ttl_s=-1)


def test_lease_waiter_gets_it_when_released(store: Any) -> None:
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


def test_short_lease_is_taken_over_when_it_expires(store: Any) -> None:
    a, b = make_owner(), make_owner()
    assert store.sessions.acquire_lease("s1", owner=a, ttl_s=0.05, wait_s=0)
    assert store.sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=TIMEOUT)
    assert not store.sessions.renew_lease("s1", owner=a, ttl_s=600)
    store.sessions.release_lease("s1", owner=a)  # too late: not the holder any more
    assert not store.sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)


# --- real processes --------------------------------------------------------------------------

WORKER = r"""
import os, sys
from lousho_sync import ScriptedProvider, Step, create_agent, tool
from lousho_sync.errors import ApprovalAlreadyResolvedError
from lousho_sync.stores._lease import make_owner

kind, where, prefix, mode, name = sys.argv[1:6]
if kind == "redis":
    from lousho_sync.redis import RedisStore
    store = RedisStore(where, prefix=prefix)
else:
    from lousho_sync.sqlite import SqliteStore
    store = SqliteStore(where)

@tool
def charge(amount: int) -> str:
    "Charge the card."
    if mode == "crash":
        os._exit(17)  # the process dies while the tool runs
    return f"charged {amount}"

if mode == "hold":
    ok = store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=3600, wait_s=0)
    print("held" if ok else "refused", flush=True)
    sys.stdin.readline()  # until killed
    sys.exit(0)
if mode == "crash":
    provider = ScriptedProvider([Step(tool_calls=[("charge", {"amount": 5})]), "unused"])
    create_agent(provider=provider, tools=[charge], store=store).session(id="buyer").send("buy")
    sys.exit(0)
if mode == "resume":
    session = create_agent(provider=ScriptedProvider(["done"]), tools=[charge],
                           store=store).session(id="buyer")
    print(session.pending().status, flush=True)
    print(session.resume().text, flush=True)
    sys.exit(0)
agent = create_agent(provider=ScriptedProvider(default="ok"), store=store)
print("ready", flush=True)
sys.stdin.readline()
if mode == "turns":
    for i in range(50):
        agent.session(id="shared" if i % 5 else "other").send(f"{name}-{i}")
    print("done", flush=True)
elif mode == "resolve":
    try:
        store.approvals.resolve("a1", approved=True, reason=name)
        print("won", flush=True)
    except ApprovalAlreadyResolvedError:
        print("lost", flush=True)
store.close()
"""


def _spawn(kit: Kit, mode: str, name: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, *kit.child_args(), mode, name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _read_line(proc: subprocess.Popen[str], timeout: float = TIMEOUT) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the child process said nothing in time"
    return proc.stdout.readline().strip()


def _run_together(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Wait until every child is ready, release them at once, return their stdout."""
    try:
        for p in procs:
            line = _read_line(p)
            assert line == "ready", f"{line!r} {p.stderr.read() if p.stderr else ''}"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, stderr
            out.append(stdout.strip())
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=TIMEOUT)


@pytest.fixture
def rkit(redis_url: str, prefix: str, raw: redis.Redis) -> RedisKit:
    return RedisKit(redis_url, prefix, raw)


def test_four_processes_x_50_turns_lose_no_turn(rkit: RedisKit) -> None:
    names = [f"p{i}" for i in range(4)]
    assert _run_together([_spawn(rkit, "turns", n) for n in names]) == ["done"] * 4
    with rkit.open() as s:
        for sid, mine in (("shared", lambda i: i % 5), ("other", lambda i: not i % 5)):
            messages = s.sessions.load(sid)
            assert messages is not None
            assert [m.role for m in messages] == ["user", "assistant"] * (len(messages) // 2)
            assert all(m.content == "ok" for m in messages[1::2])  # turns never interleave
            users = [m.content for m in messages[0::2]]
            expected = [f"{n}-{i}" for n in names for i in range(50) if mine(i)]
            assert sorted(users) == sorted(expected)  # zero lost, zero doubled
            for n in names:  # each process's turns in its own order
                assert [u for u in users if u.startswith(f"{n}-")] == [
                    e for e in expected if e.startswith(f"{n}-")]
        assert len(s.sessions.load("shared") or []) == 2 * 4 * 40
        assert s.checkpoints.keys("") == []


def test_eight_processes_resolve_one_approval_once(rkit: RedisKit) -> None:
    with rkit.open() as s:
        s.approvals.create(approval("a1"))
    said = _run_together([_spawn(rkit, "resolve", f"w{i}") for i in range(8)])
    assert sorted(said) == ["lost"] * 7 + ["won"]
    with rkit.open() as s:
        record = s.approvals.get("a1")
        assert s.approvals.list_pending() == []
    assert record is not None and record.status == "approved"
    assert record.reason == f"w{said.index('won')}"


def test_lease_of_killed_process_is_taken_over_at_once(kit: Kit, store: Any) -> None:
    child = _spawn(kit, "hold")
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


def test_turn_crashed_in_one_process_resumes_in_another(rkit: RedisKit) -> None:
    def run(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", WORKER, *rkit.child_args(), mode, ""],
                              capture_output=True, text=True, timeout=TIMEOUT)

    crashed = run("crash")
    assert crashed.returncode == 17, crashed.stderr
    resumed = run("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split("\n")[:2] == ["interrupted", "done"]
    with rkit.open() as s:
        messages = s.sessions.load("buyer")
        assert messages is not None
        assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[2].content == "charged 5"
        assert s.checkpoints.keys("") == []


# --- Redis only ------------------------------------------------------------------------------


def test_unreachable_server_names_address_without_password() -> None:
    port = _free_port()  # closed: nothing listens there
    store = RedisStore(f"redis://alice:s3cr3t-pw@127.0.0.1:{port}/2", prefix="x:")
    assert store.address == f"redis://127.0.0.1:{port}/2"
    assert "s3cr3t" not in repr(store)
    for call in (lambda: store.sessions.load("s1"),
                 lambda: store.approvals.resolve("a1", approved=True),
                 lambda: store.acquire_lease("s1", owner=make_owner(), ttl_s=1, wait_s=0)):
        with pytest.raises(StoreUnavailableError) as info:
            call()
        err = info.value
        assert f"redis://127.0.0.1:{port}/2" in str(err) and err.address == store.address
        assert "s3cr3t" not in str(err) and err.code == "LOUSHO_STORE_UNAVAILABLE"
        assert isinstance(err.__cause__, redis.exceptions.ConnectionError)
    store.close()


def test_bad_configuration_is_refused(redis_url: str) -> None:
    with pytest.raises(ConfigError) as info:
        RedisStore("http://example.com:6379/0")
    assert "redis://" in str(info.value)
    with pytest.raises(ConfigError):
        RedisStore(redis_url, ttl_s=0)
    with pytest.raises(ConfigError):
        RedisStore(42)  # type: ignore[arg-type]


def test_given_client_is_used_and_left_open(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    with RedisStore(client, prefix=prefix) as s:
        s.sessions.append("s1", [user("é")], expected_length=0)
        s.checkpoints.save("s1.turn-1", checkpoint("s1.turn-1"))
        s.approvals.create(approval("a1"))
        assert texts(s.sessions.load("s1")) == ["é"] and s.sessions.ids() == ["s1"]
        assert s.checkpoints.keys("s1") == ["s1.turn-1"]
        assert s.approvals.resolve("a1", approved=True).status == "approved"
        assert isinstance(s.sessions.revision("s1"), int)
    assert client.ping() is True  # still open
    with pytest.raises(StoreClosedError):
        s.sessions.load("s1")
    client.close()


def test_session_ttl_is_set_and_refreshed_and_expired_ids_vanish(
    redis_url: str, prefix: str, raw: redis.Redis
) -> None:
    with RedisStore(redis_url, prefix=prefix, ttl_s=600) as s:
        s.sessions.append("s1", [user("a")], expected_length=0)
        s.sessions.save("s2", [user("b")])
        for key in (f"{prefix}session:s1", f"{prefix}session-meta:s1", f"{prefix}session:s2"):
            assert 0 < raw.pttl(key) <= 600_000
        raw.pexpire(f"{prefix}session:s1", 100_000)
        s.sessions.append("s1", [user("c")], expected_length=1)  # a write refreshes it
        assert raw.pttl(f"{prefix}session:s1") > 100_000
        raw.pexpire(f"{prefix}session:s2", 1)  # expire it now instead of waiting
        raw.pexpire(f"{prefix}session-meta:s2", 1)
        assert poll_until(lambda: not raw.exists(f"{prefix}session:s2"), TIMEOUT)
        assert s.sessions.load("s2") is None and s.sessions.revision("s2") is None
        assert s.sessions.ids() == ["s1"]
        assert raw.zrange(f"{prefix}sessions", 0, -1) == ["s1"]  # the index was cleaned
    with RedisStore(redis_url, prefix=prefix) as s:  # no ttl_s: no expiry
        s.sessions.save("s3", [user("d")])
        assert raw.pttl(f"{prefix}session:s3") == -1


def test_foreign_data_under_the_prefix_is_corrupt(rstore: RedisStore, raw: redis.Redis) -> None:
    raw.set(f"{rstore.prefix}session:s1", "not a list")
    with pytest.raises(StoreCorruptError) as info:
        rstore.sessions.load("s1")
    assert rstore.address in str(info.value) and "WRONGTYPE" in str(info.value)
    assert raw.get(f"{rstore.prefix}session:s1") == "not a list"  # left as it was
    raw.hset(f"{rstore.prefix}approval:a1", mapping={"json": "{}", "status": "pending"})
    with pytest.raises(StoreCorruptError) as info:
        rstore.approvals.get("a1")
    assert "approval 'a1'" in str(info.value)


def test_newer_layout_is_refused(redis_url: str, prefix: str, raw: redis.Redis) -> None:
    raw.set(f"{prefix}layout", str(LAYOUT_VERSION + 41))
    with RedisStore(redis_url, prefix=prefix) as s, pytest.raises(StoreTooNewError) as info:
        s.sessions.load("s1")
    message = str(info.value)
    assert f"version {LAYOUT_VERSION + 41}" in message and f"version {LAYOUT_VERSION}" in message
    assert raw.get(f"{prefix}layout") == str(LAYOUT_VERSION + 41)
    assert raw.keys(prefix + "*") == [f"{prefix}layout"]  # nothing else written


def test_prefixes_keep_stores_apart(redis_url: str, prefix: str) -> None:
    with RedisStore(redis_url, prefix=prefix + "a:") as a, \
            RedisStore(redis_url, prefix=prefix + "b:") as b:
        a.sessions.save("s1", [user("a")])
        a.checkpoints.save("s1.turn-1", checkpoint("s1.turn-1"))
        assert b.sessions.load("s1") is None and b.sessions.ids() == []
        assert b.checkpoints.keys("") == []
        assert b.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0)
        assert a.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0)


def test_a_retried_append_or_resolve_is_not_a_conflict(rstore: RedisStore) -> None:
    """redis-py retries a call whose reply was lost; the retry must see its own write."""
    c = rstore._c
    keys = [c.key("session:", "s1"), c.key("session-meta:", "s1"), c.key("revision"),
            c.key("sessions"), c.key("checkpoint:"), c.key("checkpoints"),
            c.key("checkpoint-keys"), c.key("lease:", "s1")]
    args: list[Any] = ["1.0", 0, "s1", 0, "token-1", "0", "", "", '{"role":"user","content":"a"}']
    first = list(c.append_script(keys, args, c.client))
    assert first[:2] == [1, 1] and first[2] == rstore.sessions.revision("s1")
    assert list(c.append_script(keys, args, c.client)) == first  # the retry: no double
    other = [*args[:4], "token-2", *args[5:]]
    assert list(c.append_script(keys, other, c.client)) == [0, 1]
    assert texts(rstore.sessions.load("s1")) == ["a"]
    rstore.approvals.create(approval("a1"))
    rkeys = [c.key("approval:", "a1"), c.key("approvals-pending"), c.key("approvals-resolved")]
    rargs = ["approved", "0", "", "5.0", "a1", "token-3"]
    assert c.resolve_script(rkeys, rargs, c.client)[0] == 1
    assert c.resolve_script(rkeys, rargs, c.client)[0] == 1  # the retry still wins
    assert c.resolve_script(rkeys, [*rargs[:5], "token-4"], c.client)[0] == 2


def test_package_root_does_not_import_redis() -> None:
    code = "import lousho_sync, sys; assert 'redis' not in sys.modules, 'redis imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
