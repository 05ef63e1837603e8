"""One conformance suite for every built-in store: the same behaviour, parametrized.

Each store kind comes as a :class:`Kit`: the store plus the few store-specific hooks a test
needs (open the same data through a new store object, damage or age stored data, where its
errors say the data is). A test that needs what a store does not have (a lease, ``prune``,
``commit_turn``, ``close``, raw data to damage) is skipped with the reason the kit gives;
:func:`test_usable_as_agent_store` checks that those claims match the store.

The Redis kind runs on the server of the ``redis_url`` fixture (see conftest.py). Tests of
one store's own layout and settings, and the multi-process tests, stay in that store's file.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from conftest import ENCRYPTION_KEY_VAR, approval, assistant, checkpoint, read_line, texts, user

from lousho_sync.agent import create_agent
from lousho_sync.errors import (
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    ConfigError,
    InvalidSessionIdError,
    LeaseLostError,
    StoreClosedError,
    StoreConflictError,
    StoreCorruptError,
)
from lousho_sync.messages import ImagePart, Message, TextPart, ToolCall, Usage
from lousho_sync.providers.scripted import ScriptedProvider
from lousho_sync.results import PruneResult
from lousho_sync.stores._events import MemoryEventOps, event_ops_of
from lousho_sync.stores._lease import make_owner
from lousho_sync.stores._mail import mail_ops_of
from lousho_sync.stores.base import (
    ApprovalRecord,
    ApprovalStore,
    Checkpoint,
    CheckpointStore,
    Fence,
    LeaseQuery,
    SessionStore,
    StoreCapabilities,
    capabilities_of,
    supports_append,
    supports_fencing,
    supports_lease,
    supports_revision,
    turn_committer,
)
from lousho_sync.stores.files import FileStore
from lousho_sync.stores.memory import memory_store

TIMEOUT = 60.0

# What a store may lack, and which methods (on the store or its sessions) it then lacks.
CAPABILITIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "leases": ("sessions", ("acquire_lease", "renew_lease", "release_lease", "fence_token")),
    "store leases": ("store", ("acquire_lease", "renew_lease", "release_lease", "fence_token")),
    "commit_turn": ("store", ("commit_turn",)),
    "close": ("store", ("close",)),
    "prune": ("store", ("prune",)),
}


# --- the kits: one store kind each, with the store-specific hooks tests need -----------------


class Kit:
    """A store kind under test.

    ``location`` is what its errors name (a path or an address; None: nothing) and
    ``location_attr`` the error attribute holding it. ``lacks`` maps what a test may need
    (a capability of :data:`CAPABILITIES`, or a behaviour) to why this store lacks it.
    """

    name = ""
    location: str | None = None
    location_attr = ""
    lacks: Mapping[str, str] = {}

    def open(self) -> Any:
        """A store object on this kit's data (a new one, where the store can be reopened)."""
        raise NotImplementedError

    def close(self, store: Any) -> None:
        """Close ``store`` if it can be closed."""
        close = getattr(store, "close", None)
        if close is not None:
            close()

    @contextmanager
    def reopened(self) -> Iterator[Any]:
        """The same data through a new store object, closed afterwards."""
        store = self.open()
        try:
            yield store
        finally:
            self.close(store)

    def need(self, *what: str) -> None:
        """Skip the test when this store lacks any of ``what``."""
        for w in what:
            if w in self.lacks:
                pytest.skip(f"{self.name}: {self.lacks[w]}")

    def session_location(self, id: str) -> str | None:
        """What an error about session ``id`` names as the place of the data."""
        return self.location

    def checkpoint_location(self, key: str) -> str | None:
        """What an error about checkpoint ``key`` names as the place of the data."""
        return self.location

    def message_ref(self, index: int) -> str:
        """How an error names message ``index`` of a transcript."""
        return f"message {index}"

    def damage_message(self, id: str, index: int) -> None:
        """Overwrite message ``index`` of session ``id`` with something unreadable."""
        raise NotImplementedError

    def checkpoint_json(self, key: str) -> str:
        """The stored JSON of a checkpoint."""
        raise NotImplementedError

    def set_checkpoint_json(self, key: str, text: str) -> None:
        """Overwrite the stored JSON of a checkpoint."""
        raise NotImplementedError

    def age(self, what: str, id: str, seconds: float) -> None:
        """Make a session / checkpoint / resolved approval look ``seconds`` older."""
        raise NotImplementedError

    def child_argv(self) -> list[str]:
        """How a child process opens this kit's store (see CHILD_FENCED_TURN)."""
        raise NotImplementedError


class MemoryKit(Kit):
    name = "memory"
    lacks = {
        "leases": "the memory store serves one process: it keeps no lease",
        "store leases": "the memory store keeps no lease",
        "commit_turn": "the memory store has no commit_turn",
        "fencing": "the memory store keeps no lease: its writes take no fence",
        "close": "the memory store has nothing to close",
        "prune": "the memory store has no prune",
        "raw data": "the memory store keeps objects, not stored text: nothing to damage",
        "id rule": "the memory store takes any session id (it names no file or key)",
    }

    def __init__(self) -> None:
        self._store = memory_store()

    def open(self) -> Any:
        return self._store  # nothing outlives the object: "reopening" is the same store


