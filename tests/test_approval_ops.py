"""Approvals an operator can work through, on every built-in store (the kits of
test_store_contract.py): who decided (``resolved_by``), expiry (denied as "expired" when
read, resolved or pruned; the turn continues as a denial does; ``ApprovalExpiredError``),
``agent.approvals.page()`` across sessions, and ``on_approval_requested`` (once per durable
request, also when two processes race to pause)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import test_store_contract as contract
from conftest import CHILD_TIMEOUT, approval, read_line
from test_store_contract import Kit, run_threads

from lousho_sync import records
from lousho_sync.agent import Agent, create_agent
from lousho_sync.approvals import ApprovalPage
from lousho_sync.codec import approval_from_dict, approval_to_dict, dumps_approval, loads_approval
from lousho_sync.errors import (
    ApprovalAlreadyResolvedError,
    ApprovalExpiredError,
    ConfigError,
    SessionAwaitingApprovalError,
)
from lousho_sync.messages import Message, ToolCall
from lousho_sync.providers.base import ModelRequest
from lousho_sync.providers.scripted import ScriptedProvider, Step
from lousho_sync.records import ApprovalRecord, Checkpoint
from lousho_sync.tools import tool

kit = contract.kit  # the fixtures: one kit per store kind, and its store
store = contract.store

LATER = 3600.0  # how far the clock is moved to pass an expiry (no test waits for one)


@tool(needs_approval=True, approval_ttl_s=60)
def pay(amount: int, to: str) -> str:
    """Send money."""
    return f"paid {amount} to {to}"


def brain(request: ModelRequest) -> Step | str:
    """Asks to pay once; after the tool's result, says what came of it."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"outcome: {last.text}"
    return Step(tool_calls=[("pay", {"amount": 5, "to": "bob"})])


def make_agent(store: Any, **kw: Any) -> Agent:
    return create_agent(provider=ScriptedProvider(default=brain), tools=[pay], store=store, **kw)


def later(monkeypatch: pytest.MonkeyPatch, seconds: float = LATER) -> None:
    """Move the clock that expiry is judged by ``seconds`` ahead."""
    real = records.now
    monkeypatch.setattr(records, "now", lambda: real() + seconds)


def paused(agent: Agent, sid: str = "s1") -> str:
    result = agent.session(sid).send("pay bob")
    assert result.finish_reason == "awaiting-approval" and result.approval_id is not None
    return result.approval_id


# --- the record: old form unchanged, new fields round-trip --------------------------------------

OLD_FORM = {"v": 1, "id": "a1", "session_id": "s1", "checkpoint_key": "s1.turn-0",
            "call": {"id": "c1", "name": "pay", "arguments": {"amount": 5}},
            "status": "approved", "reason": "ok", "created_at": 1.5, "resolved_at": 2.5}


def test_an_old_record_loads_unchanged_and_writes_back_the_same() -> None:
    record = approval_from_dict(OLD_FORM)
    assert (record.expires_at, record.resolved_by) == (None, None)
    assert (record.status, record.reason, record.resolved_at) == ("approved", "ok", 2.5)
    assert approval_to_dict(record) == OLD_FORM
    text = json.dumps(OLD_FORM, separators=(",", ":"))
    assert dumps_approval(loads_approval(text)) == text


def test_expires_at_and_resolved_by_round_trip() -> None:
    record = approval_from_dict({**OLD_FORM, "expires_at": 9.5, "resolved_by": "alice <a@x>"})
    assert (record.expires_at, record.resolved_by) == (9.5, "alice <a@x>")
    assert approval_from_dict(approval_to_dict(record)) == record
    assert loads_approval(dumps_approval(record)) == record


def test_every_store_keeps_an_old_form_record_and_the_new_fields(kit: Kit, store: Any) -> None:
    old = approval("old", created_at=1.0)
    new = approval("new", created_at=2.0, expires_at=5.0)
    store.approvals.create(old)
    store.approvals.create(new)
    with kit.reopened() as again:
        assert again.approvals.get("old") == old
        assert again.approvals.get("new") == new


# --- who decided ----------------------------------------------------------------------------


def test_resolved_by_is_kept_with_the_decision(kit: Kit, store: Any) -> None:
    store.approvals.create(approval("a1", extra={"ticket": "T-9"}))
    store.approvals.create(approval("a2"))
    done = store.approvals.resolve("a1", approved=True, reason="fine", by="alice")
    assert (done.status, done.reason, done.resolved_by) == ("approved", "fine", "alice")
    assert done.extra == {"ticket": "T-9"}
    nobody = store.approvals.resolve("a2", approved=False)
    assert nobody.resolved_by is None
    with kit.reopened() as again:
        assert again.approvals.get("a1") == done
        got = again.approvals.get("a2")
        assert got is not None and (got.status, got.resolved_by) == ("denied", None)


