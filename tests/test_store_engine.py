"""The store engine's rules (``lousho_sync/stores/_engine``), tested once against the memory
primitives (``stores/_memory_ops``), the engine's test double: the lease (argument checks,
polling, dead-owner takeover, fence tokens), the fence check of every write and its
LeaseLostError, the commit outcomes, resolve-once, the checkpoint codec and the wrapping of
damaged data. What each backend's primitives return is tested in
``test_store_primitives.py``; the stores as a whole in ``test_store_contract.py``."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from typing import Any

import pytest
from conftest import approval, checkpoint, texts, user, wait

from lousho_sync.codec import dumps_checkpoint
from lousho_sync.errors import (
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    ConfigError,
    InvalidSessionIdError,
    LeaseLostError,
    StoreConflictError,
    StoreCorruptError,
)
from lousho_sync.records import Checkpoint, Fence
from lousho_sync.stores._engine.approvals import ApprovalRules
from lousho_sync.stores._engine.checkpoints import CheckpointRules
from lousho_sync.stores._engine.commits import AppendRules, CommitRules
from lousho_sync.stores._engine.leases import LeaseRules
from lousho_sync.stores._lease import HOST, make_owner
from lousho_sync.stores._memory_ops import (
    MemoryApprovals,
    MemoryCheckpoints,
    MemoryCommits,
    MemoryLeases,
    MemoryState,
)

JOIN = 60.0  # seconds: the longest a test waits for a thread


class Engine(LeaseRules, CheckpointRules, CommitRules, AppendRules):
    """Sessions, leases and checkpoints through the rules, over one memory state."""

    def __init__(self, state: MemoryState, *, keeps_objects: bool = False) -> None:
        self._leases = MemoryLeases(state)
        self._ops = MemoryCheckpoints(state, keeps_objects=keeps_objects)
        self._commits = MemoryCommits(state, keeps_objects=keeps_objects)


class Approvals(ApprovalRules):
    def __init__(self, state: MemoryState) -> None:
        self._ops = MemoryApprovals(state)


@pytest.fixture
def state() -> MemoryState:
    return MemoryState()


@pytest.fixture
def engine(state: MemoryState) -> Engine:
    return Engine(state)


@pytest.fixture
def approvals(state: MemoryState) -> Approvals:
    return Approvals(state)


def dead_owner() -> str:
    """The owner string of a process of this host that has exited."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True, timeout=JOIN)
    return f"{HOST}:{int(child.stdout)}:gone"


# --- the lease -------------------------------------------------------------------------------


def test_every_acquisition_hands_out_a_greater_token(engine: Engine) -> None:
    a = make_owner()
    assert engine.acquire_lease("s1", owner=a, ttl_s=30, wait_s=0) == 1
    assert engine.acquire_lease("s1", owner=a, ttl_s=30, wait_s=0) == 2  # again by its owner
    assert engine.fence_token("s1") == 2
    assert engine.lease_held("s1")
    engine.release_lease("s1", owner=a)
    assert not engine.lease_held("s1")
    assert engine.fence_token("s1") == 2  # the token stays
    assert engine.acquire_lease("s1", owner=make_owner(), ttl_s=30, wait_s=0) == 3
    assert engine.fence_token("other") == 0


def test_a_live_holder_keeps_the_others_out_until_it_expires(
        engine: Engine, state: MemoryState) -> None:
    a, b = make_owner(), make_owner()
    assert engine.acquire_lease("s1", owner=a, ttl_s=30, wait_s=0) == 1
    assert engine.acquire_lease("s1", owner=b, ttl_s=30, wait_s=0) is None
    assert engine.renew_lease("s1", owner=a, ttl_s=30)
    assert not engine.renew_lease("s1", owner=b, ttl_s=30)
    state.leases["s1"].expires_at = 0.0  # a's lease ran out without renewal
    assert not engine.lease_held("s1")
    assert engine.acquire_lease("s1", owner=b, ttl_s=30, wait_s=0) == 2
    assert not engine.renew_lease("s1", owner=a, ttl_s=30)  # a lost it
    engine.release_lease("s1", owner=a)  # not a's: nothing happens
    assert engine.lease_held("s1")


