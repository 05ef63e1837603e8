"""One contract suite for every built-in store: the same behaviour, parametrized."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lousho_sync import (
    AgentStore,
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    ApprovalRecord,
    Checkpoint,
    FileSessionStore,
    FileStorage,
    ImagePart,
    LocalStorageCheckpointStore,
    Message,
    ScriptedProvider,
    StorageServiceApprovalStore,
    StoreConflictError,
    TextPart,
    ToolCall,
    Usage,
    create_agent,
    memory_store,
)
from lousho_sync.stores._lease import make_owner

KINDS = ["memory", "files", "sqlite"]
if os.environ.get("LOUSHO_TEST_REDIS_URL"):
    KINDS.append("redis")


def _make(kind: str, root: Path) -> Any:
    if kind == "memory":
        return memory_store()
    if kind == "files":
        storage = FileStorage(root / "state")
        return AgentStore(sessions=FileSessionStore(root / "sessions"),
                          checkpoints=LocalStorageCheckpointStore(storage),
                          approvals=StorageServiceApprovalStore(storage))
    if kind == "sqlite":
        from lousho_sync.sqlite import SqliteStore

        return SqliteStore(root / "agent.db")
    from lousho_sync.redis import RedisStore

    return RedisStore(os.environ["LOUSHO_TEST_REDIS_URL"], prefix=f"contract:{root.name}:")


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    s = _make(request.param, tmp_path)
    yield s
    close = getattr(s, "close", None)
    if close is not None:
        close()


def _reopen(store: Any, tmp_path: Path) -> Any:
    """The same data through a new store object (memory stores cannot be reopened)."""
    if isinstance(store, AgentStore) and isinstance(store.sessions, FileSessionStore):
        return _make("files", tmp_path)
    name = type(store).__name__
    if name == "SqliteStore":
        return _make("sqlite", tmp_path)
    if name == "RedisStore":
        return _make("redis", tmp_path)
    return store


MSGS = [
    Message("user", (TextPart("look"), ImagePart(data=bytes(range(256)), media_type="image/png"))),
    Message("assistant", "", tool_calls=(ToolCall("c1", "f", {"x": [1, {"y": None}]}),),
            usage=Usage(5, 6, 0.25)),
    Message("tool", "result", tool_call_id="c1", is_error=True),
    Message("assistant", "done", usage=Usage(1, 2), metadata={"k": "v"}),
]


# --- sessions --------------------------------------------------------------------------------
def test_sessions_round_trip_byte_for_byte(store: Any, tmp_path: Path) -> None:
    s = store.sessions
    assert s.load("nobody") is None
    s.save("a", MSGS)
    again = _reopen(store, tmp_path).sessions
    assert again.load("a") == MSGS
    assert again.load("a")[0].content[1].data == bytes(range(256))


def test_saving_empty_stores_nothing_and_delete_forgets(store: Any) -> None:
    s = store.sessions
    s.save("a", MSGS)
    s.save("a", [])
    assert s.load("a") is None
    s.save("b", MSGS[:1])
    s.delete("b")
    s.delete("b")
    assert s.load("b") is None
    assert "a" not in s.ids() and "b" not in s.ids()


def test_append_checks_the_expected_length(store: Any) -> None:
    s = store.sessions
    s.append("a", MSGS[:2], expected_length=0)
    s.append("a", MSGS[2:], expected_length=2)
    assert s.load("a") == MSGS
    with pytest.raises(StoreConflictError) as info:
        s.append("a", MSGS[:1], expected_length=2)
    assert info.value.code == "LOUSHO_STORE_CONFLICT"
    assert info.value.expected_length == 2 and info.value.actual_length == 4
    assert s.load("a") == MSGS


def test_revision_changes_on_every_write(store: Any) -> None:
    s = store.sessions
    seen = {s.revision("a")}
    s.save("a", MSGS[:1])
    seen.add(s.revision("a"))
    s.append("a", MSGS[1:2], expected_length=1)
    seen.add(s.revision("a"))
    s.save("a", MSGS[:1])
    seen.add(s.revision("a"))
    assert len(seen) == 4
    assert sorted(s.ids()) == ["a"]


# --- checkpoints -------------------------------------------------------------------------------
def test_checkpoints_round_trip_and_keys_by_prefix(store: Any, tmp_path: Path) -> None:
    c = store.checkpoints
    cp = Checkpoint(key="s.turn-4", session_id="s", run_id="r", turn_index=4,
                    input=MSGS[:1], recorded=MSGS[1:3], started_call_ids=("c2",),
                    queued_inputs=(Message("user", "more"),), pending_approval_ids=("a1",),
                    usage=Usage(3, 4, 0.5), status="awaiting-approval",
                    extra={"future_field": {"x": 1}})
    c.save("s.turn-4", cp)
    c.save("s.turn-5", cp)
    c.save("t.turn-0", cp)
    loaded = _reopen(store, tmp_path).checkpoints.load("s.turn-4")
    assert loaded == cp
    assert c.keys("s.") == ["s.turn-4", "s.turn-5"]
    c.delete("s.turn-4")
    c.delete("s.turn-4")
    assert c.load("s.turn-4") is None and c.keys("s.") == ["s.turn-5"]


# --- approvals --------------------------------------------------------------------------------
def _record(id: str, session: str = "s", at: float = 1.0) -> ApprovalRecord:
    return ApprovalRecord(id=id, session_id=session, checkpoint_key=f"{session}.turn-0",
                          call=ToolCall(f"call-{id}", "transfer", {"amount": 5}), created_at=at)


def test_approvals_resolve_once(store: Any, tmp_path: Path) -> None:
    a = store.approvals
    a.create(_record("a1", at=2.0))
    a.create(_record("a2", at=1.0))
    a.create(_record("a3", session="other", at=3.0))
    assert [r.id for r in a.list_pending()] == ["a2", "a1", "a3"]
    assert [r.id for r in a.list_pending("s")] == ["a2", "a1"]
    won = a.resolve("a1", approved=False, reason="too much")
    assert won.status == "denied" and won.reason == "too much" and won.resolved_at
    with pytest.raises(ApprovalAlreadyResolvedError):
        a.resolve("a1", approved=True)
    with pytest.raises(ApprovalNotFoundError):
        a.resolve("missing", approved=True)
    again = _reopen(store, tmp_path).approvals
    got = again.get("a1")
    assert got is not None and got.status == "denied" and got.call == _record("a1").call
    assert again.get("missing") is None
    assert [r.id for r in again.list_pending("s")] == ["a2"]


# --- leases ---
def test_leases_where_offered(store: Any) -> None:
    s = store.sessions
    if not hasattr(s, "acquire_lease"):
        pytest.skip(f"{type(s).__name__} keeps no lease (one process only)")
    me, other = make_owner(), make_owner()
    assert s.acquire_lease("a", owner=me, ttl_s=30, wait_s=0)
    assert s.acquire_lease("a", owner=me, ttl_s=30, wait_s=0)  # re-entrant for its owner
    assert not s.acquire_lease("a", owner=other, ttl_s=30, wait_s=0.05)
    assert s.renew_lease("a", owner=me, ttl_s=30)
    s.release_lease("a", owner=other)  # not the holder: nothing happens
    assert not s.acquire_lease("a", owner=other, ttl_s=30, wait_s=0)
    s.release_lease("a", owner=me)
    assert s.acquire_lease("a", owner=other, ttl_s=30, wait_s=0)
    s.release_lease("a", owner=other)


# --- through an agent ---
def test_a_new_agent_over_the_same_store_sees_the_history(
    store: Any, tmp_path: Path
) -> None:
    provider = ScriptedProvider(default=lambda r: f"{len(list(r.messages))} messages seen")
    create_agent(provider=provider, store=store).session(id="u").send("hello")
    again = create_agent(provider=provider, store=_reopen(store, tmp_path)).session(id="u")
    assert [m.text for m in again.messages] == ["hello", "1 messages seen"]
    assert again.send("and now?").text == "3 messages seen"
