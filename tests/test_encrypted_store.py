"""EncryptedStore: what reaches the inner store is ciphertext, key rotation, the errors for a
wrong or missing key, tampering and records moved between sessions, and the store without
the ``crypto`` extra. (The store contract suite runs over it too: the ``encrypted-…`` kits
of test_store_contract.py.)"""

from __future__ import annotations

import base64
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import approval, assistant, checkpoint, texts, user

from lousho_sync import (
    ConfigError,
    EncryptedStore,
    Message,
    ScriptedProvider,
    Step,
    StoreCorruptError,
    StoreDecryptError,
    StoreError,
    ToolCall,
    create_agent,
    memory_store,
    tool,
)
from lousho_sync.catalog import MAX_METADATA_BYTES
from lousho_sync.errors import InvalidMetadataError
from lousho_sync.sqlite import SqliteStore
from lousho_sync.stores.base import supports_catalog, supports_lease, turn_committer
from lousho_sync.stores.encrypted import MARK, MAX_PLAIN_METADATA, key_id

K1, K2, K3 = (EncryptedStore.generate_key() for _ in range(3))
SECRETS = ("tell nobody: zebra-42", "moonlight-sonata", "card 4111-1111", "because-orchid",
           "assistant says platypus")


def _open(path: Path, *keys: str | bytes) -> Any:
    return EncryptedStore(SqliteStore(path), keys=list(keys))


def _sql(path: Path, text: str, *params: object) -> list[Any]:
    with sqlite3.connect(path, isolation_level=None, timeout=10) as conn:
        return conn.execute(text, params).fetchall()