def test_acquire_polls_until_the_holder_releases(engine: Engine, state: MemoryState) -> None:
    a, b = make_owner(), make_owner()
    engine.acquire_lease("s1", owner=a, ttl_s=30, wait_s=0)
    refused = threading.Event()
    take = MemoryLeases.take

    def counting_take(self: MemoryLeases, id: str, owner: str, ttl_s: float) -> int | str:
        out = take(self, id, owner, ttl_s)
        if isinstance(out, str):
            refused.set()
        return out

    engine._leases.take = counting_take.__get__(engine._leases)  # type: ignore[method-assign]
    got: list[int | None] = []
    waiter = threading.Thread(
        target=lambda: got.append(engine.acquire_lease("s1", owner=b, ttl_s=30, wait_s=JOIN)))
    waiter.start()
    wait(refused, "a refused attempt")
    engine.release_lease("s1", owner=a)
    waiter.join(JOIN)
    assert got == [2]


def test_the_lease_of_a_dead_owner_is_taken_over_at_once(
        engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    dead = dead_owner()
    assert engine.acquire_lease("s1", owner=dead, ttl_s=3600, wait_s=0) == 1
    assert engine.lease_held("s1") is False  # a dead holder holds nothing
    with caplog.at_level(logging.INFO, logger="lousho_sync.stores"):
        assert engine.acquire_lease("s1", owner=make_owner(), ttl_s=30, wait_s=0) == 2
    assert f"took over the lease of dead owner {dead}" in caplog.text
    # a live owner of another host is never taken over before it expires
    engine.acquire_lease("s2", owner="elsewhere:1:x", ttl_s=3600, wait_s=0)
    assert engine.acquire_lease("s2", owner=make_owner(), ttl_s=30, wait_s=0) is None


@pytest.mark.parametrize(("kw", "error"), [
    ({"owner": ""}, ConfigError),
    ({"ttl_s": 0}, ConfigError),
    ({"id": "bad id"}, InvalidSessionIdError),
])
def test_lease_arguments_are_checked(engine: Engine, kw: dict[str, Any],
                                     error: type[Exception]) -> None:
    args: dict[str, Any] = {"id": "s1", "owner": make_owner(), "ttl_s": 30.0}
    args.update(kw)
    with pytest.raises(error):
        engine.acquire_lease(args["id"], owner=args["owner"], ttl_s=args["ttl_s"], wait_s=0)
    if "ttl_s" not in kw:
        with pytest.raises(error):
            engine.release_lease(args["id"], owner=args["owner"])
    assert engine.fence_token("s1") == 0  # nothing handed out


# --- fenced writes ---------------------------------------------------------------------------


def test_a_write_under_a_stale_token_is_refused_and_writes_nothing(
        engine: Engine, approvals: Approvals) -> None:
    old = engine.acquire_lease("s1", owner=make_owner(), ttl_s=30, wait_s=0)
    assert old == 1
    engine.save("s1.turn-0", checkpoint("s1.turn-0"), fence=Fence("s1", 1))
    assert engine.acquire_lease("s1", owner=make_owner(), ttl_s=30, wait_s=0) is None
    engine._leases.state.leases["s1"].expires_at = 0.0
    assert engine.acquire_lease("s1", owner=make_owner(), ttl_s=30, wait_s=0) == 2
    stale = Fence("s1", 1)
    writes = [
        lambda: engine.save("s1.turn-0", checkpoint("s1.turn-0", turn_index=9), fence=stale),
        lambda: engine.delete("s1.turn-0", fence=stale),
        lambda: approvals.create(approval("a1"), fence=stale),
        lambda: engine.append("s1", [user("late")], expected_length=0, fence=stale),
        lambda: engine.commit_turn("s1", [user("late")], expected_length=0,
                                   checkpoint_key="s1.turn-0", fence=stale, release=True),
    ]
    for write in writes:
        with pytest.raises(LeaseLostError) as err:
            write()
        assert str(err.value) == (
            "write to session 's1' in the memory store refused: it was made under lease "
            "token 1, but token 2 was handed out since: another process took over the turn")
        assert err.value.session_id == "s1"
    loaded = engine.load("s1.turn-0")
    assert loaded is not None and loaded.turn_index == 0
    assert approvals.get("a1") is None
    assert engine.lease_held("s1")  # the stale commit released nothing
    # the current token writes
    engine.save("s1.turn-0", checkpoint("s1.turn-0", turn_index=9), fence=Fence("s1", 2))
    approvals.create(approval("a1"), fence=Fence("s1", 2))


@pytest.mark.parametrize("fence", [Fence("s2", 1), Fence("s1", 0)])
def test_a_fence_of_another_session_or_without_a_token_is_refused(
        engine: Engine, fence: Fence) -> None:
    with pytest.raises(ConfigError, match="a fence is a Fence of the same session"):
        engine.save("s1.turn-0", checkpoint("s1.turn-0"), fence=fence)
    assert engine.keys("") == []


# --- commits ---------------------------------------------------------------------------------


def test_a_commit_appends_drops_the_checkpoint_and_releases_the_lease(
        engine: Engine, state: MemoryState) -> None:
    token = engine.acquire_lease("s1", owner=make_owner(), ttl_s=30, wait_s=0)
    assert token == 1
    engine.save("s1.turn-0", checkpoint("s1.turn-0"), fence=Fence("s1", 1))
    revision = engine.commit_turn("s1", [user("a"), user("b")], expected_length=0,
                                  checkpoint_key="s1.turn-0", fence=Fence("s1", 1),
                                  release=True)
    assert revision is not None and revision == state.revisions["s1"]
    assert texts(state.transcripts["s1"]) == ["a", "b"]
    assert engine.keys("s1.") == []
    assert not engine.lease_held("s1")
    engine.append("s1", [user("c")], expected_length=2)
    assert texts(state.transcripts["s1"]) == ["a", "b", "c"]


def test_a_commit_against_another_length_conflicts_and_writes_nothing(
        engine: Engine, state: MemoryState) -> None:
    engine.append("s1", [user("a")], expected_length=0)
    engine.save("s1.turn-0", checkpoint("s1.turn-0"))
    with pytest.raises(StoreConflictError) as err:
        engine.commit_turn("s1", [user("b")], expected_length=0, checkpoint_key="s1.turn-0")
    assert (err.value.expected_length, err.value.actual_length) == (0, 1)
    assert "session 's1' in the memory store holds 1 messages, expected 0" in str(err.value)
    with pytest.raises(StoreConflictError):
        engine.append("s1", [user("b")], expected_length=3)
    assert texts(state.transcripts["s1"]) == ["a"]
    assert engine.keys("") == ["s1.turn-0"]


def test_release_needs_the_fence_of_the_lease(engine: Engine) -> None:
    with pytest.raises(ConfigError, match="needs the fence"):
        engine.commit_turn("s1", [user("a")], expected_length=0, checkpoint_key=None,
                           release=True)


# --- approvals -------------------------------------------------------------------------------


def test_an_approval_is_resolved_once(approvals: Approvals) -> None:
    approvals.create(approval("a1"))
    done = approvals.resolve("a1", approved=True, reason="ok", by="alice")
    assert (done.status, done.reason, done.resolved_by) == ("approved", "ok", "alice")
    assert done.resolved_at is not None
    assert approvals.get("a1") == done
    with pytest.raises(ApprovalAlreadyResolvedError, match="approval 'a1' was already approved"):
        approvals.resolve("a1", approved=False)
    with pytest.raises(ApprovalNotFoundError, match="no approval has id 'nope'"):
        approvals.resolve("nope", approved=True)
    assert approvals.get("nope") is None


def test_one_of_many_racing_resolvers_wins(approvals: Approvals) -> None:
    approvals.create(approval("a1"))
    start = threading.Barrier(8)
    outcomes: list[str] = []

    def race(i: int) -> None:
        start.wait(JOIN)
        try:
            approvals.resolve("a1", approved=i % 2 == 0, by=f"r{i}")
            outcomes.append("won")
        except ApprovalAlreadyResolvedError:
            outcomes.append("lost")

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN)
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]