class FileKit(Kit):
    name, location_attr = "files", "path"
    lacks = {
        "store leases": "FileStore keeps leases on its sessions store only",
        "commit_turn": "FileStore has no commit_turn",
        "fencing": "a stopped file-lease holder keeps the others out: its writes take no fence",
        "close": "FileStore holds nothing open",
        "any checkpoint key": "checkpoint keys are file names: letters, digits, '.', '_', '-'",
    }

    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = str(root)

    def open(self) -> Any:
        return FileStore(self.root)

    def _session(self, id: str) -> Path:
        return self.root / "sessions" / f"{id}.json"

    def _checkpoint(self, key: str) -> Path:
        return self.root / "state" / "checkpoints" / f"{key}.json"

    def session_location(self, id: str) -> str:
        return str(self._session(id))

    def checkpoint_location(self, key: str) -> str:
        return str(self._checkpoint(key))

    def message_ref(self, index: int) -> str:
        return f"messages[{index}]"

    def damage_message(self, id: str, index: int) -> None:
        path = self._session(id)
        doc = json.loads(path.read_text())
        doc["messages"][index] = "{not json"
        path.write_text(json.dumps(doc))

    def checkpoint_json(self, key: str) -> str:
        return self._checkpoint(key).read_text()

    def set_checkpoint_json(self, key: str, text: str) -> None:
        self._checkpoint(key).write_text(text)

    def age(self, what: str, id: str, seconds: float) -> None:
        if what == "approval":
            path = self.root / "state" / "approvals" / f"{id}.json"
            doc = json.loads(path.read_text())
            doc["resolved_at"] -= seconds
            path.write_text(json.dumps(doc))
            return
        path = self._session(id) if what == "session" else self._checkpoint(id)
        mtime = path.stat().st_mtime - seconds
        os.utime(path, (mtime, mtime))
        sidecar = self.root / "sessions" / f"{id}.meta.json"
        if what == "session" and sidecar.exists():  # the catalog's times are the truth
            doc = json.loads(sidecar.read_text())
            doc["created_at"] -= seconds
            doc["updated_at"] -= seconds
            sidecar.write_text(json.dumps(doc))


class SqliteKit(Kit):
    name, location_attr = "sqlite", "path"

    def __init__(self, path: Path) -> None:
        self.location = str(path)

    def child_argv(self) -> list[str]:
        assert self.location is not None
        return ["sqlite", self.location, ""]

    def open(self) -> Any:
        from lousho_sync.sqlite import SqliteStore

        return SqliteStore(self.location)

    def _sql(self, sql: str, *params: object) -> list[Any]:
        assert self.location is not None
        with sqlite3.connect(self.location, isolation_level=None, timeout=10) as conn:
            return conn.execute(sql, params).fetchall()

    def damage_message(self, id: str, index: int) -> None:
        self._sql("UPDATE messages SET json = '{not json' WHERE id = ? + 4294967296 *"
                  " (SELECT key FROM sessions WHERE id = ?)", index, id)

    def checkpoint_json(self, key: str) -> str:
        return str(self._sql("SELECT json FROM checkpoints WHERE key = ?", key)[0][0])

    def set_checkpoint_json(self, key: str, text: str) -> None:
        self._sql("UPDATE checkpoints SET json = ? WHERE key = ?", text, key)

    def age(self, what: str, id: str, seconds: float) -> None:
        sql = {
            "session": "UPDATE sessions SET updated_at = updated_at - ? WHERE id = ?",
            "checkpoint": "UPDATE checkpoints SET updated_at = updated_at - ? WHERE key = ?",
            "approval": "UPDATE approvals SET resolved_at = resolved_at - ? WHERE id = ?",
        }[what]
        self._sql(sql, seconds, id)


class RedisKit(Kit):
    name, location_attr = "redis", "address"

    def __init__(self, url: str, prefix: str, raw: Any) -> None:
        self.url, self.prefix, self.raw = url, prefix, raw
        self.location = url  # the test URLs carry no password: the address is the URL

    def child_argv(self) -> list[str]:
        return ["redis", self.url, self.prefix]

    def open(self) -> Any:
        from lousho_sync.redis import RedisStore

        return RedisStore(self.url, prefix=self.prefix)

    def damage_message(self, id: str, index: int) -> None:
        self.raw.lset(f"{self.prefix}session:{id}", index, "{not json")

    def checkpoint_json(self, key: str) -> str:
        return str(self.raw.get(f"{self.prefix}checkpoint:{key}"))

    def set_checkpoint_json(self, key: str, text: str) -> None:
        self.raw.set(f"{self.prefix}checkpoint:{key}", text)

    def age(self, what: str, id: str, seconds: float) -> None:
        index = {"session": "sessions", "checkpoint": "checkpoints",
                 "approval": "approvals-resolved"}[what]
        assert self.raw.zscore(self.prefix + index, id) is not None
        self.raw.zincrby(self.prefix + index, -seconds, id)


class PostgresKit(Kit):
    name, location_attr = "postgres", "address"

    def __init__(self, url: str, schema: str) -> None:
        self.url, self.schema = url, schema
        self.location = url  # the test URLs carry no password: the address is the URL

    def child_argv(self) -> list[str]:
        return ["postgres", self.url, self.schema]

    def open(self) -> Any:
        from lousho_sync.postgres import PostgresStore

        return PostgresStore(self.url, schema=self.schema)

    def _sql(self, text: str, *params: object) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(text.replace("{s}", f'"{self.schema}"'), params)

    def damage_message(self, id: str, index: int) -> None:
        self._sql("UPDATE {s}.messages SET json = '{not json' WHERE seq = %s AND session_key ="
                  " (SELECT key FROM {s}.sessions WHERE id = %s)", index, id)

    def checkpoint_json(self, key: str) -> str:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(f'SELECT json FROM "{self.schema}".checkpoints WHERE key = %s',
                               (key,)).fetchone()
        assert row is not None
        return str(row[0])

    def set_checkpoint_json(self, key: str, text: str) -> None:
        self._sql("UPDATE {s}.checkpoints SET json = %s WHERE key = %s", text, key)

    def age(self, what: str, id: str, seconds: float) -> None:
        sql = {
            "session": "UPDATE {s}.sessions SET updated_at = updated_at - %s WHERE id = %s",
            "checkpoint": "UPDATE {s}.checkpoints SET updated_at = updated_at - %s WHERE key = %s",
            "approval": "UPDATE {s}.approvals SET resolved_at = resolved_at - %s WHERE id = %s",
        }[what]
        self._sql(sql, seconds, id)


