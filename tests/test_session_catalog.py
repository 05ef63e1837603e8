"""The session catalog on every built-in store (the same tests, parametrized by the kits of
test_store_contract.py): ``list`` pages newest first without loading transcripts, ``info``,
per-session metadata, the history compaction keeps, and ``create``."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import test_store_contract as contract
from conftest import assistant, texts, user
from test_store_contract import Kit, run_threads

from lousho_sync.catalog import LIST_LIMIT_MAX, MAX_METADATA_BYTES, SessionInfo
from lousho_sync.errors import (
    ConfigError,
    InvalidMetadataError,
    LeaseLostError,
    SessionExistsError,
)
from lousho_sync.messages import Message, ToolCall
from lousho_sync.results import PruneResult
from lousho_sync.stores._lease import make_owner
from lousho_sync.stores.base import Catalogued, Fence, supports_catalog

kit = contract.kit  # the fixtures: one kit per store kind, and its store
store = contract.store


def listed(store: Any, **kw: Any) -> list[str]:
    """The ids of one list() page."""
    return [i.id for i in store.sessions.list(**kw)]


def every_id(store: Any, limit: int, **kw: Any) -> list[str]:
    """All ids, page after page of ``limit``."""
    out: list[str] = []
    after = None
    while True:
        page = store.sessions.list(limit=limit, after=after, **kw)
        assert len(page) <= limit
        out += [i.id for i in page]
        if page.next is None:
            return out
        assert len(page) == limit
        after = page.next


def test_every_store_keeps_a_catalog(store: Any) -> None:
    assert supports_catalog(store.sessions)
    assert isinstance(store.sessions, Catalogued)


def test_info_counts_and_times_without_a_transcript(kit: Kit, store: Any) -> None:
    sessions = store.sessions
    assert sessions.info("nobody") is None
    sessions.save("a", [user("hi"), assistant("hello")])
    first = sessions.info("a")
    assert isinstance(first, SessionInfo)
    assert (first.id, first.messages, first.metadata, first.title) == ("a", 2, {}, None)
    assert 0 < first.created_at <= first.updated_at
    sessions.append("a", [user("more")], expected_length=2)
    with kit.reopened() as again:
        later = again.sessions.info("a")
    assert later.messages == 3
    assert later.created_at == first.created_at
    assert later.updated_at > first.updated_at


def test_list_is_newest_first_and_follows_every_change(store: Any) -> None:
    sessions = store.sessions
    for id in ("z", "y", "x"):  # written in this order: x is the newest
        sessions.save(id, [user(id)])
    assert listed(store) == ["x", "y", "z"]
    sessions.append("z", [assistant("again")], expected_length=1)
    assert listed(store) == ["z", "x", "y"]
    sessions.set_metadata("y", {"title": "Why"})
    assert listed(store) == ["y", "z", "x"]
    sessions.compact("x", [user("summary")], replaced=[user("x")])
    assert listed(store) == ["x", "y", "z"]
    page = sessions.list()
    assert [(i.id, i.messages, i.title) for i in page] == [
        ("x", 1, None), ("y", 1, "Why"), ("z", 2, None)]
    assert page.next is None
    assert [i.updated_at for i in page] == sorted((i.updated_at for i in page), reverse=True)


def test_pages_cover_every_session_once_with_prefix(kit: Kit, store: Any) -> None:
    ids = [f"user-{i:02d}" for i in range(23)] + ["other-1", "other-2"]
    for id in ids:
        store.sessions.save(id, [user(id)])
    assert sorted(every_id(store, 10)) == sorted(ids)
    assert every_id(store, 10) == listed(store, limit=LIST_LIMIT_MAX)
    users = every_id(store, 7, prefix="user-")
    assert sorted(users) == ids[:23]
    assert users == list(reversed(ids[:23]))  # newest first
    assert listed(store, prefix="nobody") == []
    assert store.sessions.list(prefix="other-", limit=2).next is None
    with kit.reopened() as again:
        assert every_id(again, 4) == every_id(store, 4)


def test_a_session_written_while_paging_is_not_duplicated_and_others_stay(store: Any) -> None:
    for i in range(12):
        store.sessions.save(f"s{i:02d}", [user("x")])
    first = store.sessions.list(limit=5)
    store.sessions.append("s00", [user("y")], expected_length=1)  # the oldest moves first
    rest: list[str] = []
    after = first.next
    while after is not None:
        page = store.sessions.list(limit=5, after=after)
        rest += [i.id for i in page]
        after = page.next
    seen = [i.id for i in first] + rest
    assert len(seen) == len(set(seen))
    assert set(seen) == {f"s{i:02d}" for i in range(1, 12)}  # s00 moved ahead of the cursor


@pytest.mark.parametrize(
    ("kw", "rule"),
    [({"limit": 0}, "limit must be an int from 1"), ({"limit": LIST_LIMIT_MAX + 1}, "limit"),
     ({"limit": True}, "limit"), ({"after": "not-a-cursor"}, "not a list cursor"),
     ({"after": 5}, "after must be"), ({"prefix": 3}, "prefix must be")],
)
def test_bad_list_arguments_name_the_rule(store: Any, kw: dict[str, Any], rule: str) -> None:
    store.sessions.save("a", [user("x")])
    with pytest.raises(ConfigError, match=rule):
        store.sessions.list(**kw)


def test_metadata_round_trips_and_is_not_a_message(kit: Kit, store: Any) -> None:
    sessions = store.sessions
    sessions.save("a", [user("hi")])
    revision = sessions.revision("a")
    md = {"title": "Trip to Oslo", "owner": "ana", "tags": ["travel", "2026"],
          "n": 3, "x": 0.5, "ok": True, "none": None, "nested": {"é": "ü"}}
    sessions.set_metadata("a", md)
    with kit.reopened() as again:
        info = again.sessions.info("a")
        assert info.metadata == md and info.title == "Trip to Oslo"
        assert info.messages == 1
        assert texts(again.sessions.load("a")) == ["hi"]
    assert sessions.revision("a") == revision
    got = sessions.info("a").metadata
    with pytest.raises(TypeError):  # a read-only view: changing it cannot fake a write
        got["title"] = "changed"  # type: ignore[index]
    assert sessions.info("a").metadata == md
    sessions.set_metadata("a", {"title": "Bergen"})  # replaced whole, not merged
    assert sessions.info("a").metadata == {"title": "Bergen"}
    sessions.set_metadata("a", {})
    assert sessions.info("a").metadata == {}


@pytest.mark.parametrize(
    ("bad", "rule"),
    [(["not", "a", "dict"], "must be a JSON object"), ({1: "x"}, "keys must be str"),
     ({"x": {1, 2}}, "only JSON values"), ({"x": float("nan")}, "JSON cannot hold"),
     ({"x": "y" * MAX_METADATA_BYTES}, f"the limit is {MAX_METADATA_BYTES} bytes")],
)
def test_bad_metadata_is_refused_and_the_old_kept(store: Any, bad: Any, rule: str) -> None:
    store.sessions.save("a", [user("hi")])
    store.sessions.set_metadata("a", {"title": "kept"})
    with pytest.raises(InvalidMetadataError, match=rule) as info:
        store.sessions.set_metadata("a", bad)
    assert info.value.code == "LOUSHO_INVALID_METADATA" and "'a'" in str(info.value)
    assert store.sessions.info("a").metadata == {"title": "kept"}


def test_metadata_only_sessions_and_what_clear_and_delete_keep(kit: Kit, store: Any) -> None:
    sessions = store.sessions
    sessions.set_metadata("m", {"title": "draft"})
    assert sessions.load("m") is None
    assert sessions.info("m").messages == 0
    assert listed(store) == ["m"] and sessions.ids() == ["m"]
    sessions.save("m", [user("a"), user("b")])
    sessions.compact("m", [user("sum")], replaced=[user("a"), user("b")])
    sessions.save("m", [])  # a clear: the transcript and what compaction kept go
    assert sessions.load("m") is None and sessions.history("m") == []
    assert sessions.info("m").metadata == {"title": "draft"}
    sessions.delete("m")
    assert sessions.info("m") is None and listed(store) == [] and sessions.ids() == []
    sessions.save("n", [user("x")])
    sessions.save("n", [])
    assert sessions.info("n") is None and listed(store) == []
    with kit.reopened() as again:
        assert again.sessions.info("m") is None


TOOL_TURN = [
    user("what is 2+2"),
    Message("assistant", "", tool_calls=(ToolCall("c1", "add", {"a": 2, "b": 2}),)),
    Message("tool", "4", tool_call_id="c1"),
    assistant("4"),
]


def test_compact_keeps_what_it_replaced_in_order(kit: Kit, store: Any) -> None:
    sessions = store.sessions
    sessions.save("a", [*TOOL_TURN, user("and 3+3"), assistant("6")])
    summary = Message("user", "summary one", metadata={"lousho": "summary"})
    sessions.compact("a", [summary, user("and 3+3"), assistant("6")], replaced=TOOL_TURN)
    assert sessions.load("a") == [summary, user("and 3+3"), assistant("6")]
    assert sessions.history("a") == TOOL_TURN
    assert sessions.info("a").messages == 3
    second = Message("user", "summary two", metadata={"lousho": "summary"})
    sessions.compact("a", [second], replaced=[summary, user("and 3+3"), assistant("6")])
    with kit.reopened() as again:
        assert again.sessions.load("a") == [second]
        assert again.sessions.history("a") == [*TOOL_TURN, summary, user("and 3+3"),
                                                assistant("6")]
    assert sessions.history("nobody") == []
    sessions.delete("a")
    assert sessions.history("a") == [] and sessions.load("a") is None


def test_compact_under_an_older_fence_is_refused(kit: Kit, store: Any) -> None:
    kit.need("fencing")
    store.sessions.save("s1", [user("a"), assistant("b")])
    a, b = make_owner(), make_owner()
    old = store.sessions.acquire_lease("s1", owner=a, ttl_s=600, wait_s=0)
    store.sessions.release_lease("s1", owner=a)
    new = store.sessions.acquire_lease("s1", owner=b, ttl_s=600, wait_s=0)
    with pytest.raises(LeaseLostError):
        store.sessions.compact("s1", [user("sum")], replaced=[user("a")], fence=Fence("s1", old))
    assert texts(store.sessions.load("s1")) == ["a", "b"] and store.sessions.history("s1") == []
    store.sessions.compact("s1", [user("sum")], replaced=[user("a"), assistant("b")],
                           fence=Fence("s1", new))
    assert texts(store.sessions.load("s1")) == ["sum"]


def test_create_writes_all_or_refuses_an_existing_id(kit: Kit, store: Any) -> None:
    sessions = store.sessions
    sessions.create("f", TOOL_TURN, metadata={"title": "copy"}, history=[user("old")])
    with kit.reopened() as again:
        assert again.sessions.load("f") == TOOL_TURN
        assert again.sessions.history("f") == [user("old")]
        assert again.sessions.info("f").metadata == {"title": "copy"}
    revision = sessions.revision("f")
    with pytest.raises(SessionExistsError) as info:
        sessions.create("f", [user("other")], metadata={"title": "other"})
    assert info.value.code == "LOUSHO_SESSION_EXISTS" and "'f'" in str(info.value)
    assert sessions.load("f") == TOOL_TURN and sessions.revision("f") == revision
    assert sessions.info("f").metadata == {"title": "copy"}
    sessions.set_metadata("only-md", {"title": "x"})
    with pytest.raises(SessionExistsError):
        sessions.create("only-md", [user("x")])
    with pytest.raises(InvalidMetadataError):
        sessions.create("g", [user("x")], metadata={"x": {1}})
    assert sessions.info("g") is None


def test_racing_creates_of_one_id_one_wins(store: Any) -> None:
    barrier = threading.Barrier(8, timeout=30)
    won: list[int] = []
    lost: list[int] = []

    def create(i: int) -> None:
        barrier.wait()
        try:
            store.sessions.create("race", [user(f"from {i}")], metadata={"by": i})
            won.append(i)
        except SessionExistsError:
            lost.append(i)

    run_threads(create, 8)
    assert len(won) == 1 and len(lost) == 7
    assert texts(store.sessions.load("race")) == [f"from {won[0]}"]
    assert store.sessions.info("race").metadata == {"by": won[0]}


def test_metadata_writes_race_appends_without_losing_either(store: Any) -> None:
    store.sessions.save("s", [user("start")])
    barrier = threading.Barrier(8, timeout=30)
    done = threading.Lock()
    length = [1]

    def work(i: int) -> None:
        barrier.wait()
        for n in range(10):
            if i % 2:
                store.sessions.set_metadata("s", {"by": i, "n": n})
            else:
                with done:  # appenders take turns; set_metadata never waits for them
                    store.sessions.append("s", [user(f"{i}-{n}")], expected_length=length[0])
                    length[0] += 1

    run_threads(work, 8)
    info = store.sessions.info("s")
    assert info.messages == 41 and len(store.sessions.load("s")) == 41
    assert info.metadata["by"] in (1, 3, 5, 7) and info.metadata["n"] == 9


def test_list_and_info_work_while_a_transcript_is_damaged(kit: Kit, store: Any) -> None:
    kit.need("raw data")
    store.sessions.save("bad", [user("a"), user("b")])
    store.sessions.set_metadata("bad", {"title": "t"})
    kit.damage_message("bad", 1)
    assert [(i.id, i.messages, i.title) for i in store.sessions.list()] == [("bad", 2, "t")]
    assert store.sessions.info("bad").messages == 2


def test_prune_removes_metadata_and_history(kit: Kit, store: Any) -> None:
    kit.need("prune", "raw data")
    store.sessions.save("old", [user("a"), user("b")])
    store.sessions.compact("old", [user("sum")], replaced=[user("a"), user("b")])
    store.sessions.set_metadata("old", {"title": "gone"})
    store.sessions.save("new", [user("c")])
    kit.age("session", "old", 7200)
    assert store.prune(3600) == PruneResult(sessions=1, checkpoints=0, approvals=0)
    assert store.sessions.info("old") is None and store.sessions.history("old") == []
    assert listed(store) == ["new"]