def _disk(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def _message_row(path: Path, id: str, index: int) -> tuple[int, str]:
    rows = _sql(path, "SELECT id, json FROM messages WHERE id = ? + 4294967296 *"
                " (SELECT key FROM sessions WHERE id = ?)", index, id)
    return rows[0][0], rows[0][1]


def _flip_a_byte(token: str) -> str:
    raw = bytearray(base64.b64decode(token))
    raw[-20] ^= 0x01  # a byte of the ciphertext (the tag is the last 16)
    return base64.b64encode(bytes(raw)).decode()


# --- what is stored ----------------------------------------------------------------------------


def test_the_sqlite_file_holds_no_plaintext(tmp_path: Path) -> None:
    """A turn, a paused turn (checkpoint and approval record), a resolved approval with a
    reason: none of their text is in the database file or its WAL."""
    db = tmp_path / "enc.db"

    @tool(needs_approval=True)
    def pay(card: str) -> str:
        """Pay with a card."""
        return f"paid with {card}"

    provider = ScriptedProvider(
        [Step(text=SECRETS[4]), Step(tool_calls=[("pay", {"card": SECRETS[2]})])],
        default="done",
    )
    with _open(db, K1) as store:
        agent = create_agent(provider=provider, tools=[pay], store=store)
        session = agent.session(id="s1")
        assert session.send(SECRETS[0]).text == SECRETS[4]
        paused = session.send(SECRETS[1])
        assert paused.approval_id is not None
        assert store.checkpoints.keys("s1.")  # the paused turn's checkpoint
        disk = _disk(db)
        for secret in SECRETS[:3] + SECRETS[4:]:
            assert secret.encode() not in disk, secret
        result = agent.approvals.resolve(id=paused.approval_id, approved=True,
                                         reason=SECRETS[3])
        assert result is not None and result.text == "done"
        got = store.approvals.get(paused.approval_id)
        assert got is not None and got.reason == SECRETS[3] and got.status == "approved"
        assert got.call.arguments == {"card": SECRETS[2]}
    disk = _disk(db)
    for secret in SECRETS:
        assert secret.encode() not in disk, secret
        assert base64.b64encode(secret.encode()) not in disk
    # ids, counts, times and statuses stay plain: the inner store works on them
    assert _sql(db, "SELECT id, length FROM sessions") == [("s1", 6)]
    assert _sql(db, "SELECT status FROM approvals") == [("approved",)]
    with _open(db, K1) as again:
        again_session = create_agent(provider=provider, tools=[pay], store=again).session(
            id="s1")
        assert again_session.messages[0].text == SECRETS[0]
        assert again_session.messages[-1].text == "done"


def test_the_envelopes_the_inner_store_keeps() -> None:
    inner = memory_store()
    store = EncryptedStore(inner, keys=[K1])
    store.sessions.save("s1", [user("secret"), Message("assistant", "x", tool_calls=(
        ToolCall("c1", "f", {"a": 1}),))])
    envelopes = inner.sessions.load("s1")
    assert [m.role for m in envelopes] == ["user", "assistant"]  # the role stays plain
    assert all(m.content == "" and set(m.metadata) == {MARK} and not m.tool_calls
               for m in envelopes)
    token = base64.b64decode(envelopes[0].metadata[MARK])
    assert token[0] == 1 and token[1:9].hex() == key_id(K1) == store.key_ids[0]
    nonces = {base64.b64decode(m.metadata[MARK])[9:21] for m in envelopes}
    assert len(nonces) == 2
    store.sessions.set_metadata("s1", {"title": "secret title"})
    assert set(inner.sessions.info("s1").metadata) == {MARK}
    assert store.sessions.info("s1").metadata == {"title": "secret title"}
    assert K1 not in repr(store) and key_id(K1) in repr(store)


def test_metadata_must_fit_the_limit_once_encrypted() -> None:
    store = EncryptedStore(memory_store(), keys=[K1])
    room = MAX_PLAIN_METADATA - len('{"t":""}')
    store.sessions.set_metadata("a", {"t": "x" * room})  # exactly the largest that fits
    assert store.sessions.info("a").metadata == {"t": "x" * room}
    with pytest.raises(InvalidMetadataError) as info:
        store.sessions.set_metadata("a", {"t": "x" * (room + 1)})
    text = str(info.value)
    assert "'a'" in text and f"at most {MAX_PLAIN_METADATA} bytes" in text
    assert str(MAX_METADATA_BYTES) in text and info.value.session_id == "a"
    assert store.sessions.info("a").metadata == {"t": "x" * room}  # the old one kept
    with pytest.raises(InvalidMetadataError):
        store.sessions.create("b", [user("x")], metadata={"t": "x" * (room + 1)})
    assert store.sessions.info("b") is None


def test_capabilities_follow_the_inner_store(tmp_path: Path) -> None:
    over_memory = EncryptedStore(memory_store(), keys=[K1])
    assert supports_catalog(over_memory.sessions)
    assert not supports_lease(over_memory.sessions) and turn_committer(over_memory) is None
    assert not hasattr(over_memory, "close") and not hasattr(over_memory, "prune")
    with over_memory as same:  # `with` works, there is nothing to close
        assert same is over_memory
    with _open(tmp_path / "a.db", K1) as over_sqlite:
        assert supports_lease(over_sqlite.sessions) and supports_lease(over_sqlite)
        assert turn_committer(over_sqlite.sessions) is over_sqlite
        assert over_sqlite.sessions.fenced and over_sqlite.checkpoints.fenced
        assert isinstance(over_sqlite, EncryptedStore)
        assert over_sqlite.inner.path == str(tmp_path / "a.db")


# --- keys --------------------------------------------------------------------------------------


def test_key_rotation_encrypts_with_the_first_and_decrypts_with_any(tmp_path: Path) -> None:
    db = tmp_path / "enc.db"
    cp = checkpoint("s1.turn-1")
    with _open(db, K1) as old:
        old.sessions.save("s1", [user("written under k1")])
        old.checkpoints.save("s1.turn-1", cp)
        old.approvals.create(approval("a1"))
    with _open(db, K2, K1) as rotated:  # the new key first, the old one kept
        assert texts(rotated.sessions.load("s1")) == ["written under k1"]
        assert rotated.checkpoints.load("s1.turn-1") == cp
        rotated.sessions.append("s1", [assistant("written under k2")], expected_length=1)
        rotated.sessions.save("s2", [user("all k2")])
        rotated.approvals.resolve("a1", approved=False, reason="no")
        assert texts(rotated.sessions.load("s1")) == ["written under k1", "written under k2"]
    with _open(db, K2) as new_only:
        assert texts(new_only.sessions.load("s2")) == ["all k2"]
        with pytest.raises(StoreDecryptError) as info:
            new_only.sessions.load("s1")  # message 0 is still under k1
        assert "message 0 of session 's1'" in str(info.value)
        assert key_id(K1) in str(info.value) and key_id(K2) in str(info.value)
        new_only.sessions.save("s1", [user("re-encrypted")])  # a rewrite moves it to k2
        assert texts(new_only.sessions.load("s1")) == ["re-encrypted"]


def test_a_wrong_key_names_the_store_and_the_record(tmp_path: Path) -> None:
    db = tmp_path / "enc.db"
    with _open(db, K1) as store:
        store.sessions.save("s1", [user("a"), assistant("b")])
        store.checkpoints.save("s1.turn-2", checkpoint("s1.turn-2"))
        store.approvals.create(approval("a1"))
    with _open(db, K3) as wrong:
        cases = [
            (lambda: wrong.sessions.load("s1"), "message 0 of session 's1'", "s1"),
            (lambda: wrong.checkpoints.load("s1.turn-2"), "checkpoint 's1.turn-2'", "s1"),
            (lambda: wrong.approvals.get("a1"), "approval 'a1'", "s1"),
            (lambda: wrong.approvals.list_pending(), "approval 'a1'", "s1"),
        ]
        for call, record, sid in cases:
            with pytest.raises(StoreDecryptError) as info:
                call()
            err = info.value
            text = str(err)
            assert record in text and str(db) in text and "SqliteStore" in text, text
            assert f"encrypted with key {key_id(K1)}" in text and "keys=[" in text
            assert err.code == "LOUSHO_STORE_DECRYPT" and isinstance(err, StoreError)
            assert (err.path, err.session_id, err.record) == (str(db), sid, record)
            assert K1 not in text and K3 not in text
        # the data is left as it was: the right key still reads it
        assert wrong.sessions.ids() == ["s1"] and wrong.checkpoints.keys("") == ["s1.turn-2"]
    with _open(db, K1) as right:
        assert texts(right.sessions.load("s1")) == ["a", "b"]


def test_bad_keys_are_refused_without_showing_them() -> None:
    inner = memory_store()
    with pytest.raises(ConfigError, match="at least one key"):
        EncryptedStore(inner, keys=[])
    with pytest.raises(ConfigError, match="a list of keys"):
        EncryptedStore(inner, keys=K1)  # type: ignore[arg-type]
    short = base64.urlsafe_b64encode(b"k" * 16).decode()
    with pytest.raises(ConfigError, match=r"keys\[1\] is 16 bytes") as info:
        EncryptedStore(inner, keys=[K1, short])
    assert short not in str(info.value) and K1 not in str(info.value)
    with pytest.raises(ConfigError, match=r"keys\[0\] is not urlsafe base64"):
        EncryptedStore(inner, keys=["not base64 !!"])
    with pytest.raises(ConfigError, match="must be 32 bytes"):
        EncryptedStore(inner, keys=[12345])  # type: ignore[list-item]
    raw = base64.urlsafe_b64decode(K1)
    store = EncryptedStore(inner, keys=[raw])  # bytes and their base64 are the same key
    store.sessions.save("s", [user("x")])
    assert texts(EncryptedStore(inner, keys=[K1]).sessions.load("s")) == ["x"]
    assert store.key_ids == (key_id(K1),)


def test_without_cryptography_import_works_and_the_store_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['cryptography'] = None\n"
        "import lousho_sync\n"
        "from lousho_sync import ConfigError, EncryptedStore, memory_store\n"
        "key = EncryptedStore.generate_key()\n"
        "try:\n"
        "    EncryptedStore(memory_store(), keys=[key])\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "pip install 'lousho[crypto]'" in out


# --- tampering ---------------------------------------------------------------------------------


def test_one_changed_byte_of_a_stored_ciphertext_is_detected(tmp_path: Path) -> None:
    db = tmp_path / "enc.db"
    with _open(db, K1) as store:
        store.sessions.save("s1", [user("a"), assistant("b")])
        store.checkpoints.save("s1.turn-2", checkpoint("s1.turn-2"))
        store.approvals.create(approval("a1"))
        rowid, text = _message_row(db, "s1", 1)
        doc = json.loads(text)
        doc["metadata"][MARK] = _flip_a_byte(doc["metadata"][MARK])
        _sql(db, "UPDATE messages SET json = ? WHERE id = ?", json.dumps(doc), rowid)
        with pytest.raises(StoreDecryptError) as info:
            store.sessions.load("s1")
        assert "message 1 of session 's1'" in str(info.value)
        assert "fails authentication" in str(info.value)
        for table, column, key in [("checkpoints", "key", "s1.turn-2"),
                                   ("approvals", "id", "a1")]:
            (text,) = _sql(db, f"SELECT json FROM {table} WHERE {column} = ?", key)[0]
            doc = json.loads(text)
            doc[MARK] = _flip_a_byte(doc[MARK])
            _sql(db, f"UPDATE {table} SET json = ? WHERE {column} = ?", json.dumps(doc), key)
        with pytest.raises(StoreDecryptError, match=r"checkpoint 's1.turn-2'.*fails auth"):
            store.checkpoints.load("s1.turn-2")
        with pytest.raises(StoreDecryptError, match=r"approval 'a1'.*fails auth"):
            store.approvals.get("a1")


def test_records_moved_between_sessions_or_positions_are_detected(tmp_path: Path) -> None:
    db = tmp_path / "enc.db"
    with _open(db, K1) as store:
        store.sessions.save("alice", [user("alice 0"), assistant("alice 1")])
        store.sessions.save("bob", [user("bob 0"), assistant("bob 1")])
        _, alices = _message_row(db, "alice", 0)
        bob_row, _ = _message_row(db, "bob", 0)
        _sql(db, "UPDATE messages SET json = ? WHERE id = ?", alices, bob_row)
        with pytest.raises(StoreDecryptError) as info:
            store.sessions.load("bob")
        assert "message 0 of session 'bob'" in str(info.value)
        assert info.value.session_id == "bob"
        # within one session: message 0 and 1 swapped
        a0, t0 = _message_row(db, "alice", 0)
        a1, t1 = _message_row(db, "alice", 1)
        _sql(db, "UPDATE messages SET json = ? WHERE id = ?", t1, a0)
        _sql(db, "UPDATE messages SET json = ? WHERE id = ?", t0, a1)
        with pytest.raises(StoreDecryptError):
            store.sessions.load("alice")
        # checkpoints and approvals are bound to their key / id
        store.checkpoints.save("alice.turn-0", checkpoint("alice.turn-0"))
        store.checkpoints.save("bob.turn-0", checkpoint("bob.turn-0"))
        _sql(db, "UPDATE checkpoints SET json = (SELECT json FROM checkpoints WHERE key ="
             " 'alice.turn-0') WHERE key = 'bob.turn-0'")
        with pytest.raises(StoreDecryptError, match=r"checkpoint 'bob.turn-0'"):
            store.checkpoints.load("bob.turn-0")
        store.approvals.create(approval("a1"))
        store.approvals.create(approval("a2"))
        _sql(db, "UPDATE approvals SET json = (SELECT json FROM approvals WHERE id = 'a1')"
             " WHERE id = 'a2'")
        with pytest.raises(StoreDecryptError, match="approval 'a2'"):
            store.approvals.get("a2")


def test_swapped_history_rows_are_detected(tmp_path: Path) -> None:
    db = tmp_path / "enc.db"
    with _open(db, K1) as store:
        store.sessions.save("s", [user("q0"), assistant("a0")])
        store.sessions.compact("s", [user("summary 1")],
                               replaced=[user("q0"), assistant("a0")])
        store.sessions.append("s", [user("q1"), assistant("a1")], expected_length=1)
        store.sessions.compact("s", [user("summary 2")],
                               replaced=[user("summary 1"), user("q1"), assistant("a1")])
        assert texts(store.sessions.history("s")) == ["q0", "a0", "summary 1", "q1", "a1"]
        rows = _sql(db, "SELECT id, json FROM history ORDER BY id")
        assert len(rows) == 5
        for i, j in ((0, 1), (1, 3)):  # within one compaction, and across two
            (ri, ti), (rj, tj) = rows[i], rows[j]
            _sql(db, "UPDATE history SET json = ? WHERE id = ?", tj, ri)
            _sql(db, "UPDATE history SET json = ? WHERE id = ?", ti, rj)
            with pytest.raises(StoreDecryptError, match=f"history message {i} of session 's'"):
                store.sessions.history("s")
            _sql(db, "UPDATE history SET json = ? WHERE id = ?", ti, ri)
            _sql(db, "UPDATE history SET json = ? WHERE id = ?", tj, rj)
        assert texts(store.sessions.history("s")) == ["q0", "a0", "summary 1", "q1", "a1"]


def test_history_written_before_positions_were_bound_is_still_read(tmp_path: Path) -> None:
    from lousho_sync.codec import dumps_message
    from lousho_sync.stores.encrypted import Keyring, record_aad

    def legacy(m: Message) -> Message:  # how earlier releases sealed a history message
        token = Keyring([K1]).seal(dumps_message(m).encode(), record_aad("history", "s"))
        return Message(m.role, "", metadata={MARK: token})

    with _open(tmp_path / "enc.db", K1) as store:
        store.sessions.save("s", [user("q0")])
        store.inner.sessions.compact("s", store.inner.sessions.load("s"),
                                     replaced=[legacy(user("old 0")), legacy(user("old 1"))])
        store.sessions.compact("s", [user("summary")], replaced=[user("q0")])
        assert texts(store.sessions.history("s")) == ["old 0", "old 1", "q0"]


def test_an_approval_status_changed_in_the_inner_store_is_detected(tmp_path: Path) -> None:
    db = tmp_path / "enc.db"
    with _open(db, K1) as store:
        store.approvals.create(approval("a1"))
        _sql(db, "UPDATE approvals SET status = 'approved', resolved_at = 1 WHERE id = 'a1'")
        with pytest.raises(StoreDecryptError, match="the reason of approval 'a1'"):
            store.approvals.get("a1")
        store.approvals.create(approval("a2"))
        store.approvals.resolve("a2", approved=False, reason="too much")
        _sql(db, "UPDATE approvals SET status = 'approved' WHERE id = 'a2'")
        with pytest.raises(StoreDecryptError):
            store.approvals.get("a2")
        _sql(db, "UPDATE approvals SET status = 'denied' WHERE id = 'a2'")
        got = store.approvals.get("a2")
        assert got is not None and (got.status, got.reason) == ("denied", "too much")


def test_an_approval_hidden_by_a_changed_status_makes_every_reader_raise(
    tmp_path: Path,
) -> None:
    # a turn paused on an approval; the inner store's plain status is changed from
    # "pending": list() raises the same error as get() and resolve(), it does not say []
    @tool(needs_approval=True)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    db = tmp_path / "enc.db"
    with _open(db, K1) as store:
        agent = create_agent(
            provider=ScriptedProvider([Step(tool_calls=[("pay", {"amount": 5})])],
                                      default="ok"), tools=[pay], store=store)
        paused = agent.session(id="s").send("pay")
        aid = paused.approval_id
        assert [r.id for r in agent.approvals.list()] == [aid]
        _sql(db, "UPDATE approvals SET status = 'approved', resolved_at = 1 WHERE id = ?", aid)
        readers = {
            "list": lambda: agent.approvals.list(),
            "list of the session": lambda: agent.approvals.list("s"),
            "page": lambda: agent.approvals.page(),
            "get": lambda: agent.approvals.get(aid),
            "resolve": lambda: agent.approvals.resolve(id=aid, approved=True),
        }
        messages = set()
        for name, read in readers.items():
            with pytest.raises(StoreDecryptError) as info:
                read()
            messages.add(str(info.value))
            assert info.value.session_id == "s", name
        assert len(messages) == 1, messages
        assert f"the reason of approval {aid!r} (status 'approved')" in messages.pop()
        assert agent.approvals.list("other") == []  # another session's list is not affected


def test_plaintext_records_are_refused_not_read_as_garbage(tmp_path: Path) -> None:
    db = tmp_path / "enc.db"
    with SqliteStore(db) as plain:
        plain.sessions.save("s1", [user("plain")])
        plain.checkpoints.save("s1.turn-1", checkpoint("s1.turn-1"))
    with _open(db, K1) as store:
        with pytest.raises(StoreDecryptError,
                           match=r"message 0 of session 's1'.*not encrypted"):
            store.sessions.load("s1")
        with pytest.raises(StoreDecryptError, match="not encrypted"):
            store.checkpoints.load("s1.turn-1")
    inner = memory_store()
    inner.sessions.set_metadata("m", {"title": "plain"})
    with pytest.raises(StoreDecryptError, match="metadata of session 'm'"):
        EncryptedStore(inner, keys=[K1]).sessions.info("m")


def test_a_decrypted_record_that_is_not_json_is_a_corrupt_record(tmp_path: Path) -> None:
    db = tmp_path / "enc.db"
    with _open(db, K1) as store:
        store.checkpoints.save("s1.turn-0", checkpoint("s1.turn-0"))
        (text,) = _sql(db, "SELECT json FROM checkpoints")[0]
        doc = json.loads(text)
        from lousho_sync.stores.encrypted import record_aad

        doc[MARK] = store.keyring.seal(b"[broken", record_aad("checkpoint", "s1.turn-0"))
        _sql(db, "UPDATE checkpoints SET json = ?", json.dumps(doc))
        with pytest.raises(StoreCorruptError) as info:
            store.checkpoints.load("s1.turn-0")
        assert "checkpoint 's1.turn-0'" in str(info.value) and str(db) in str(info.value)
        assert not isinstance(info.value, StoreDecryptError)


# --- the mark: a store written through EncryptedStore refuses plain access ----------------------


@pytest.fixture(params=["sqlite", "files", "redis", "postgres"])
def plain_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A function opening a new plain store object of the kind on the same place."""
    if request.param == "sqlite":
        return lambda: SqliteStore(tmp_path / "e.db")
    if request.param == "files":
        from lousho_sync.stores.files import FileStore

        return lambda: FileStore(tmp_path / "store")
    if request.param == "redis":
        from lousho_sync.redis import RedisStore

        url, prefix = (request.getfixturevalue(n) for n in ("redis_url", "redis_prefix"))
        return lambda: RedisStore(url, prefix=prefix)
    from lousho_sync.postgres import PostgresStore

    url, schema = (request.getfixturevalue(n) for n in ("postgres_url", "postgres_schema"))
    return lambda: PostgresStore(url, schema=schema)


def test_a_store_written_through_encrypted_store_refuses_plain_reads_and_writes(
    plain_opener: Any,
) -> None:
    from lousho_sync import StoreEncryptedError

    encrypted = EncryptedStore(plain_opener(), keys=[K1])
    create_agent(provider=ScriptedProvider(default="secret answer"), store=encrypted
                 ).session(id="u1").send("secret question")
    plain = plain_opener()
    agent = create_agent(provider=ScriptedProvider(default="plain"), store=plain)
    calls = [
        lambda: agent.session(id="u1").messages,
        lambda: agent.session(id="u1").send("plaintext now"),
        lambda: agent.session(id="u2").send("a new session in the same store"),
        lambda: plain.sessions.load("u1"),
        lambda: plain.sessions.ids(),
        lambda: plain.approvals.list_pending(),
        lambda: plain.checkpoints.load("u1.turn-0"),
    ]
    for call in calls:
        with pytest.raises(StoreEncryptedError, match="written through EncryptedStore") as e:
            call()
        assert e.value.code == "LOUSHO_STORE_ENCRYPTED"
    # nothing was written: the encrypted session is as it was
    again = EncryptedStore(plain_opener(), keys=[K1])
    assert texts(again.sessions.load("u1")) == ["secret question", "secret answer"]
    assert again.sessions.load("u2") is None
