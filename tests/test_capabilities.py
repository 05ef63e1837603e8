"""Declared store capabilities: an EncryptedStore offers exactly its inner store's, a store
written before the record existed still works (its record is derived once), and the
encrypted mailbox keeps no plain input in the inner store."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from lousho_sync import (
    AgentStore,
    ConfigError,
    EncryptedStore,
    ScriptedProvider,
    StoreCapabilities,
    StoreConflictError,
    UnsupportedCapabilityError,
    create_agent,
    memory_store,
)
from lousho_sync.messages import Message
from lousho_sync.sqlite import SqliteStore
from lousho_sync.stores.base import capabilities_of, turn_committer
from lousho_sync.stores.memory import MemoryCheckpointStore

KEY = EncryptedStore.generate_key()


def test_encrypted_store_over_memory_offers_no_lease_commit_prune_or_events() -> None:
    enc = EncryptedStore(memory_store(), keys=[KEY])
    assert enc.capabilities == memory_store().capabilities
    assert enc.capabilities.names() == ("append", "revision", "catalog", "mailbox")
    assert enc.sessions is not None and enc.sessions.capabilities == enc.capabilities
    for owner, name, capability in [
        (enc.sessions, "acquire_lease", "lease"), (enc.sessions, "renew_lease", "lease"),
        (enc, "acquire_lease", "lease"), (enc, "commit_turn", "commit_turn"),
        (enc, "prune", "prune"), (enc.sessions, "event_ops", "events"),
    ]:
        assert not hasattr(owner, name), name
        with pytest.raises(UnsupportedCapabilityError) as info:
            getattr(owner, name)()
        assert info.value.capability == capability and info.value.code == (
            "LOUSHO_UNSUPPORTED_CAPABILITY")
        assert isinstance(info.value, ConfigError)
        text = str(info.value)
        assert f"{name}()" in text and repr(capability) in text
        assert "MemorySessionStore" in text or "AgentStore" in text
    assert turn_committer(enc) is None and turn_committer(enc.sessions) is None
    assert enc.sessions.mail_ops() is enc.sessions.mail_ops()  # offered: works
    enc.sessions.append("s", [Message("user", "hi")], expected_length=0)
    assert [m.text for m in enc.sessions.load("s") or []] == ["hi"]


def test_encrypted_store_over_sqlite_offers_everything_sqlite_does(tmp_path: Path) -> None:
    inner = SqliteStore(tmp_path / "a.db")
    with EncryptedStore(inner, keys=[KEY]) as enc:
        assert enc.capabilities == inner.capabilities
        assert set(enc.capabilities.names()) == {
            "lease", "lease_query", "fencing", "append", "revision", "commit_turn", "catalog",
            "prune", "events", "mailbox"}
        assert enc.sessions is not None and enc.checkpoints is not None
        assert enc.sessions.capabilities == inner.sessions.capabilities
        assert enc.checkpoints.capabilities == StoreCapabilities(fencing=True)
        assert turn_committer(enc.sessions) is enc and type(enc) is EncryptedStore
        assert type(enc.sessions).__name__ == "EncryptedSessionStore"  # no per-store class


class _Legacy:
    """A session store written for an earlier release: no ``capabilities``, a lease,
    append and revision by its methods alone."""

    def __init__(self) -> None:
        self.data: dict[str, list[Message]] = {}
        self.leases: dict[str, str] = {}
        self.tokens = 0
        self.lock = threading.Lock()
        self.taken: list[str] = []

    def load(self, id: str) -> list[Message] | None:
        return list(self.data[id]) if id in self.data else None

    def save(self, id: str, messages: Sequence[Message]) -> None:
        self.data[id] = list(messages)

    def delete(self, id: str) -> None:
        self.data.pop(id, None)

    def append(self, id: str, messages: Sequence[Message], *, expected_length: int) -> None:
        with self.lock:
            have = self.data.setdefault(id, [])
            if len(have) != expected_length:
                raise StoreConflictError(f"{id}: {len(have)} != {expected_length}")
            have.extend(messages)

    def revision(self, id: str) -> object:
        return len(self.data.get(id, ())) or None

    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> int | None:
        with self.lock:
            if self.leases.get(id, owner) != owner:
                return None
            self.leases[id] = owner
            self.tokens += 1
            self.taken.append(id)
            return self.tokens

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        return self.leases.get(id) == owner

    def release_lease(self, id: str, *, owner: str) -> None:
        with self.lock:
            if self.leases.get(id) == owner:
                del self.leases[id]


def test_a_store_without_capabilities_still_works_its_record_derived_once() -> None:
    legacy = _Legacy()
    caps = capabilities_of(legacy)
    assert caps == StoreCapabilities(lease=True, append=True, revision=True)
    assert capabilities_of(legacy) is caps  # derived once per store object
    store = AgentStore(sessions=legacy, checkpoints=MemoryCheckpointStore())
    assert capabilities_of(store).names() == ("lease", "append", "revision")
    agent = create_agent(provider=ScriptedProvider(["one", "two"]), store=store)
    session = agent.session(id="s")
    assert session.send("a").text == "one" and session.send("b").text == "two"
    assert [m.text for m in legacy.data["s"]] == ["a", "one", "b", "two"]
    assert legacy.taken == ["s", "s"] and legacy.leases == {}  # each turn took the lease
    with pytest.raises(UnsupportedCapabilityError, match="catalog") as info:
        session.set_metadata({"t": 1})
    assert info.value.capability == "catalog"
    enc = EncryptedStore(store, keys=[KEY])  # and over it, EncryptedStore offers the same
    assert enc.capabilities == capabilities_of(store)
    assert enc.sessions is not None and not hasattr(enc.sessions, "info")
    assert not hasattr(enc.sessions, "fence_token")  # the legacy lease hands out no token
    assert not hasattr(enc.sessions, "lease_held") and not hasattr(enc, "lease_held")


def test_the_encrypted_mailbox_keeps_no_plain_input_and_drops_a_changed_mail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with EncryptedStore(SqliteStore(tmp_path / "m.db"), keys=[KEY]) as enc:
        assert enc.sessions is not None
        ops = enc.sessions.mail_ops()
        assert enc.sessions.mail_ops() is ops  # one per store object (one watcher)
        ops.post("s", "m1", "queue", '[{"role": "user", "text": "SECRET-INPUT"}]', 1.0)
        ops.post("s", "m2", "abort", '{"reason": "SECRET-REASON", "turn_id": null}', 2.0)
        db = sqlite3.connect(tmp_path / "m.db")
        rows = db.execute("SELECT mail_id, kind, data FROM lousho_mail ORDER BY seq").fetchall()
        assert [r[:2] for r in rows] == [("m1", "queue"), ("m2", "abort")]
        assert not any("SECRET" in r[2] for r in rows)
        # a queued input turned into an abort (its plain kind changed) does not open
        db.execute("UPDATE lousho_mail SET kind = 'abort' WHERE mail_id = 'm1'")
        db.commit()
        db.close()
        taken = ops.take(["s"])
        assert [(m.mail_id, m.kind, m.data) for m in taken] == [
            ("m2", "abort", '{"reason": "SECRET-REASON", "turn_id": null}')]
        assert "dropped mail 'm1' of session 's'" in caplog.text
        assert ops.take(["s"]) == []


def test_encrypted_store_still_refuses_a_store_without_parts() -> None:
    with pytest.raises(ConfigError, match="sessions/checkpoints/approvals"):
        EncryptedStore(object(), keys=[KEY])