class EncryptedKit(Kit):
    """An EncryptedStore over another kit's store (the key from ENCRYPTION_KEY_VAR): the
    inner kit's hooks, with checkpoint JSON read and written through the encryption."""

    def __init__(self, inner: Kit) -> None:
        self.inner = inner
        self.name = f"encrypted-{inner.name}"
        self.location, self.location_attr = inner.location, inner.location_attr
        self.lacks = dict(inner.lacks)

    def open(self) -> Any:
        from lousho_sync.stores.encrypted import EncryptedStore

        return EncryptedStore(self.inner.open(), keys=[os.environ[ENCRYPTION_KEY_VAR]])

    def child_argv(self) -> list[str]:
        kind, where, prefix = self.inner.child_argv()
        return [f"encrypted-{kind}", where, prefix]

    def session_location(self, id: str) -> str | None:
        return self.inner.session_location(id)

    def checkpoint_location(self, key: str) -> str | None:
        return self.inner.checkpoint_location(key)

    def message_ref(self, index: int) -> str:
        return self.inner.message_ref(index)

    def damage_message(self, id: str, index: int) -> None:
        self.inner.damage_message(id, index)

    def age(self, what: str, id: str, seconds: float) -> None:
        self.inner.age(what, id, seconds)

    def _keyring(self) -> Any:
        from lousho_sync.stores.encrypted import Keyring

        return Keyring([os.environ[ENCRYPTION_KEY_VAR]])

    def checkpoint_json(self, key: str) -> str:
        from lousho_sync.stores.encrypted import MARK, record_aad

        envelope = json.loads(self.inner.checkpoint_json(key))
        return str(self._keyring().open(envelope[MARK], record_aad("checkpoint", key)).decode())

    def set_checkpoint_json(self, key: str, text: str) -> None:
        from lousho_sync.stores.encrypted import MARK, record_aad

        envelope = json.loads(self.inner.checkpoint_json(key))
        envelope[MARK] = self._keyring().seal(text.encode(), record_aad("checkpoint", key))
        self.inner.set_checkpoint_json(key, json.dumps(envelope))


