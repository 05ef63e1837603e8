"""Detached turns and the event log (issue 29): ``Session.start``, ``Session.attach`` from
another process, ``current_turn``, event ids, coalescing and retention, on every store kind
that has a log readers in other processes can see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import CHILD_TIMEOUT, STORE_KINDS, read_line, wait
from crash_child import make_store
from events_child import GatedProvider

from lousho_sync import (
    InvalidInputError,
    MemorySessionStore,
    ScriptedProvider,
    Step,
    StepReset,
    TextDelta,
    TurnNotFoundError,
    create_agent,
    event_id,
    parse_event_id,
)
from lousho_sync._eventlog import EventLog
from lousho_sync.stores._events import MemoryEventOps, event_ops_of

HERE = Path(__file__).resolve().parent
CROSS_PROCESS_KINDS = [*STORE_KINDS, "encrypted-sqlite"]
ANSWER = "The quick brown fox jumps over the lazy dog, again and again, until the end."


def child(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    return subprocess.Popen(
        [sys.executable, str(HERE / "events_child.py"), *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )


def finish(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """The child's remaining JSON lines (it must exit 0). Read through the same buffered
    stream as ``read_line`` (``communicate()`` would skip what that buffer holds)."""
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    proc.stdin.close()
    stdout = proc.stdout.read()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=CHILD_TIMEOUT) == 0, stderr
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def text_of(lines: list[dict[str, Any]]) -> str:
    return "".join(e["text"] or "" for e in lines if e.get("type") == "text.delta")


# --- event ids ---------------------------------------------------------------------------------
def test_event_id_round_trips_and_a_bad_id_is_refused() -> None:
    event = TextDelta(run_id="abc123", seq=42, text="x")
    assert event.turn_id == "abc123"
    assert event_id(event) == "abc123:42"
    assert parse_event_id("abc123:42") == ("abc123", 42)
    assert parse_event_id(event_id(StepReset(run_id="t:with:colons", seq=0, step=1))) == (
        "t:with:colons", 0)
    for bad in ("", "abc", "abc:", ":3", "abc:-1", "abc:x", "abc:1.5", "abc:٣"):
        with pytest.raises(InvalidInputError, match="event id"):
            parse_event_id(bad)
    with pytest.raises(InvalidInputError):
        parse_event_id(7)  # type: ignore[arg-type]


# --- one process, any store ----------------------------------------------------------------------
def test_leaving_a_started_runs_loop_does_not_abort_it() -> None:
    gate = threading.Event()
    provider = GatedProvider(ANSWER, 10, 3, gate)
    agent = create_agent(provider=provider, store=MemorySessionStore())
    session = agent.session(id="s1")
    run = session.start("hi")
    assert run.detached
    for event in run:
        if event.type == "text.delta":
            break  # the reader leaves mid-answer
    info = session.current_turn()
    assert info is not None and info.status == "running" and info.turn_id == run.turn_id
    gate.set()
    result = run.result(timeout=CHILD_TIMEOUT)
    assert result.finish_reason == "stop" and result.text == ANSWER
    assert [m.text for m in session.load()] == ["hi", ANSWER]
    assert session.current_turn() is None
    # re-attached after the end: every event, the committed answer
    events = list(session.attach(run.turn_id))
    assert [e.seq for e in events] == list(range(len(events)))
    assert events[-1].type == "run.done"
    assert "".join(e.text for e in events if e.type == "text.delta") == ANSWER


def test_a_started_turn_runs_while_nobody_reads_it_and_abort_ends_it() -> None:
    agent = create_agent(provider=ScriptedProvider(["one", Step(gate=threading.Event())]),
                         store=MemorySessionStore())
    session = agent.session(id="s1")
    assert session.start("a").result(timeout=CHILD_TIMEOUT).text == "one"
    run = session.start("b")
    run.abort("stop")
    assert run.result(timeout=CHILD_TIMEOUT).finish_reason == "aborted"
    assert [m.text for m in session.load()] == ["a", "one"]
    assert [e.type for e in session.attach(run.turn_id)][-1] == "run.done"


def test_attach_unknown_or_expired_turn_raises_turn_not_found() -> None:
    agent = create_agent(provider=ScriptedProvider(default="ok"), store=MemorySessionStore())
    session = agent.session(id="s1")
    with pytest.raises(TurnNotFoundError) as info:
        session.attach()
    assert info.value.code == "LOUSHO_TURN_NOT_FOUND"
    with pytest.raises(TurnNotFoundError, match="nope"):
        session.attach("nope")
    with pytest.raises(TurnNotFoundError):
        session.attach("../../etc/passwd")
    with pytest.raises(InvalidInputError, match="after"):
        session.attach(after=-2)
    run = session.start("hi")
    run.result(timeout=CHILD_TIMEOUT)
    other = agent.session(id="s2")
    with pytest.raises(TurnNotFoundError):
        other.attach(run.turn_id)  # a turn of another session
    assert [e.type for e in session.attach(after=3)] == ["run.done"]
    session.event_ttl_s = 0.0
    with pytest.raises(TurnNotFoundError, match="event_ttl_s=0"):
        session.attach(run.turn_id)


def test_prune_removes_ended_turns_past_their_ttl() -> None:
    ops = MemoryEventOps()
    log = EventLog(ops, ttl_s=0.0)
    publisher = log.begin("t1", "s1", "host:1:x")
    publisher.publish(TextDelta(run_id="t1", seq=0, text="x"))
    assert log.prune() == 0  # still running
    from lousho_sync import ExecutionResult, RunDone, Usage
    done = ExecutionResult(text="x", finish_reason="stop", messages=(), usage=Usage(),
                           steps=1, run_id="t1")
    publisher.publish(RunDone(run_id="t1", seq=1, finish_reason="stop", result=done))
    assert log.prune() == 1
    assert ops.head("t1") is None and ops.latest("s1") is None


def test_text_deltas_are_coalesced_into_one_write_per_interval() -> None:
    store = MemorySessionStore()
    agent = create_agent(provider=ScriptedProvider([Step(chunks=["x"] * 1000)]), store=store)
    session = agent.session(id="s1")
    session.event_interval_s = 3600.0
    ops = event_ops_of(store)
    writes: list[int] = []
    append = ops.append

    def counting(turn_id: str, rows: Any, **kw: Any) -> None:
        writes.append(len(rows))
        append(turn_id, rows, **kw)

    ops.append = counting  # type: ignore[method-assign]
    run = session.start("hi")
    events = list(run)
    assert run.result().text == "x" * 1000
    non_delta = sum(1 for e in events if e.type != "text.delta")
    assert sum(writes) == len(events) == non_delta + 1000
    assert len(writes) <= non_delta  # the 1000 deltas went with the next event's write


def test_a_long_turns_log_is_bounded_by_merging_old_deltas() -> None:
    ops = MemoryEventOps()
    log = EventLog(ops, interval_s=0.0, max_rows=100)
    publisher = log.begin("t1", "s1", "host:1:x")
    for seq in range(1000):
        publisher.publish(TextDelta(run_id="t1", seq=seq, text=str(seq % 10)))
    head = ops.head("t1")
    assert head is not None and head.rows <= 200 and head.last_seq == 999
    events = list(log.follow("t1", -1, idle=lambda h: True))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "".join(
        str(s % 10) for s in range(1000))
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs)) and seqs[-1] == 999


# --- readers in other processes -------------------------------------------------------------------
def _started(kind: str, root: Path, chunks: int = 40, hold_after: int = 20) -> Any:
    gate = threading.Event()
    provider = GatedProvider(ANSWER, chunks, hold_after, gate)
    agent = create_agent(provider=provider, store=make_store(kind, root))
    session = agent.session(id="s1")
    run = session.start("hi")
    return session, run, gate, provider


@pytest.mark.parametrize("kind", CROSS_PROCESS_KINDS, indirect=True)
def test_a_reader_in_another_process_gets_exactly_the_events_after_n(
    kind: str, tmp_path: Path
) -> None:
    session, run, gate, provider = _started(kind, tmp_path)
    wait(provider.reached, "the turn mid-answer")
    seen: list[Any] = []
    events = iter(run)
    for event in events:  # read up to the held text
        seen.append(event)
        if len([e for e in seen if e.type == "text.delta"]) == 20:
            break
    n = seen[-1].seq
    procs = [child("attach", kind, str(tmp_path), "s1", run.turn_id, str(n)),
             child("attach", kind, str(tmp_path), "s1", run.turn_id, str(n)),
             child("attach", kind, str(tmp_path), "s1", run.turn_id, "-1", str(n - 3))]
    for p in procs:
        assert read_line(p) == '"READY"'
    gate.set()
    rest = list(events)
    result = run.result(timeout=CHILD_TIMEOUT)
    assert result.text == ANSWER
    committed = [m.text for m in session.load()]
    assert committed == ["hi", ANSWER]
    mine = [(e.type, e.seq) for e in seen + rest]
    assert [s for _, s in mine] == list(range(len(mine)))
    one, two, again = (finish(p) for p in procs)
    for lines in (one, two):
        assert lines[-1] == {"end": True, "result": ANSWER}
        got = [(e["type"], e["seq"]) for e in lines[:-1]]
        assert got == [x for x in mine if x[1] > n]  # exactly seq > n, in order
        assert got[-1][0] == "run.done"
        prefix = "".join(e.text for e in seen if e.type == "text.delta")
        assert prefix + text_of(lines[:-1]) == ANSWER
    assert one == two  # two readers see identical sequences
    # left the loop after seq n-3 and re-attached with it: nothing missed, nothing twice
    assert [(e["type"], e["seq"]) for e in again[:-1]] == mine
    assert text_of(again[:-1]) == ANSWER


@pytest.mark.parametrize("kind", CROSS_PROCESS_KINDS, indirect=True)
def test_current_turn_from_another_process_and_the_driver_process(
    kind: str, tmp_path: Path
) -> None:
    _, run, gate, provider = _started(kind, tmp_path)
    wait(provider.reached, "the turn mid-answer")
    other = create_agent(provider=ScriptedProvider(default="x"),
                         store=make_store(kind, tmp_path)).session(id="s1")
    info = other.current_turn()
    assert info is not None
    assert (info.turn_id, info.status) == (run.turn_id, "running")
    assert info.owner.split(":")[1] == str(os.getpid())
    gate.set()
    run.result(timeout=CHILD_TIMEOUT)
    assert other.current_turn() is None


def test_an_encrypted_stores_events_are_encrypted_at_rest(tmp_path: Path) -> None:
    import sqlite3

    store = make_store("encrypted-sqlite", tmp_path)
    agent = create_agent(provider=ScriptedProvider([Step(chunks=["secret ", "plans"])]),
                         store=store)
    session = agent.session(id="s1")
    run = session.start("tell me")
    assert "".join(e.text for e in run if e.type == "text.delta") == "secret plans"
    assert [e.type for e in session.attach(run.turn_id, after=-1)][-1] == "run.done"
    raw = sqlite3.connect(tmp_path / "agent.db")
    rows = raw.execute("SELECT data FROM lousho_events").fetchall()
    raw.close()
    assert rows
    assert not any("secret" in r[0] or "tell me" in r[0] for r in rows)