def test_the_loser_of_a_race_is_told_who_decided(store: Any) -> None:
    agent = make_agent(store)
    aid = paused(agent)
    barrier = threading.Barrier(4)
    outcomes: list[object] = []
    lock = threading.Lock()

    def decide(i: int) -> None:
        barrier.wait(timeout=contract.TIMEOUT)
        try:
            out: object = agent.approvals.resolve(id=aid, approved=True, by=f"op{i}")
        except ApprovalAlreadyResolvedError as exc:
            out = exc
        with lock:
            outcomes.append(out)

    run_threads(decide, 4)
    errors = [o for o in outcomes if isinstance(o, ApprovalAlreadyResolvedError)]
    results = [o for o in outcomes if not isinstance(o, ApprovalAlreadyResolvedError)]
    assert len(results) == 1 and len(errors) == 3
    record = agent.approvals.get(aid)
    assert record is not None and record.status == "approved"
    assert record.resolved_by in {"op0", "op1", "op2", "op3"}
    for e in errors:
        assert f"already approved by {record.resolved_by}" in str(e)
    text = results[0].text  # type: ignore[attr-defined]
    assert text == "outcome: paid 5 to bob"


def test_by_must_be_a_short_str(store: Any) -> None:
    agent = make_agent(store)
    aid = paused(agent)
    for bad in ("", "x" * 201, 7):
        with pytest.raises(ConfigError, match="by must be"):
            agent.approvals.resolve(id=aid, approved=True, by=bad)  # type: ignore[arg-type]
    record = agent.approvals.get(aid)
    assert record is not None and record.status == "pending"


# --- expiry ---------------------------------------------------------------------------------


def test_a_request_carries_its_expiry_from_the_tool_or_the_agent(store: Any) -> None:
    agent = make_agent(store)
    record = agent.approvals.get(paused(agent))
    assert record is not None and record.expires_at is not None
    assert record.expires_at == pytest.approx(record.created_at + 60)

    @tool(needs_approval=True)
    def wire(amount: int) -> str:
        """Wire money."""
        return "wired"

    other = create_agent(
        provider=ScriptedProvider([Step(tool_calls=[("wire", {"amount": 1})])]), tools=[wire],
        store=store, approval_ttl_s=90)
    result = other.session("s2").send("wire")
    got = other.approvals.get(result.approval_id or "")
    assert got is not None and got.expires_at == pytest.approx(got.created_at + 90)
    never = create_agent(
        provider=ScriptedProvider([Step(tool_calls=[("wire", {"amount": 1})])]), tools=[wire],
        store=store)
    result = never.session("s3").send("wire")
    got = never.approvals.get(result.approval_id or "")
    assert got is not None and got.expires_at is None


def test_a_bad_ttl_is_refused() -> None:
    for bad in (0, -1, float("nan"), float("inf"), "60", True):
        with pytest.raises(ConfigError, match="approval_ttl_s"):
            create_agent(provider=ScriptedProvider(), approval_ttl_s=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="approval_ttl_s"):
            tool(pay.fn, name="pay2", needs_approval=True, approval_ttl_s=bad)  # type: ignore[arg-type]


def test_reading_an_expired_request_denies_it_and_the_turn_continues_as_a_denial(
    monkeypatch: pytest.MonkeyPatch, store: Any
) -> None:
    agent = make_agent(store)
    aid = paused(agent)
    session = agent.session("s1")
    assert session.pending() is not None
    later(monkeypatch)
    record = agent.approvals.get(aid)
    assert record is not None
    assert (record.status, record.reason, record.resolved_by) == ("denied", "expired", None)
    assert agent.approvals.list() == [] and len(agent.approvals.page()) == 0
    pending = session.pending()
    assert pending is not None and pending.status == "interrupted"
    result = session.resume()
    assert result is not None
    assert result.text == ("outcome: denied: the request for approval expired before anyone "
                           "decided")
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]
    assert session.pending() is None