@pytest.fixture(params=["memory", "files", "sqlite", "redis", "postgres", "encrypted-sqlite",
                        "encrypted-memory"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Kit:
    if request.param == "encrypted-sqlite":
        return EncryptedKit(SqliteKit(tmp_path / "store.db"))
    if request.param == "encrypted-memory":
        return EncryptedKit(MemoryKit())
    if request.param == "memory":
        return MemoryKit()
    if request.param == "files":
        return FileKit(tmp_path)
    if request.param == "sqlite":
        return SqliteKit(tmp_path / "store.db")
    if request.param == "postgres":
        return PostgresKit(request.getfixturevalue("postgres_url"),
                           request.getfixturevalue("postgres_schema"))
    return RedisKit(request.getfixturevalue("redis_url"),
                    request.getfixturevalue("redis_prefix"),
                    request.getfixturevalue("redis_raw"))


@pytest.fixture
def store(kit: Kit) -> Iterator[Any]:
    s = kit.open()
    yield s
    kit.close(s)


def run_threads(target: Callable[[int], None], count: int) -> None:
    """Run ``target(0)`` … ``target(count - 1)`` in threads and join them all."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
        assert not t.is_alive(), "a thread did not finish in time"


# --- what the store offers -------------------------------------------------------------------


def test_usable_as_agent_store(kit: Kit, store: Any) -> None:
    assert isinstance(store.sessions, SessionStore)
    assert isinstance(store.checkpoints, CheckpointStore)
    assert isinstance(store.approvals, ApprovalStore)
    for name in ("append", "revision", "ids"):
        assert callable(getattr(store.sessions, name))
    for capability, (part, methods) in CAPABILITIES.items():
        owner = store if part == "store" else store.sessions
        offered = [callable(getattr(owner, m, None)) for m in methods]
        assert offered == [capability not in kit.lacks] * len(methods), capability
    fenced = "fencing" not in kit.lacks
    for p in (store.sessions, store.checkpoints, store.approvals):
        assert supports_fencing(p) is fenced
    assert supports_append(store.sessions) and supports_revision(store.sessions)
    assert supports_lease(store.sessions) is ("leases" not in kit.lacks)
    committer = turn_committer(store.sessions)
    assert (committer is store) is ("commit_turn" not in kit.lacks)
    assert turn_committer(store) is committer


def test_capabilities_say_what_the_store_offers(kit: Kit, store: Any) -> None:
    caps = store.capabilities
    assert isinstance(caps, StoreCapabilities) and capabilities_of(store) == caps
    sessions = store.sessions
    shared = kit.name.removeprefix("encrypted-") != "memory"  # a store across processes
    # what the kit says the store lacks (each behaviour tested by the tests above/below)
    assert caps.lease is ("leases" not in kit.lacks) and caps.lease_query is caps.lease
    assert caps.fencing is ("fencing" not in kit.lacks)
    assert caps.commit_turn is ("commit_turn" not in kit.lacks)
    assert caps.prune is ("prune" not in kit.lacks)
    assert caps.append and caps.revision and caps.catalog  # every built-in store
    assert caps.events is shared and caps.mailbox  # memory: a mailbox, no log of its own
    # and the methods are there exactly then
    methods = {
        "lease": (sessions, ("acquire_lease", "renew_lease", "release_lease", "fence_token")),
        "lease_query": (sessions, ("lease_held",)),
        "append": (sessions, ("append",)),
        "revision": (sessions, ("revision",)),
        "catalog": (sessions, ("info", "set_metadata", "history", "compact", "create", "list")),
        "events": (sessions, ("event_ops",)),
        "mailbox": (sessions, ("mail_ops",)),
        "prune": (store, ("prune",)),
    }
    for name, (owner, names) in methods.items():
        offered = [callable(getattr(owner, n, None)) for n in names]
        assert offered == [getattr(caps, name)] * len(names), name
    assert (turn_committer(store) is not None) is caps.commit_turn
    # a session store offers what its store does, but prune; the other parts only fencing
    assert sessions.capabilities == attrs.evolve(caps, prune=False)
    for part in (store.checkpoints, store.approvals):
        assert part.capabilities == StoreCapabilities(fencing=caps.fencing)
    # without a log of its own, a turn's events live in this process's memory
    assert isinstance(event_ops_of(sessions), MemoryEventOps) is not caps.events
    assert (mail_ops_of(sessions) is not None) is caps.mailbox


# --- sessions --------------------------------------------------------------------------------

MSGS = [
    Message("user", (TextPart("look"), ImagePart(data=bytes(range(256)), media_type="image/png"))),
    Message("assistant", "", tool_calls=(ToolCall("c1", "f", {"x": [1, {"y": None}]}),),
            usage=Usage(5, 6, 0.25)),
    Message("tool", "result", tool_call_id="c1", is_error=True),
    Message("assistant", "done", usage=Usage(1, 2), metadata={"k": "v"}),
]


def test_sessions_round_trip_byte_for_byte(kit: Kit, store: Any) -> None:
    assert store.sessions.load("nobody") is None
    store.sessions.save("a", MSGS)
    with kit.reopened() as again:
        assert again.sessions.load("a") == MSGS
        assert again.sessions.load("a")[0].content[1].data == bytes(range(256))


def test_sessions_round_trip_replace_ids_delete(store: Any) -> None:
    sessions = store.sessions
    assert sessions.load("s1") is None and sessions.revision("s1") is None
    assert sessions.ids() == []
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
    sessions.delete("s2")
    sessions.delete("never-there")
    assert sessions.load("s2") is None
    assert sessions.ids() == []


def test_rich_messages_and_long_transcripts_round_trip(store: Any) -> None:
    call = ToolCall("c1", "search", {"q": "ünïcode", "n": 3})
    messages = [
        user("hi \U0001f600 \x00 there"),  # (a surrogate is refused: test_store_strings.py)
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "result", tool_call_id="c1", is_error=True),
    ]
    store.sessions.save("s1", messages)
    assert store.sessions.load("s1") == messages
    long = [user(f"m{i}") for i in range(2_500)]  # more than one Lua unpack chunk
    store.sessions.save("long", long)
    store.sessions.append("long", long[:1_200], expected_length=2_500)
    assert texts(store.sessions.load("long")) == texts(long) + texts(long[:1_200])


def test_longest_valid_session_id_works(store: Any) -> None:
    sid = "A-z_0" * 25 + "abc"
    assert len(sid) == 128
    store.sessions.save(sid, [user("x")])
    assert store.sessions.ids() == [sid]
    assert texts(store.sessions.load(sid)) == ["x"]


@pytest.mark.parametrize(
    "bad", ["", "a b", "../etc", "a/b", "/abs", "a.b", "a:b", "x" * 129, "é"]
)
def test_invalid_session_id(kit: Kit, store: Any, bad: str) -> None:
    kit.need("id rule")
    sessions, owner = store.sessions, make_owner()
    calls: list[Callable[[], object]] = [
        lambda: sessions.load(bad),
        lambda: sessions.save(bad, [user("x")]),
        lambda: sessions.delete(bad),
        lambda: sessions.append(bad, [user("x")], expected_length=0),
        lambda: sessions.revision(bad),
    ]
    if "leases" not in kit.lacks:
        calls += [
            lambda: sessions.acquire_lease(bad, owner=owner, ttl_s=1, wait_s=0),
            lambda: sessions.renew_lease(bad, owner=owner, ttl_s=1),
            lambda: sessions.release_lease(bad, owner=owner),
        ]
    for call in calls:
        with pytest.raises(InvalidSessionIdError) as info:
            call()
        assert info.value.session_id == bad
        assert repr(bad) in str(info.value)
        assert "^[A-Za-z0-9_-]{1,128}$" in str(info.value)
        assert isinstance(info.value, ValueError)


def test_append_adds_and_bumps_revision(store: Any) -> None:
    sessions = store.sessions
    sessions.append("s1", [user("a"), assistant("b")], expected_length=0)
    r1 = sessions.revision("s1")
    sessions.append("s1", [user("c"), assistant("d")], expected_length=2)
    r2 = sessions.revision("s1")
    assert texts(sessions.load("s1")) == ["a", "b", "c", "d"]
    sessions.save("s1", [user("z")])
    r3 = sessions.revision("s1")
    assert len({r1, r2, r3}) == 3
    sessions.delete("s1")
    sessions.save("s1", [user("z")])  # same content again: still a new revision
    assert sessions.revision("s1") not in {r1, r2, r3, None}


def test_an_empty_append_writes_nothing(kit: Kit, store: Any) -> None:
    kit.need("empty append keeps the revision")
    sessions = store.sessions
    sessions.append("s1", [user("a"), assistant("b")], expected_length=0)
    before = sessions.revision("s1")
    sessions.append("s1", [], expected_length=2)
    assert sessions.revision("s1") == before
    assert texts(sessions.load("s1")) == ["a", "b"]


def test_every_save_is_a_new_revision_even_of_the_same_content(store: Any) -> None:
    sessions = store.sessions
    seen: set[object] = set()
    for _ in range(5):
        sessions.save("s", [user("same size")])  # the same bytes every time
        revision = sessions.revision("s")
        assert revision is not None and revision not in seen
        seen.add(revision)
        assert sessions.revision("s") == revision  # stable while nothing is written
    sessions.delete("s")
    assert sessions.revision("s") is None


def test_append_conflict_names_lengths_and_leaves_store(kit: Kit, store: Any) -> None:
    sessions = store.sessions
    sessions.append("s1", [user("a"), assistant("b")], expected_length=0)
    before = sessions.revision("s1")
    with pytest.raises(StoreConflictError) as info:
        sessions.append("s1", [user("late")], expected_length=1)
    err = info.value
    assert (err.expected_length, err.actual_length, err.session_id) == (1, 2, "s1")
    where = kit.session_location("s1")
    if where is not None:
        assert getattr(err, kit.location_attr) == where and where in str(err)
    assert err.code == "LOUSHO_STORE_CONFLICT"
    assert texts(sessions.load("s1")) == ["a", "b"]
    assert sessions.revision("s1") == before
    with pytest.raises(StoreConflictError) as info:
        sessions.append("absent", [user("x")], expected_length=3)
    assert info.value.actual_length == 0
    assert sessions.load("absent") is None
    with pytest.raises(StoreConflictError):
        sessions.append("s1", [], expected_length=5)


def test_corrupt_message_names_where_and_which(kit: Kit, store: Any) -> None:
    kit.need("raw data")
    store.sessions.save("s1", [user("a"), user("b")])
    kit.damage_message("s1", 1)
    with pytest.raises(StoreCorruptError) as info:
        store.sessions.load("s1")
    where = kit.session_location("s1")
    assert where is not None
    assert where in str(info.value) and kit.message_ref(1) in str(info.value)
    assert getattr(info.value, kit.location_attr) == where
    assert info.value.session_id == "s1"


def test_commit_turn_appends_drops_checkpoint_and_releases_lease(kit: Kit, store: Any) -> None:
    kit.need("commit_turn")
    sessions, owner = store.sessions, make_owner()
    sessions.append("s1", [user("a"), assistant("b")], expected_length=0)
    store.checkpoints.save("s1.turn-2", checkpoint("s1.turn-2"))
    store.checkpoints.save("s1.turn-9", checkpoint("s1.turn-9"))
    token = sessions.acquire_lease("s1", owner=owner, ttl_s=600, wait_s=0)
    fence = Fence("s1", token)
    kw: dict[str, Any] = {"checkpoint_key": "s1.turn-2", "fence": fence, "release": True}
    with pytest.raises(StoreConflictError) as info:  # nothing changes on a conflict
        store.commit_turn("s1", [user("c")], expected_length=1, **kw)
    assert info.value.actual_length == 2
    assert store.checkpoints.keys("s1.") == ["s1.turn-2", "s1.turn-9"]
    assert sessions.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0) is None
    revision = store.commit_turn("s1", [user("c"), assistant("d")], expected_length=2, **kw)
    assert revision is not None and revision == sessions.revision("s1")
    assert texts(sessions.load("s1")) == ["a", "b", "c", "d"]
    assert store.checkpoints.keys("s1.") == ["s1.turn-9"]
    other = make_owner()
    assert sessions.acquire_lease("s1", owner=other, ttl_s=600, wait_s=0)  # released
    # no fence, no release, no checkpoint key: appended, nothing else changes
    assert store.commit_turn("s1", [user("e")], expected_length=4,
                             checkpoint_key=None) == sessions.revision("s1")
    assert sessions.acquire_lease("s1", owner=owner, ttl_s=600, wait_s=0) is None
    assert store.checkpoints.keys("s1.") == ["s1.turn-9"]
    with pytest.raises(ConfigError, match="needs the fence"):
        store.commit_turn("s1", [user("f")], expected_length=5, checkpoint_key=None,
                          release=True)
    assert len(sessions.load("s1")) == 5


def test_commit_turn_releases_only_the_lease_held_under_its_token(kit: Kit, store: Any) -> None:
    kit.need("commit_turn")
    sessions, a, b = store.sessions, make_owner(), make_owner()
    old = sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    sessions.release_lease("s1", owner=a)
    new = sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0)
    assert new > old
    # the newest token, but release=False: b keeps the lease
    store.commit_turn("s1", [user("x")], expected_length=0, checkpoint_key=None,
                      fence=Fence("s1", new))
    assert sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0) is None
    # an older token: refused, b keeps the lease, nothing appended
    with pytest.raises(LeaseLostError):
        store.commit_turn("s1", [user("y")], expected_length=1, checkpoint_key=None,
                          fence=Fence("s1", old), release=True)
    assert sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0) is None
    assert texts(sessions.load("s1")) == ["x"]
    # b's token, release=True: released, and a may take it with a greater token
    store.commit_turn("s1", [], expected_length=1, checkpoint_key=None,
                      fence=Fence("s1", new), release=True)
    newer = sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    assert newer is not None and newer > new
    # b's token still "holds" nothing now: a stale release cannot free a's lease
    with pytest.raises(LeaseLostError):
        store.commit_turn("s1", [], expected_length=1, checkpoint_key=None,
                          fence=Fence("s1", new), release=True)
    assert sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0) is None


# --- fencing ---------------------------------------------------------------------------------


def test_fence_tokens_strictly_increase_across_owners_and_a_reopen(kit: Kit, store: Any) -> None:
    kit.need("leases")
    sessions, a, b = store.sessions, make_owner(), make_owner()
    assert sessions.fence_token("s1") == 0
    tokens = [sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)]
    tokens.append(sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0))  # a again
    assert sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0) is None
    assert sessions.fence_token("s1") == tokens[-1]  # a failed attempt hands out nothing
    sessions.release_lease("s1", owner=a)
    assert sessions.fence_token("s1") == tokens[-1]  # a release keeps the token
    tokens.append(sessions.acquire_lease("s1", owner=b, ttl_s=0.05, wait_s=0))
    tokens.append(sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=TIMEOUT))  # expiry
    sessions.release_lease("s1", owner=a)
    assert sessions.acquire_lease("s2", owner=a, ttl_s=600, wait_s=0) == 1  # its own count
    with kit.reopened() as again:
        assert again.sessions.fence_token("s1") == tokens[-1]
        tokens.append(again.sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0))
        again.sessions.release_lease("s1", owner=b)
    assert tokens[0] >= 1
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(set(tokens)), tokens  # strictly increasing
    assert sessions.fence_token("s1") == tokens[-1]


def test_lease_held_reads_the_lease_without_changing_it_or_its_token(
    kit: Kit, store: Any
) -> None:
    kit.need("leases")
    sessions, a = store.sessions, make_owner()
    if not isinstance(sessions, LeaseQuery):
        pytest.skip(f"{kit.name}: its lease has no read-only query (abort_turn probes it)")
    assert sessions.lease_held("s1") is False
    token = sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    with kit.reopened() as again:  # as another process sees it
        assert again.sessions.lease_held("s1") is True
        if hasattr(again, "fence_token"):  # a combined store forwarding its lease methods
            assert again.lease_held("s1") is True
        assert again.sessions.fence_token("s1") == token
    assert sessions.renew_lease("s1", owner=a, ttl_s=600)  # still a's
    sessions.release_lease("s1", owner=a)
    assert sessions.lease_held("s1") is False
    assert sessions.fence_token("s1") == token
    assert sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0) == token + 1


def _take_over(store: Any) -> tuple[Fence, Fence]:
    """An old fence (a's, released) and the newest (b's, held) of session s1."""
    a, b = make_owner(), make_owner()
    old = store.sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    store.sessions.release_lease("s1", owner=a)
    new = store.sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0)
    return Fence("s1", old), Fence("s1", new)


def _fenced_writes(store: Any) -> dict[str, Callable[[Fence], object]]:
    """Every fenced write, each on the data _seed stored."""
    return {
        "sessions.save": lambda f: store.sessions.save("s1", [user("new")], fence=f),
        "sessions.append": lambda f: store.sessions.append(
            "s1", [user("c")], expected_length=2, fence=f),
        "checkpoints.save": lambda f: store.checkpoints.save(
            "s1.turn-2", checkpoint("s1.turn-2", turn_index=7), fence=f),
        "checkpoints.delete": lambda f: store.checkpoints.delete("s1.turn-2", fence=f),
        "approvals.create": lambda f: store.approvals.create(
            approval("a1", reason="new"), fence=f),
        "commit_turn": lambda f: store.commit_turn(
            "s1", [user("c")], expected_length=2, checkpoint_key="s1.turn-2", fence=f,
            release=f is not None),
    }


def _seed(store: Any) -> Callable[[], object]:
    """Store a transcript, a checkpoint and an approval; returns a snapshot function."""
    store.sessions.save("s1", [user("a"), assistant("b")])
    store.checkpoints.save("s1.turn-2", checkpoint("s1.turn-2"))
    store.approvals.create(approval("a1"))
    return lambda: (store.sessions.load("s1"), store.sessions.revision("s1"),
                    store.checkpoints.keys(""), store.checkpoints.load("s1.turn-2"),
                    store.approvals.get("a1"))


@pytest.mark.parametrize("write", list(_fenced_writes(None)))
def test_a_write_under_an_older_fence_is_refused_and_changes_nothing(
    kit: Kit, store: Any, write: str
) -> None:
    kit.need("fencing")
    snapshot = _seed(store)
    old, new = _take_over(store)
    before = snapshot()
    with pytest.raises(LeaseLostError) as info:
        _fenced_writes(store)[write](old)
    err = info.value
    assert err.code == "LOUSHO_LEASE_LOST" and err.session_id == "s1"
    text = str(err)
    assert "'s1'" in text and f"token {old.token}" in text and f"token {new.token}" in text
    assert "another process took over the turn" in text
    assert snapshot() == before
    assert store.sessions.fence_token("s1") == new.token
    # the holder's lease is untouched
    assert store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0) is None


@pytest.mark.parametrize("write", list(_fenced_writes(None)))
def test_a_write_under_the_newest_fence_or_none_succeeds(kit: Kit, store: Any, write: str) -> None:
    kit.need("fencing")
    for fence in ("newest", None):
        snapshot = _seed(store)
        _, new = _take_over(store)
        before = snapshot()
        _fenced_writes(store)[write](new if fence else None)  # type: ignore[arg-type]
        assert snapshot() != before, (write, fence)


def test_a_fence_of_another_session_is_refused(kit: Kit, store: Any) -> None:
    kit.need("fencing")
    token = store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0)
    with pytest.raises(ConfigError, match="fence"):
        store.sessions.append("s2", [user("x")], expected_length=0, fence=Fence("s1", token))
    with pytest.raises(ConfigError, match="fence"):
        store.checkpoints.save("s1.turn-0", checkpoint("s1.turn-0"), fence=Fence("s1", 0))
    assert store.sessions.load("s2") is None and store.checkpoints.keys("") == []


# --- checkpoints -----------------------------------------------------------------------------


def test_checkpoints_round_trip_and_keys(kit: Kit, store: Any) -> None:
    cps = store.checkpoints
    assert cps.load("s1.turn-0") is None
    assert cps.keys("") == []
    cp = Checkpoint(key="s1.turn-0", session_id="s1", run_id="r", turn_index=4,
                    input=MSGS[:1], recorded=MSGS[1:3], started_call_ids=("c2",),
                    queued_inputs=(Message("user", "more"),), pending_approval_ids=("a1",),
                    usage=Usage(3, 4, 0.5), status="awaiting-approval",
                    extra={"future_field": {"x": 1}})
    cps.save("s1.turn-0", cp)
    with kit.reopened() as again:
        assert again.checkpoints.load("s1.turn-0") == cp
    cps.save("s1.turn-0", checkpoint("s1.turn-0", status="interrupted"))
    loaded = cps.load("s1.turn-0")
    assert loaded is not None and loaded.status == "interrupted"
    for key in ("s1.turn-2", "s10.turn-0", "s2.turn-0", "s1"):
        cps.save(key, checkpoint(key))
    assert cps.keys("s1.") == ["s1.turn-0", "s1.turn-2"]
    assert cps.keys("s1") == ["s1", "s1.turn-0", "s1.turn-2", "s10.turn-0"]
    assert cps.keys("") == ["s1", "s1.turn-0", "s1.turn-2", "s10.turn-0", "s2.turn-0"]
    assert cps.keys("s1.turn-0.js") == []
    assert cps.keys("zz") == []
    cps.delete("s1.turn-0")
    cps.delete("s1.turn-0")
    cps.delete("not-there")
    assert cps.load("s1.turn-0") is None
    assert cps.keys("s1.") == ["s1.turn-2"]


def test_checkpoint_keys_may_be_any_text(kit: Kit, store: Any) -> None:
    kit.need("any checkpoint key")
    cps, cp = store.checkpoints, checkpoint("ü.turn-0")
    cps.save("s1.turn-0", checkpoint("s1.turn-0"))
    cps.save("ü.turn-0", cp)
    assert cps.keys("") == ["s1.turn-0", "ü.turn-0"]
    assert cps.keys("ü") == ["ü.turn-0"]
    assert cps.load("ü.turn-0") == cp


def test_checkpoint_unknown_fields_round_trip(kit: Kit, store: Any) -> None:
    kit.need("raw data")
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
    where = kit.checkpoint_location("s1.turn-0")
    assert where is not None
    assert where in str(info.value) and "s1.turn-0" in str(info.value)


# --- approvals -------------------------------------------------------------------------------


def test_approvals_create_get_list_resolve(kit: Kit, store: Any) -> None:
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
    with kit.reopened() as again:
        assert again.approvals.get("a1") == done
        assert again.approvals.get("ghost") is None
        assert [r.id for r in again.approvals.list_pending("s1")] == ["a0"]
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
    lock = threading.Lock()
    outcomes: list[object] = []

    def racer(i: int) -> None:
        barrier.wait(timeout=TIMEOUT)
        try:
            result: object = store.approvals.resolve("a1", approved=i % 2 == 0, reason=f"t{i}")
        except ApprovalAlreadyResolvedError as exc:
            result = exc
        with lock:
            outcomes.append(result)

    run_threads(racer, 8)
    winners = [o for o in outcomes if isinstance(o, ApprovalRecord)]
    losers = [o for o in outcomes if isinstance(o, ApprovalAlreadyResolvedError)]
    assert len(winners) == 1 and len(losers) == 7
    assert all(e.approval_id == "a1" for e in losers)
    assert store.approvals.get("a1") == winners[0]


# --- threads ---------------------------------------------------------------------------------


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

    run_threads(writer, 16)
    assert errors == []
    assert store.sessions.ids() == sorted(f"t{n}" for n in range(16))
    for n in range(16):
        assert texts(store.sessions.load(f"t{n}"))[0::2] == [f"{n}-{i}" for i in range(20)]
    assert len(store.checkpoints.keys("")) == 16 * 20


# --- close, prune ----------------------------------------------------------------------------


def test_use_after_close(kit: Kit) -> None:
    kit.need("close")
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
        assert kit.location is not None and kit.location in str(info.value)
    with kit.open() as again:
        assert texts(again.sessions.load("s1")) == ["a"]
    with pytest.raises(StoreClosedError):
        again.sessions.ids()


def test_prune_counts_and_keeps_pending(kit: Kit, store: Any) -> None:
    kit.need("prune", "raw data")
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
    kit.need("prune", "leases", "prune skips leased sessions", "raw data")
    store.sessions.save("busy", [user("a")])
    assert store.sessions.acquire_lease("busy", owner=make_owner(), ttl_s=600, wait_s=0)
    kit.age("session", "busy", 7200)
    assert store.prune(3600).sessions == 0
    assert store.sessions.ids() == ["busy"]


def test_prune_keeps_a_pending_approval_with_its_paused_turn(kit: Kit, store: Any) -> None:
    # a turn paused on an approval: prune keeps its checkpoint and its session, so the
    # approval can still be resolved and the turn finished
    kit.need("prune", "raw data")
    from lousho_sync import Step, tool

    @tool(needs_approval=True)
    def pay() -> str:
        """Pay."""
        return "paid"

    agent = create_agent(provider=ScriptedProvider([Step(tool_calls=[("pay", {})])],
                                                   default="done"), tools=[pay], store=store)
    paused = agent.session(id="pend").send("pay")
    assert paused.approval_id is not None
    keys = store.checkpoints.keys("pend.")
    assert len(keys) == 1
    store.sessions.save("idle", [user("old")])
    kit.age("checkpoint", keys[0], 7200)
    kit.age("session", "idle", 7200)
    if store.sessions.load("pend") is not None:
        kit.age("session", "pend", 7200)
    assert store.prune(3600).sessions == 1  # "idle" only
    assert store.checkpoints.keys("pend.") == keys
    assert agent.session(id="pend").pending() is not None
    result = agent.approvals.resolve(id=paused.approval_id, approved=True)
    assert result is not None and result.text == "done"
    assert [m.text for m in agent.session(id="pend").messages][0] == "pay"


# --- leases ----------------------------------------------------------------------------------


def test_lease_is_exclusive_until_released(kit: Kit, store: Any) -> None:
    kit.need("leases")
    a, b, c = make_owner(), make_owner(), make_owner()
    leases = store.sessions
    assert leases.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    assert leases.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)  # already ours
    assert not leases.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0.05)
    with kit.reopened() as other_store:  # another object: only the stored lease is shared
        other = other_store.sessions
        assert not other.acquire_lease("s1", owner=c, ttl_s=600, wait_s=0.05)
        assert leases.renew_lease("s1", owner=a, ttl_s=600)
        assert not leases.renew_lease("s1", owner=b, ttl_s=600)
        leases.release_lease("s1", owner=b)  # not the holder: nothing happens
        assert not other.acquire_lease("s1", owner=c, ttl_s=600, wait_s=0)
        leases.release_lease("s1", owner=a)
        assert not leases.renew_lease("s1", owner=a, ttl_s=600)
        assert other.acquire_lease("s1", owner=c, ttl_s=600, wait_s=0)
        assert not leases.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
        other.release_lease("s1", owner=c)
    assert leases.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0)
    leases.release_lease("s1", owner=b)


def test_the_store_itself_offers_the_lease(kit: Kit, store: Any) -> None:
    kit.need("leases", "store leases")
    a, b = make_owner(), make_owner()
    assert store.sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    assert not store.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0)
    store.sessions.release_lease("s1", owner=a)
    assert store.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0)
    assert not store.sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    assert store.renew_lease("s1", owner=b, ttl_s=600)
    store.release_lease("s1", owner=b)
    assert store.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)


def test_lease_ttl_must_be_positive(kit: Kit, store: Any) -> None:
    kit.need("leases", "ttl rule")
    owner = make_owner()
    with pytest.raises(ConfigError):
        store.sessions.acquire_lease("s1", owner=owner, ttl_s=0, wait_s=0)
    with pytest.raises(ConfigError):
        store.sessions.renew_lease("s1", owner=owner, ttl_s=-1)


def test_lease_waiter_gets_it_when_released(kit: Kit, store: Any) -> None:
    kit.need("leases")
    a, b = make_owner(), make_owner()
    assert store.sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    first = store.sessions.fence_token("s1")
    got: list[int | None] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        got.append(store.sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=TIMEOUT))

    t = threading.Thread(target=waiter)
    t.start()
    assert started.wait(timeout=TIMEOUT)
    store.sessions.release_lease("s1", owner=a)
    t.join(timeout=TIMEOUT)
    assert got == [first + 1]
    store.sessions.release_lease("s1", owner=b)


def test_short_lease_is_taken_over_when_it_expires(kit: Kit, store: Any) -> None:
    kit.need("leases")
    a, b = make_owner(), make_owner()
    assert store.sessions.acquire_lease("s1", owner=a, ttl_s=0.05, wait_s=0)
    assert store.sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=TIMEOUT)
    assert not store.sessions.renew_lease("s1", owner=a, ttl_s=600)
    store.sessions.release_lease("s1", owner=a)  # too late: not the holder any more
    assert not store.sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    store.sessions.release_lease("s1", owner=b)


# --- through an agent ------------------------------------------------------------------------


def test_a_new_agent_over_the_same_store_sees_the_history(kit: Kit, store: Any) -> None:
    provider = ScriptedProvider(default=lambda r: f"{len(list(r.messages))} messages seen")
    create_agent(provider=provider, store=store).session(id="u").send("hello")
    with kit.reopened() as again_store:
        again = create_agent(provider=provider, store=again_store).session(id="u")
        assert [m.text for m in again.messages] == ["hello", "1 messages seen"]
        assert again.send("and now?").text == "3 messages seen"


# --- a stopped holder across real processes --------------------------------------------------

CHILD_FENCED_TURN = """
import sys
from lousho_sync.errors import LeaseLostError
from lousho_sync.messages import Message
from lousho_sync.records import Checkpoint, Fence
from lousho_sync.stores._lease import make_owner
kind, where, prefix = sys.argv[1:4]
encrypted = kind.startswith("encrypted-")
kind = kind.removeprefix("encrypted-")
if kind == "sqlite":
    from lousho_sync.sqlite import SqliteStore
    store = SqliteStore(where)
elif kind == "postgres":
    from lousho_sync.postgres import PostgresStore
    store = PostgresStore(where, schema=prefix)
else:
    from lousho_sync.redis import RedisStore
    store = RedisStore(where, prefix=prefix)
if encrypted:
    import os
    from lousho_sync.stores.encrypted import EncryptedStore
    store = EncryptedStore(store, keys=[os.environ["LOUSHO_TEST_ENCRYPTION_KEY"]])
token = store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=0.5, wait_s=10)
fence = Fence("s1", token)
store.checkpoints.save("s1.turn-0", Checkpoint(key="s1.turn-0", session_id="s1", run_id="A"),
                       fence=fence)
print(token, flush=True)
sys.stdin.readline()  # the parent stops us here, takes over, commits, continues us
for what, write in [
    ("checkpoint", lambda: store.checkpoints.save(
        "s1.turn-0", Checkpoint(key="s1.turn-0", session_id="s1", run_id="A2"), fence=fence)),
    ("commit", lambda: store.commit_turn(
        "s1", [Message("user", "A's turn")], expected_length=0, checkpoint_key="s1.turn-0",
        fence=fence, release=True)),
]:
    try:
        write()
        print(what, "written", flush=True)
    except LeaseLostError as exc:
        print(what, "refused", exc.session_id, exc.code, flush=True)
"""


def test_a_stopped_holder_past_its_ttl_cannot_commit_after_the_new_owner(
    kit: Kit, store: Any
) -> None:
    """Process A takes the lease (ttl 0.5 s) and is stopped (SIGSTOP); this process (B)
    takes over once it expires and commits the turn; A, continued, has every write refused:
    the transcript holds B's turn only."""
    kit.need("fencing")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_FENCED_TURN, *kit.child_argv()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = read_line(child)
        assert first.isdigit(), first + (child.stderr.read() if child.stderr else "")
        held = int(first)
        os.kill(child.pid, signal.SIGSTOP)
        try:
            token = store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=600,
                                                 wait_s=TIMEOUT)  # polls until A's expires
            assert token is not None and token > held
            assert store.checkpoints.load("s1.turn-0").run_id == "A"  # A's, left for B
            store.commit_turn("s1", [user("B's turn")], expected_length=0,
                              checkpoint_key="s1.turn-0", fence=Fence("s1", token), release=True)
        finally:
            os.kill(child.pid, signal.SIGCONT)
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=TIMEOUT)
        assert child.returncode == 0, err
        assert out.splitlines() == [
            "checkpoint refused s1 LOUSHO_LEASE_LOST",
            "commit refused s1 LOUSHO_LEASE_LOST",
        ]
        assert texts(store.sessions.load("s1")) == ["B's turn"]
        assert store.checkpoints.keys("s1.") == []
        assert store.sessions.fence_token("s1") == token
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=TIMEOUT)