def test_pending_approvals_oldest_first_per_session(approvals: Approvals) -> None:
    approvals.create(approval("late", created_at=3.0))
    approvals.create(approval("early", created_at=1.0))
    approvals.create(approval("other", session_id="s2", created_at=2.0))
    approvals.create(approval("done", status="denied", reason="no"))
    assert [r.id for r in approvals.list_pending()] == ["early", "other", "late"]
    assert [r.id for r in approvals.list_pending("s1")] == ["early", "late"]
    denied = approvals.get("done")
    assert denied is not None and denied.resolved_at is not None  # stamped when created


# --- the codec and damaged data --------------------------------------------------------------


def test_a_checkpoint_round_trips_with_unknown_fields(engine: Engine) -> None:
    saved = checkpoint("s1.turn-0", recorded=(user("hi"),), extra={"future": [1, 2]})
    engine.save("s1.turn-0", saved)
    assert engine.load("s1.turn-0") == saved
    assert engine.load("s1.turn-9") is None
    engine.delete("s1.turn-0")
    engine.delete("s1.turn-0")  # absent: no error
    assert engine.load("s1.turn-0") is None


def test_primitives_keeping_objects_get_them_without_json_and_hand_out_no_shared_state(
        state: MemoryState) -> None:
    engine = Engine(state, keeps_objects=True)
    def made() -> Checkpoint:
        return checkpoint("s1.turn-0", created_at=1.0, updated_at=1.0,
                          recorded=(user("hi"),), extra={"future": {"n": [1]}})

    saved = made()
    engine.save("s1.turn-0", saved)
    assert state.checkpoints["s1.turn-0"] is saved  # kept as it is: no JSON made
    assert engine._ops.get("s1.turn-0") == dumps_checkpoint(saved)  # the text on request
    loaded = engine.load("s1.turn-0")
    assert loaded == saved
    assert loaded is not None
    loaded.extra["future"]["n"].append(2)  # type: ignore[index]
    assert engine.load("s1.turn-0") == made()  # the kept one did not change
    plain = checkpoint("s1.turn-1")
    engine.save("s1.turn-1", plain)
    assert engine.load("s1.turn-1") == plain
    messages = [user("a"), user("b")]
    engine.commit_turn("s1", messages, expected_length=0, checkpoint_key="s1.turn-0")
    assert state.transcripts["s1"] == messages
    assert engine.keys("s1.") == ["s1.turn-1"]
    state.checkpoints["s1.turn-1"] = '{"key": '  # text, as the text primitives keep it
    with pytest.raises(StoreCorruptError, match=r"checkpoint 's1\.turn-1' in the memory store"):
        engine.load("s1.turn-1")


def test_damaged_records_raise_store_corrupt_unchained(
        engine: Engine, approvals: Approvals, state: MemoryState) -> None:
    state.checkpoints["s1.turn-0"] = '{"key": '
    with pytest.raises(StoreCorruptError) as err:
        engine.load("s1.turn-0")
    assert str(err.value).startswith(
        "checkpoint 's1.turn-0' in the memory store cannot be read (it was left as it was)")
    assert err.value.__cause__ is None and err.value.__context__ is None
    assert state.checkpoints["s1.turn-0"] == '{"key": '  # left as it was
    approvals.create(approval("a1"))
    state.approvals["a1"][1] = "maybe"
    with pytest.raises(StoreCorruptError, match=r"approval 'a1' in the memory store cannot be "
                                                r"read .*unknown status 'maybe'"):
        approvals.get("a1")