def test_resolving_an_expired_request_raises_and_continues_its_turn(
    monkeypatch: pytest.MonkeyPatch, store: Any
) -> None:
    agent = make_agent(store)
    aid = paused(agent)
    later(monkeypatch)
    with pytest.raises(ApprovalExpiredError) as info:
        agent.approvals.resolve(id=aid, approved=True, by="alice")
    error = info.value
    assert error.code == "LOUSHO_APPROVAL_EXPIRED" and error.approval_id == aid
    assert isinstance(error, ApprovalAlreadyResolvedError)
    assert "expired" in str(error) and "'pay'" in str(error)
    assert error.result is not None and "expired" in error.result.text
    record = agent.approvals.get(aid)
    assert record is not None and (record.status, record.reason) == ("denied", "expired")
    texts = [m.text for m in agent.session("s1").load()]
    assert texts[-1].startswith("outcome: denied") and "paid" not in " ".join(texts)
    with pytest.raises(ApprovalExpiredError):  # a second try says the same, runs nothing
        agent.approvals.resolve(id=aid, approved=False)


def test_a_send_meets_an_expired_request_and_finishes_that_turn_first(
    monkeypatch: pytest.MonkeyPatch, store: Any
) -> None:
    agent = make_agent(store)
    paused(agent)
    with pytest.raises(SessionAwaitingApprovalError):
        agent.session("s1").send("hello?")
    later(monkeypatch)
    result = make_agent(store).session("s1").send("pay bob again")
    assert result.resumed is not None and "expired" in result.resumed.text


def test_prune_denies_expired_requests(
    monkeypatch: pytest.MonkeyPatch, kit: Kit, store: Any
) -> None:
    kit.need("prune")
    agent = make_agent(store)
    aid = paused(agent)
    store.approvals.create(approval("forever", session_id="s9"))
    later(monkeypatch)
    store.prune(7 * 86400)
    raw = store.approvals.get(aid)  # the store itself, not the agent's reads
    assert raw is not None and (raw.status, raw.reason) == ("denied", "expired")
    kept = store.approvals.get("forever")
    assert kept is not None and kept.status == "pending"


# --- page() across sessions -----------------------------------------------------------------


def test_page_walks_every_sessions_pending_approvals_newest_first(
    monkeypatch: pytest.MonkeyPatch, store: Any
) -> None:
    ap = store.approvals
    for i in range(7):
        ap.create(approval(f"a{i}", session_id=f"team-{i % 2}-s{i}", created_at=100.0 + i))
    ap.create(approval("tie", session_id="other", created_at=103.0))
    ap.create(approval("done", session_id="team-0-x", created_at=200.0))
    ap.resolve("done", approved=True)
    ap.create(approval("old", session_id="team-1-y", created_at=50.0, expires_at=60.0))
    agent = make_agent(store)
    seen: list[str] = []
    cursor = None
    while True:
        page = agent.approvals.page(limit=3, cursor=cursor)
        assert isinstance(page, ApprovalPage) and len(page) <= 3
        seen += [r.id for r in page]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ["a6", "a5", "a4", "a3", "tie", "a2", "a1", "a0"]
    team = agent.approvals.page(session_prefix="team-1-")
    assert [r.id for r in team] == ["a5", "a3", "a1"] and team.next_cursor is None
    expired = ap.get("old")  # read by the page: past its expiry, so denied
    assert expired is not None and (expired.status, expired.reason) == ("denied", "expired")
    assert agent.approvals.page(session_prefix="nobody-").items == ()


def test_page_refuses_bad_arguments(store: Any) -> None:
    agent = make_agent(store)
    for kw in ({"limit": 0}, {"limit": 1001}, {"cursor": "nope"}, {"status": "approved"},
               {"session_prefix": 5}):
        with pytest.raises(ConfigError):
            agent.approvals.page(**kw)


# --- on_approval_requested ------------------------------------------------------------------


def test_the_hook_is_called_once_per_request_after_it_is_durable(store: Any) -> None:
    seen: list[tuple[str, str | None, str]] = []

    def hook(record: ApprovalRecord) -> None:
        stored = store.approvals.get(record.id)
        cp = store.checkpoints.load(record.checkpoint_key)
        seen.append((record.call.name, stored and stored.status,
                     cp.status if cp is not None else "no checkpoint"))

    two = ScriptedProvider([Step(tool_calls=[("pay", {"amount": 1, "to": "a"}),
                                             ("pay", {"amount": 2, "to": "b"})]),
                            "both done"])
    agent = create_agent(provider=two, tools=[pay], store=store, on_approval_requested=hook)
    result = agent.session("s1").send("pay both")
    assert len(result.approval_ids) == 2
    assert seen == [("pay", "pending", "awaiting-approval")] * 2
    agent.approvals.resolve(id=result.approval_ids[0], approved=True)
    assert len(seen) == 2  # resolving asks nothing new
    final = agent.approvals.resolve(id=result.approval_ids[1], approved=False)
    assert final is not None and final.text == "both done" and len(seen) == 2


