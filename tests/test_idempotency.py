"""Idempotency keys (SPEC §17): a second call with a used key starts no second turn — it
returns the committed result from the store (``result.replayed``); a turn that failed
without progress frees its key; keys are checked before anything is written; 8 real
processes sending with one key at once make exactly one turn."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest
from conftest import STORE_KINDS, read_line, run_together
from crash_child import make_store

import lousho_aio
from lousho_sync import (
    InvalidInputError,
    ModelRequest,
    ProviderError,
    ScriptedProvider,
    Step,
    ToolCall,
    create_agent,
    tool,
)
from lousho_sync.sqlite import SqliteStore

HERE = Path(__file__).resolve().parent


@tool
def pay(amount: int) -> str:
    """Pay."""
    return f"paid {amount}"


PAY = Step(tool_calls=(ToolCall("c1", "pay", {"amount": 10}),))


def echo(request: ModelRequest) -> str:
    return "re: " + list(request.messages)[-1].text


def texts(messages: object) -> list[str]:
    return [f"{m.role}:{m.text}" for m in messages]  # type: ignore[attr-defined]


def _same(a: object, b: object) -> bool:
    fields = ("text", "finish_reason", "messages", "usage", "steps", "run_id")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def test_a_second_send_with_a_used_key_returns_the_stored_result_and_runs_no_turn(
    tmp_path: Path,
) -> None:
    prov = ScriptedProvider([PAY, "paid it"], default="ok")
    db = tmp_path / "agent.db"
    s = create_agent(provider=prov, tools=[pay], store=SqliteStore(db)).session(id="u1")
    first = s.send("pay 10", idempotency_key="order-7")
    again = s.send("pay 10", idempotency_key="order-7")
    assert first.replayed is False and again.replayed is True
    assert _same(first, again) and again.text == "paid it" and again.steps == 2
    assert prov.calls == 2 and len(s.messages) == 4
    # another agent (as another process would) reads it from the store
    other = create_agent(provider=ScriptedProvider(default="never"), tools=[pay],
                         store=SqliteStore(db)).session(id="u1")
    replay = other.send("pay 10", idempotency_key="order-7")
    assert replay.replayed is True and _same(first, replay)
    assert texts(other.messages) == texts(s.messages)
    fresh = s.send("pay 10", idempotency_key="order-8")  # another key: a new turn
    assert fresh.replayed is False and len(s.messages) == 6


def test_a_key_is_per_session(tmp_path: Path) -> None:
    agent = create_agent(provider=ScriptedProvider(default=echo),
                         store=SqliteStore(tmp_path / "a.db"))
    a = agent.session(id="a").send("hi", idempotency_key="k")
    b = agent.session(id="b").send("hi", idempotency_key="k")
    assert a.replayed is False and b.replayed is False and a.run_id != b.run_id


@pytest.mark.parametrize("key", ["", "x" * 201, 7, b"bytes"])
def test_a_bad_key_is_refused_before_anything_is_written(tmp_path: Path, key: object) -> None:
    prov = ScriptedProvider(default=echo)
    s = create_agent(provider=prov, store=SqliteStore(tmp_path / "a.db")).session(id="u1")
    with pytest.raises(InvalidInputError, match="idempotency_key") as err:
        s.send("hi", idempotency_key=key)  # type: ignore[arg-type]
    assert err.value.code == "LOUSHO_INVALID_INPUT"
    with pytest.raises(InvalidInputError, match="idempotency_key"):
        s.stream("hi", idempotency_key=key)  # type: ignore[arg-type]
    assert prov.calls == 0 and s.messages == () and s.pending() is None
    assert s.send("hi", idempotency_key="x" * 200).replayed is False  # 200 is the limit


def test_a_turn_that_failed_without_progress_frees_its_key(tmp_path: Path) -> None:
    prov = ScriptedProvider([Step(error=ProviderError("503")), "ok now"])
    s = create_agent(provider=prov, store=SqliteStore(tmp_path / "a.db")).session(id="u1")
    with pytest.raises(ProviderError) as failed:
        s.send("hi", idempotency_key="k")
    assert failed.value.pending is False
    r = s.send("hi", idempotency_key="k")
    assert r.replayed is False and r.text == "ok now" and texts(s.messages) == [
        "user:hi", "assistant:ok now"]
    assert s.send("hi", idempotency_key="k").replayed is True


def test_a_kept_turn_with_a_key_is_finished_by_the_retry_not_run_twice(tmp_path: Path) -> None:
    # the keyed turn ran its tool, then the model failed: the turn is kept with its key
    prov = ScriptedProvider([PAY, Step(error=ProviderError("503")), "paid it"])
    ran: list[int] = []

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        ran.append(amount)
        return f"paid {amount}"

    s = create_agent(provider=prov, tools=[pay],
                     store=SqliteStore(tmp_path / "a.db")).session(id="u1")
    with pytest.raises(ProviderError) as failed:
        s.send("pay 10", idempotency_key="order-7")
    assert failed.value.pending is True
    r = s.send("pay 10", idempotency_key="order-7")  # the client retries
    assert r.replayed is True and r.text == "paid it" and ran == [10]
    assert texts(s.messages) == ["user:pay 10", "assistant:", "tool:paid 10",
                                 "assistant:paid it"]


def test_a_key_older_than_the_ttl_is_free_again(tmp_path: Path) -> None:
    agent = create_agent(provider=ScriptedProvider(default=echo),
                         store=SqliteStore(tmp_path / "a.db"))
    s = agent.session(id="u1", idempotency_ttl_s=1e-9)
    s.send("hi", idempotency_key="k")
    assert s.send("hi", idempotency_key="k").replayed is False
    assert len(s.messages) == 4
    long = agent.session(id="u1")  # the default TTL (24 h): the last one counts
    assert long.idempotency_ttl_s == 24 * 3600 and long.send("hi", idempotency_key="k").replayed


def test_a_replayed_stream_yields_only_run_done(tmp_path: Path) -> None:
    s = create_agent(provider=ScriptedProvider(default=echo),
                     store=SqliteStore(tmp_path / "a.db")).session(id="u1")
    first = s.send("hi", idempotency_key="k")
    run = s.stream("hi", idempotency_key="k")
    assert [e.type for e in run] == ["run.done"]
    assert run.result().replayed is True and _same(run.result(), first)


def test_a_keyed_call_under_queue_waits_for_the_running_turn_instead_of_joining_it(
    tmp_path: Path,
) -> None:
    s = create_agent(provider=ScriptedProvider(default=echo),
                     store=SqliteStore(tmp_path / "a.db")).session(id="u1",
                                                                    turn_policy="queue")
    run = s.stream("first", idempotency_key="k")
    second = s.stream("first", idempotency_key="k")  # a retry while the first still runs
    assert run.result().replayed is False
    assert second.result().replayed is True and _same(second.result(), run.result())
    assert texts(s.messages) == ["user:first", "assistant:re: first"]


def test_the_aio_twins_take_the_key(tmp_path: Path) -> None:
    agent = lousho_aio.create_agent(provider=ScriptedProvider(default=echo),
                                    store=SqliteStore(tmp_path / "a.db"))

    async def go() -> tuple[bool, bool, bool]:
        s = agent.session(id="u1", idempotency_ttl_s=3600)
        a = await s.send("hi", idempotency_key="k")
        b = await s.send("hi", idempotency_key="k")
        run = s.stream("hi", idempotency_key="k")
        c = await run.result()
        return a.replayed, b.replayed, c.replayed

    assert asyncio.run(go()) == (False, True, True)


@pytest.mark.parametrize("kind", [*STORE_KINDS, "encrypted-sqlite"], indirect=True)
def test_8_processes_sending_with_one_key_at_once_make_exactly_one_turn(
    kind: str, tmp_path: Path
) -> None:
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "idem_child.py"), kind, str(tmp_path),
                          "shared", "order-42"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for _ in range(8)
    ]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in run_together(procs)]
    assert sorted(r["replayed"] for r in results) == [False] + [True] * 7
    first = {k: v for k, v in results[0].items() if k != "replayed"}
    assert all({k: v for k, v in r.items() if k != "replayed"} == first for r in results)
    assert first["text"] == "done: paid 10" and first["steps"] == 2
    messages = create_agent(provider=ScriptedProvider(default="x"),
                            store=make_store(kind, tmp_path)).session(id="shared").messages
    assert texts(messages) == ["user:pay 10", "assistant:", "tool:paid 10",
                               "assistant:done: paid 10"]


def test_a_key_survives_a_store_round_trip_on_the_file_store() -> None:
    from lousho_sync import FileSessionStore

    root = tempfile.mkdtemp()
    prov = ScriptedProvider(default=echo)
    s = create_agent(provider=prov, store=FileSessionStore(root)).session(id="u1")
    s.send("hi", idempotency_key="k")
    again = create_agent(provider=prov, store=FileSessionStore(root)).session(id="u1")
    assert again.send("hi", idempotency_key="k").replayed is True and prov.calls == 1


def test_keys_hold_in_memory_with_no_store() -> None:
    prov = ScriptedProvider(default=echo)
    s = create_agent(provider=prov).session(id="u1")
    first = s.send("hi", idempotency_key="k")
    again = create_agent(provider=prov).session(id="u1")  # another agent: its own memory
    assert s.send("hi", idempotency_key="k").replayed is True
    assert again.send("hi", idempotency_key="k").replayed is False
    assert first.replayed is False and prov.calls == 2 and len(s.messages) == 2


def test_start_takes_the_key_and_a_retry_replays_the_detached_turn(tmp_path: Path) -> None:
    prov = ScriptedProvider(default=echo)
    s = create_agent(provider=prov, store=SqliteStore(tmp_path / "a.db")).session(id="u1")
    first = s.start("hi", idempotency_key="k").result()
    again = s.start("hi", idempotency_key="k").result()
    assert first.replayed is False and again.replayed is True and _same(first, again)
    assert prov.calls == 1 and texts(s.messages) == ["user:hi", "assistant:re: hi"]


MAILBOX_KINDS = ["sqlite", "files", "redis", "postgres"]


def _idem(kind: str, root: Path, role: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, str(HERE / "idem_child.py"), kind, str(root),
                          "shared", "order-42", role],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert read_line(p) == "ready"
    return p


def _line(p: subprocess.Popen[str], text: str = "go") -> None:
    assert p.stdin is not None
    p.stdin.write(text + "\n")
    p.stdin.flush()


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_a_retry_in_another_process_attaches_to_the_running_turn_of_its_key(
    kind: str, tmp_path: Path
) -> None:
    owner = _idem(kind, tmp_path, "held")
    procs = [owner]
    try:
        _line(owner)
        assert read_line(owner) == "IN_TOOL"  # the keyed turn runs (its tool is held)
        retry = _idem(kind, tmp_path, "stream")
        procs.append(retry)
        _line(retry)
        seen = json.loads(read_line(retry))  # read while the turn runs
        assert [e["event"] for e in seen] == ["run.start", "step.start", "usage", "tool.call"]
        _line(owner, "release the tool")
        out_a, err_a = owner.communicate(timeout=60)
        out_b, err_b = retry.communicate(timeout=60)
        assert owner.returncode == 0 and retry.returncode == 0, err_a + err_b
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    a = json.loads(out_a.strip().splitlines()[-1])
    b = json.loads(out_b.strip().splitlines()[-1])
    events = b["events"]
    assert a["replayed"] is False and b["replayed"] is True
    assert b["run_id"] == a["run_id"] and b["text"] == a["text"] == "done: paid 10"
    assert b["messages"] == a["messages"]
    # the retry read that turn's events, as that turn's (its id, its seqs), to run.done
    assert [e["event"] for e in events] == [
        "run.start", "step.start", "usage", "tool.call", "tool.result", "step.start",
        "text.delta", "usage", "run.done"]
    assert {e["turn_id"] for e in events} == {a["run_id"]}
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})
    messages = create_agent(provider=ScriptedProvider(default="x"),
                            store=make_store(kind, tmp_path)).session(id="shared").messages
    assert texts(messages) == ["user:pay 10", "assistant:", "tool:paid 10",
                               "assistant:done: paid 10"]


def test_a_retry_in_this_process_attaches_to_the_running_turn_of_its_key(
    tmp_path: Path,
) -> None:
    gate, reached = threading.Event(), threading.Event()

    @tool
    def held_pay(amount: int) -> str:
        """Pay, once let through."""
        reached.set()
        gate.wait(60)
        return f"paid {amount}"

    prov = ScriptedProvider([Step(tool_calls=(ToolCall("c1", "held_pay", {"amount": 10}),)),
                             "paid it"], default="never")
    s = create_agent(provider=prov, tools=[held_pay],
                     store=SqliteStore(tmp_path / "a.db")).session(id="u1")
    first: list[object] = []
    t = threading.Thread(target=lambda: first.append(s.send("pay 10", idempotency_key="k")))
    t.start()
    assert reached.wait(60)
    retry = s.stream("pay 10", idempotency_key="k")
    events = iter(retry)
    assert next(events).type == "run.start"  # read while the first call's turn runs
    gate.set()
    rest = [e.type for e in events]
    t.join(60)
    result = retry.result()
    assert rest[-1] == "run.done" and "tool.result" in rest
    assert result.replayed is True and _same(result, first[0])
    assert retry.turn_id == result.run_id and prov.calls == 2


def test_a_keyed_start_while_its_turn_runs_attaches_to_it(tmp_path: Path) -> None:
    gate = threading.Event()
    prov = ScriptedProvider([Step(text="slow", gate=gate)], default="never")
    s = create_agent(provider=prov, store=SqliteStore(tmp_path / "a.db")).session(id="u1")
    first = s.start("hi", idempotency_key="k")
    events = iter(first)
    assert next(events).type == "run.start"
    again = s.start("hi", idempotency_key="k")
    assert again.turn_id == first.turn_id  # the same turn, not a second one
    gate.set()
    a, b = first.result(timeout=60), again.result(timeout=60)
    assert a.replayed is False and b.replayed is True and _same(a, b) and prov.calls == 1


def test_a_key_stays_used_after_compaction_summarised_its_turn(tmp_path: Path) -> None:
    prov = ScriptedProvider(["paid it", "one", "two", "SUMMARY A", "three", "SUMMARY B"],
                            default="never")
    db = tmp_path / "agent.db"
    s = create_agent(provider=prov, store=SqliteStore(db)).session(id="u1")
    first = s.send("pay 10", idempotency_key="order-7")
    s.send("a")
    s.send("b")
    assert s.compact(keep_last=2) is True  # the keyed turn is now in the summary
    assert "order-7" not in str([m.text for m in s.messages])
    calls = prov.calls
    again = s.send("pay 10", idempotency_key="order-7")
    assert again.replayed is True and prov.calls == calls
    assert (again.text, again.run_id, again.steps, again.usage, again.finish_reason) == (
        first.text, first.run_id, first.steps, first.usage, first.finish_reason)
    assert again.messages == ()  # they were summarised (session.history() has them)
    s.send("c")
    assert s.compact(keep_last=2) is True  # a summary of the summary carries it on
    other = create_agent(provider=ScriptedProvider(default="never again"),
                         store=SqliteStore(db)).session(id="u1")
    replay = other.send("pay 10", idempotency_key="order-7")
    assert replay.replayed is True and replay.text == "paid it"
    assert replay.run_id == first.run_id and len(other.messages) == 3


def test_compaction_drops_a_key_past_its_ttl(tmp_path: Path) -> None:
    prov = ScriptedProvider(["paid it", "one", "SUMMARY"], default="again")
    agent = create_agent(provider=prov, store=SqliteStore(tmp_path / "a.db"))
    s = agent.session(id="u1", idempotency_ttl_s=1e-9)
    s.send("pay 10", idempotency_key="order-7")
    s.send("a")
    assert s.compact(keep_last=2) is True
    # the key was past its TTL: the summary kept nothing of it, even for a longer TTL now
    long = agent.session(id="u1")
    assert long.send("pay 10", idempotency_key="order-7").replayed is False


def test_a_keyed_queue_call_joins_the_running_turn_and_a_retry_never_joins_twice(
    tmp_path: Path,
) -> None:
    offered = threading.Event()
    holder: dict[str, object] = {}

    @tool
    def hold() -> str:
        """Wait until input is queued into the turn (twice: the call and its retry)."""
        reached.set()
        offered.wait(60)
        return "held"

    def answer(request: ModelRequest) -> Step | str:
        msgs = list(request.messages)
        if msgs[-1].text == "A":
            return Step(tool_calls=[("hold", {})])
        return "saw: " + ",".join(m.text for m in msgs if m.role == "user")

    reached = threading.Event()
    s = create_agent(provider=ScriptedProvider(default=answer), tools=[hold],
                     store=SqliteStore(tmp_path / "a.db")).session(id="u1",
                                                                    turn_policy="queue")
    owner = threading.Thread(target=lambda: holder.update(a=s.send("A")))
    owner.start()
    assert reached.wait(60)
    joined = s.stream("B", idempotency_key="req-1")  # joins the running turn
    retry = s.stream("B", idempotency_key="req-1")  # the client retries: no second join
    done = threading.Thread(target=lambda: holder.update(b=joined.result()))
    done.start()
    offered.set()
    owner.join(60)
    done.join(60)
    a, b, c = holder["a"], holder["b"], retry.result()
    assert b is a  # joined in this process: the same result object
    assert c.replayed is True and c.run_id == a.run_id  # type: ignore[attr-defined]
    assert texts(s.messages) == ["user:A", "assistant:", "tool:held", "user:B",
                                 "assistant:saw: A,B"]


def _held_rollback_session(
    tmp_path: Path, prov: ScriptedProvider
) -> tuple[Any, threading.Event, threading.Event]:
    """A ``"rollback"`` session on SQLite whose ``held`` tool sets ``reached`` and waits
    for ``gate``: (session, gate, reached)."""
    gate, reached = threading.Event(), threading.Event()

    @tool
    def held(amount: int) -> str:
        """Hold until the gate opens (or the turn is rolled back)."""
        reached.set()
        gate.wait(60)
        return "held"

    s = create_agent(provider=prov, tools=[held],
                     store=SqliteStore(tmp_path / "a.db")).session(id="u1",
                                                                  turn_policy="rollback")
    return s, gate, reached


def test_a_keyed_rollback_in_this_process_drops_the_running_turn_and_replays_once(
    tmp_path: Path,
) -> None:
    prov = ScriptedProvider([Step(tool_calls=(ToolCall("c1", "held", {"amount": 1}),))],
                            default=echo)
    s, gate, reached = _held_rollback_session(tmp_path, prov)
    first: list[object] = []
    t = threading.Thread(target=lambda: first.append(s.send("A")))
    t.start()
    assert reached.wait(60)
    second = s.send("B", idempotency_key="k")  # rolls A's turn back, runs next
    gate.set()
    t.join(60)
    assert first[0].finish_reason == "aborted"  # type: ignore[attr-defined]
    assert second.text == "re: B" and second.replayed is False
    again = s.send("B", idempotency_key="k")  # a retry: replayed, never run twice
    assert again.replayed is True and _same(again, second)
    assert texts(s.messages) == ["user:B", "assistant:re: B"]


def test_a_keyed_rollback_retry_in_this_process_never_drops_its_key_turn(
    tmp_path: Path,
) -> None:
    prov = ScriptedProvider([Step(tool_calls=(ToolCall("c1", "held", {"amount": 1}),)),
                             "done"], default="never")
    s, gate, reached = _held_rollback_session(tmp_path, prov)
    first: list[object] = []
    t = threading.Thread(target=lambda: first.append(s.send("A", idempotency_key="k")))
    t.start()
    assert reached.wait(60)
    retry = s.stream("A", idempotency_key="k")  # the same request again, while it runs
    events = iter(retry)
    assert next(events).type == "run.start"  # attached to the key's turn, not aborting it
    gate.set()
    assert [e.type for e in events][-1] == "run.done"
    t.join(60)
    assert first[0].finish_reason == "stop"  # type: ignore[attr-defined]
    assert retry.result().replayed is True and _same(retry.result(), first[0])
    assert prov.calls == 2


PRUNE_KINDS = ["sqlite", "files", "redis", "postgres", "encrypted-sqlite"]
"""The stores that declare ``prune`` (``files``: a ``FileStore``)."""


def _prunable(kind: str, root: Path) -> object:
    if kind == "files":
        from lousho_sync.stores.files import FileStore

        return FileStore(root)
    return make_store(kind, root)


@pytest.mark.parametrize("kind", PRUNE_KINDS, indirect=True)
def test_prune_removes_the_keys_past_their_ttl_and_keeps_the_others(
    kind: str, tmp_path: Path
) -> None:
    import time

    from lousho_sync import _idempotency as idem

    store = _prunable(kind, tmp_path)
    try:
        s = create_agent(provider=ScriptedProvider(default=echo), store=store).session(id="u1")
        first = s.send("old", idempotency_key="k-old")
        s.send("new", idempotency_key="k-new")
        # the first turn was committed two days ago (its seal says when)
        sessions: Any = store.sessions  # type: ignore[attr-defined]
        stored_msgs = sessions.load("u1")
        seal = dict(stored_msgs[1].extra[idem.EXTRA], at=time.time() - 2 * 86400)
        stored_msgs[1] = attrs.evolve(stored_msgs[1],
                                      extra={**stored_msgs[1].extra, idem.EXTRA: seal})
        sessions.save("u1", stored_msgs)
        result = store.prune(7 * 86400)  # type: ignore[attr-defined]  # keys past 24 h
        assert result.keys == 1 and result.sessions == 0
        kept = store.sessions.load("u1")  # type: ignore[attr-defined]
        assert [idem.EXTRA in m.extra for m in kept] == [False, False, True, True]
        assert texts(kept) == ["user:old", "assistant:re: old", "user:new", "assistant:re: new"]
        stored = create_agent(provider=ScriptedProvider(default=echo), store=store).session(
            id="u1")
        assert stored.send("new", idempotency_key="k-new").replayed is True  # still used
        again = stored.send("old", idempotency_key="k-old")  # free: a new turn
        assert again.replayed is False and again.run_id != first.run_id
        assert texts(stored.messages)[-2:] == ["user:old", "assistant:re: old"]
        assert store.prune(7 * 86400).keys == 0  # nothing past the default 24 h
    finally:
        getattr(store, "close", lambda: None)()


def test_prune_refuses_a_bad_key_ttl_before_deleting_anything(tmp_path: Path) -> None:
    from lousho_sync import ConfigError

    store = SqliteStore(tmp_path / "a.db")
    s = create_agent(provider=ScriptedProvider(default=echo), store=store).session(id="u1")
    s.send("hi", idempotency_key="k")
    for bad in (0, -1.0, True, "1d"):
        with pytest.raises(ConfigError, match="idempotency_ttl_s"):
            store.prune(0, idempotency_ttl_s=bad)  # type: ignore[arg-type]
    assert texts(store.sessions.load("u1") or []) == ["user:hi", "assistant:re: hi"]
