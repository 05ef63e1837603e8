"""The primitives contract: every backend's primitives (docs/architecture.md, "Writing a
store"), called directly, return the documented outcome — on memory, files, SQLite, Redis
and PostgreSQL. The rules over them are tested once in ``test_store_engine.py``.

The file store writes only the lease primitives (its checkpoints and approvals are the
StorageService stores, which keep their own code; it has no commit_turn)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from conftest import approval, checkpoint, user

from lousho_sync.codec import dumps_approval, dumps_checkpoint, dumps_message, loads_approval
from lousho_sync.stores._engine.approvals import ApprovalOps
from lousho_sync.stores._engine.backend import text_of
from lousho_sync.stores._engine.checkpoints import CheckpointOps
from lousho_sync.stores._engine.commits import CommitOp, CommitOps, Conflict, Stale
from lousho_sync.stores._engine.leases import LeaseOps
from lousho_sync.stores._lease import make_owner
from lousho_sync.stores._memory_ops import (
    MemoryApprovals,
    MemoryCheckpoints,
    MemoryCommits,
    MemoryLeases,
    MemoryState,
)
from lousho_sync.stores.files import FileStore


@attrs.define
class Primitives:
    """One backend's primitives (None: the backend does not write that kind)."""

    name: str
    leases: LeaseOps
    checkpoints: CheckpointOps | None = None
    approvals: ApprovalOps | None = None
    commits: CommitOps | None = None
    takes_over: bool = True  # False: the OS lock of a dead holder is free (files)


def _of(name: str, store: Any) -> Primitives:
    return Primitives(name, store.sessions._leases, store.checkpoints._ops,
                      store.approvals._ops, store.sessions._commits)


@pytest.fixture(params=["memory", "files", "sqlite", "redis", "postgres"])
def ops(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Primitives]:
    kind = request.param
    if kind == "memory":
        state = MemoryState()
        yield Primitives(kind, MemoryLeases(state), MemoryCheckpoints(state),
                         MemoryApprovals(state), MemoryCommits(state))
        return
    if kind == "files":
        yield Primitives(kind, FileStore(tmp_path).sessions._leases, takes_over=False)
        return
    store: Any
    if kind == "sqlite":
        from lousho_sync.sqlite import SqliteStore

        store = SqliteStore(str(tmp_path / "s.db"))
    elif kind == "redis":
        from lousho_sync.redis import RedisStore

        store = RedisStore(request.getfixturevalue("redis_url"),
                           prefix=request.getfixturevalue("redis_prefix"))
    else:
        from lousho_sync.postgres import PostgresStore

        store = PostgresStore(request.getfixturevalue("postgres_url"),
                              schema=request.getfixturevalue("postgres_schema"))
    try:
        yield _of(kind, store)
    finally:
        store.close()


def need(part: object, ops: Primitives) -> Any:
    if part is None:
        pytest.skip(f"{ops.name}: no such primitives (its own store code)")
    return part


def two_tokens(ops: Primitives, id: str) -> None:
    """Hand out tokens 1 and 2 for ``id`` (the lease then free)."""
    a = make_owner()
    assert ops.leases.take(id, a, 30.0) == 1
    assert ops.leases.take(id, a, 30.0) == 2
    ops.leases.release(id, a)


# --- leases ----------------------------------------------------------------------------------


def test_lease_take_renew_release_newest_holder(ops: Primitives) -> None:
    leases = ops.leases
    a, b = make_owner(), make_owner()
    assert (leases.newest("s1"), leases.holder("s1")) == (0, "")
    assert leases.take("s1", a, 30.0) == 1
    assert leases.take("s1", a, 30.0) == 2  # its owner again: a new token
    assert leases.take("s1", b, 30.0) == a  # held: the holder, nothing handed out
    assert (leases.newest("s1"), leases.holder("s1")) == (2, a)
    assert leases.renew("s1", a, 30.0) is True
    assert leases.renew("s1", b, 30.0) is False
    assert leases.release("s1", b) is None  # not b's: nothing happens
    assert leases.holder("s1") == a
    leases.release("s1", a)
    assert (leases.newest("s1"), leases.holder("s1")) == (2, "")
    assert leases.renew("s1", a, 30.0) is False
    assert leases.take("s1", b, 30.0) == 3
    assert leases.newest("s2") == 0


def test_lease_take_over_only_from_the_named_holder(ops: Primitives) -> None:
    leases = ops.leases
    a, b, c = make_owner(), make_owner(), make_owner()
    assert leases.take("s1", a, 30.0) == 1
    assert leases.take_over("s1", b, c, 30.0) == 0  # b does not hold it
    assert leases.holder("s1") == a
    if not ops.takes_over:
        assert leases.take_over("s1", a, c, 30.0) == 0
        return
    assert leases.take_over("s1", a, c, 30.0) == 2
    assert (leases.newest("s1"), leases.holder("s1")) == (2, c)
    assert leases.renew("s1", a, 30.0) is False


# --- checkpoints -----------------------------------------------------------------------------