def test_a_hook_that_raises_is_logged_and_the_turn_pauses_as_it_should(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def hook(record: ApprovalRecord) -> None:
        raise RuntimeError("mail server down")

    agent = make_agent(store, on_approval_requested=hook)
    with caplog.at_level(logging.WARNING, logger="lousho_sync"):
        aid = paused(agent)
    assert any("on_approval_requested raised" in r.getMessage() and aid in r.getMessage()
               for r in caplog.records)
    done = agent.approvals.resolve(id=aid, approved=True)
    assert done is not None and done.text == "outcome: paid 5 to bob"


def test_a_hook_must_be_callable() -> None:
    with pytest.raises(ConfigError, match="on_approval_requested"):
        create_agent(provider=ScriptedProvider(), on_approval_requested="mail")  # type: ignore[arg-type]


CHILD_RESUME = """
import sys
kind, where, prefix = sys.argv[1:4]
encrypted = kind.startswith("encrypted-")
kind = kind.removeprefix("encrypted-")
if kind == "sqlite":
    from lousho_sync.sqlite import SqliteStore
    store = SqliteStore(where)
elif kind == "postgres":
    from lousho_sync.postgres import PostgresStore
    store = PostgresStore(where, schema=prefix)
elif kind == "files":
    from lousho_sync.stores.files import FileStore
    store = FileStore(where)
else:
    from lousho_sync.redis import RedisStore
    store = RedisStore(where, prefix=prefix)
if encrypted:
    import os
    from lousho_sync.stores.encrypted import EncryptedStore
    store = EncryptedStore(store, keys=[os.environ["LOUSHO_TEST_ENCRYPTION_KEY"]])
from test_approval_ops import make_agent
from lousho_sync.errors import SessionAwaitingApprovalError
agent = make_agent(store, on_approval_requested=lambda r: print("HOOK", r.id, flush=True))
print("ready", flush=True)
sys.stdin.readline()
try:
    result = agent.resume("s1")
    print("RESULT", None if result is None else result.finish_reason, flush=True)
except SessionAwaitingApprovalError as exc:
    print("AWAITING", exc.approval_id, flush=True)
"""


def child_argv(kit: Kit) -> list[str]:
    if kit.name == "files":
        assert kit.location is not None
        return ["files", kit.location, ""]
    return kit.child_argv()


def test_two_processes_racing_to_pause_call_the_hook_once(kit: Kit, store: Any) -> None:
    kit.need("leases")
    call = ToolCall("call-1", "pay", {"amount": 5, "to": "bob"})
    store.checkpoints.save("s1.turn-0", Checkpoint(
        key="s1.turn-0", session_id="s1", run_id="r1", status="interrupted",
        input=(Message("user", "pay bob"),),
        recorded=(Message("assistant", "", tool_calls=(call,)),)))
    here = Path(__file__).parent
    children = [subprocess.Popen(
        [sys.executable, "-c", CHILD_RESUME, *child_argv(kit)], cwd=here,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)]
    try:
        for child in children:
            assert read_line(child) == "ready", child.stderr.read() if child.stderr else ""
        for child in children:  # both go at once
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = []
        for child in children:
            out, err = child.communicate(timeout=CHILD_TIMEOUT)
            assert child.returncode == 0, err
            outputs += out.split("\n")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    hooks = [line.split()[1] for line in outputs if line.startswith("HOOK")]
    pending = store.approvals.list_pending("s1")
    assert len(pending) == 1 and hooks == [pending[0].id]
    assert sorted(line.split()[0] for line in outputs if line.split()[:1] in
                  (["RESULT"], ["AWAITING"])) == ["AWAITING", "RESULT"]


def test_the_aio_twins_page_and_resolve_by(store: Any) -> None:
    import asyncio

    import lousho_aio

    async def main() -> None:
        agent = lousho_aio.create_agent(provider=ScriptedProvider(default=brain), tools=[pay],
                                        store=store, approval_ttl_s=30)
        result = await agent.session("aio-1").send("pay bob")
        page = await agent.approvals.page(session_prefix="aio-")
        assert [r.id for r in page] == [result.approval_id]
        assert page.items[0].expires_at is not None
        done = await agent.approvals.resolve(id=page.items[0].id, approved=True, by="zoe")
        assert done is not None and done.text == "outcome: paid 5 to bob"
        got = await agent.approvals.get(page.items[0].id)
        assert got is not None and got.resolved_by == "zoe"

    asyncio.run(main())