def test_checkpoint_get_put_drop_keys(ops: Primitives) -> None:
    cps: CheckpointOps = need(ops.checkpoints, ops)
    first, second = checkpoint("s1.turn-0"), checkpoint("s1.turn-2", turn_index=2)
    assert cps.get("s1.turn-0") is None
    assert cps.put("s1.turn-2", "s1", dumps_checkpoint(second), None, 0, second) == 0
    assert cps.put("s1.turn-0", "s1", dumps_checkpoint(first), None, 0, first) == 0
    assert cps.put("s10.turn-0", "s10", dumps_checkpoint(first), None, 0, first) == 0
    assert text_of(cps.get("s1.turn-0")) == dumps_checkpoint(first)
    assert cps.keys("s1.") == ["s1.turn-0", "s1.turn-2"]
    assert cps.drop("s1.turn-0", None, 0) == 0
    assert cps.drop("s1.turn-0", None, 0) == 0  # absent: no error
    assert cps.get("s1.turn-0") is None
    assert cps.keys("s1.") == ["s1.turn-2"]


def test_checkpoint_writes_under_a_stale_token_return_the_newest(ops: Primitives) -> None:
    cps: CheckpointOps = need(ops.checkpoints, ops)
    two_tokens(ops, "s1")
    old, new = checkpoint("s1.turn-0"), checkpoint("s1.turn-0", turn_index=5)
    assert cps.put("s1.turn-0", "s1", dumps_checkpoint(old), "s1", 2, old) == 0
    assert cps.put("s1.turn-0", "s1", dumps_checkpoint(new), "s1", 1, new) == 2
    assert cps.drop("s1.turn-0", "s1", 1) == 2
    assert text_of(cps.get("s1.turn-0")) == dumps_checkpoint(old)  # nothing written
    assert cps.drop("s1.turn-0", "s1", 2) == 0
    assert cps.get("s1.turn-0") is None


# --- approvals -------------------------------------------------------------------------------


def test_approval_put_row_resolve_pending(ops: Primitives) -> None:
    aps: ApprovalOps = need(ops.approvals, ops)
    records = [approval("late", created_at=3.0), approval("early", created_at=1.0),
               approval("other", session_id="s2", created_at=2.0)]
    for r in records:
        assert aps.put(r, dumps_approval(r), None, None, 0) == 0
    row = aps.row("early")
    assert row is not None
    assert [text_of(row[0]), text_of(row[1]), row[2], row[3]] == [
        dumps_approval(records[1]), "pending", None, None]
    assert aps.row("nope") is None
    at = time.time()
    done = aps.resolve("early", "approved", "ok", at, "bob")
    assert done is not None and not isinstance(done, str)
    assert [text_of(done[1]), text_of(done[2])] == ["approved", "ok"]
    assert float(text_of(done[3])) == pytest.approx(at)
    assert loads_approval(text_of(done[0])).resolved_by == "bob"
    assert aps.resolve("early", "denied", None, at, None) == "approved"  # once
    assert aps.resolve("nope", "denied", None, at, None) is None
    assert [id for id, _ in aps.pending(None)] == ["other", "late"]
    assert "late" in [id for id, _ in aps.pending("s1")]
    assert "early" not in [id for id, _ in aps.pending("s1")]


def test_approval_put_under_a_stale_token_returns_the_newest(ops: Primitives) -> None:
    aps: ApprovalOps = need(ops.approvals, ops)
    two_tokens(ops, "s1")
    record = approval("a1")
    assert aps.put(record, dumps_approval(record), None, "s1", 1) == 2
    assert aps.row("a1") is None
    assert aps.put(record, dumps_approval(record), None, "s1", 2) == 0
    assert aps.row("a1") is not None


# --- commits ---------------------------------------------------------------------------------


def test_commit_outcomes_committed_conflict_stale(ops: Primitives) -> None:
    commits: CommitOps = need(ops.commits, ops)
    cps: CheckpointOps = need(ops.checkpoints, ops)
    texts = [dumps_message(user("a")), dumps_message(user("b"))]
    first = commits.commit(CommitOp("s1", texts, 0, None, 0, False))
    assert not isinstance(first, Conflict | Stale)
    assert commits.commit(CommitOp("s1", texts, 0, None, 0, False)) == Conflict(2)
    owner = make_owner()
    token = ops.leases.take("s1", owner, 30.0)
    assert token == 1
    cp = checkpoint("s1.turn-2", turn_index=2)
    cps.put("s1.turn-2", "s1", dumps_checkpoint(cp), "s1", 1, cp)
    assert ops.leases.take("s1", owner, 30.0) == 2
    late = CommitOp("s1", texts, 2, "s1.turn-2", 1, True)
    assert commits.commit(late) == Stale(2)
    assert cps.get("s1.turn-2") is not None and ops.leases.holder("s1") == owner
    done = commits.commit(CommitOp("s1", texts, 2, "s1.turn-2", 2, True))
    assert not isinstance(done, Conflict | Stale) and done != first
    assert cps.get("s1.turn-2") is None
    assert ops.leases.holder("s1") == ""  # released with the commit
    assert commits.commit(CommitOp("s1", [], 3, None, 0, False)) == Conflict(4)
