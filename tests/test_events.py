"""Detached turns and the event log (issue 29): ``Session.start``, ``Session.attach`` from
another process, ``current_turn``, event ids, coalescing and retention, on every store kind
that has a log readers in other processes can see."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from conftest import CHILD_TIMEOUT, STORE_KINDS, wait
from crash_child import make_store
from events_child import GatedProvider, line_of

from lousho_sync import (
    InvalidInputError,
    MemorySessionStore,
    ScriptedProvider,
    Step,
    StepReset,
    TextDelta,
    TurnNotFoundError,
    _detached,
    create_agent,
    event_id,
    parse_event_id,
)
from lousho_sync._event_rows import encode, encode_rows, events_of
from lousho_sync._eventlog import EventLog
from lousho_sync.errors import StoreUnavailableError
from lousho_sync.sqlite import SqliteStore
from lousho_sync.stores._events import MemoryEventOps, TurnHead, event_ops_of, live_of
from lousho_sync.stores._sqlite_events import SqliteEventOps
from lousho_sync.stores.base import StoreCapabilities

HERE = Path(__file__).resolve().parent
CROSS_PROCESS_KINDS = [*STORE_KINDS, "encrypted-sqlite"]
WAIT_OUTAGE = CHILD_TIMEOUT  # (a takeover tries its first write ~3 s; readers try again)
ANSWER = "The quick brown fox jumps over the lazy dog, again and again, until the end."


class Child:
    """A child process of events_child.py whose stdout lines a thread collects."""

    def __init__(self, *args: str, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "events_child.py"), *args],
            stdin=subprocess.PIPE if args[0] == "serve" else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONPATH": str(HERE.parent), **env},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def line(self) -> Any:
        """The next line, as JSON (fails when the child says nothing in time or ended)."""
        line = self.lines.get(timeout=CHILD_TIMEOUT)
        assert line is not None, self.stderr()
        return json.loads(line)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def close(self) -> None:
        """Close its stdin (a serving child then ends) and reap it."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=CHILD_TIMEOUT)  # reaped: its pid is gone


def child(*args: str, **env: str) -> Child:
    return Child(*args, **env)


def finish(proc: Child) -> list[dict[str, Any]]:
    """The child's remaining JSON lines (it must exit 0)."""
    out = []
    while True:
        line = proc.lines.get(timeout=CHILD_TIMEOUT)
        if line is None:
            break
        if line:
            out.append(json.loads(line))
    assert proc.proc.wait(timeout=CHILD_TIMEOUT) == 0, proc.stderr()
    return out


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
def test_the_turn_is_over_for_current_turn_once_its_end_was_read_or_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the driving process reads run.done (and result() returns) only once the store says the
    # turn ended, even when the store failed the writes of that end a few times
    store = SqliteStore(tmp_path / "agent.db")
    ops = store.sessions.event_ops()
    real_append = ops.append
    failed: list[str] = []

    def append(turn_id: str, rows: Any, **kw: Any) -> bool:
        if kw["status"] == "done" and len(failed) < 3:
            failed.append(turn_id)
            raise StoreUnavailableError("the store is away for a moment")
        return real_append(turn_id, rows, **kw)

    monkeypatch.setattr(ops, "append", append)
    agent = create_agent(provider=ScriptedProvider([Step(chunks=["one ", "two"])]),
                         store=store)
    session = agent.session(id="s1")
    session.event_interval_s = 60.0  # the writer makes no retry of its own before the end
    run = session.start("hi")
    turn_id, seq = run.turn_id, -1
    for event in run:
        seq = event.seq
        if event.type == "step.start":
            break
    events = list(session.attach(turn_id, after=seq))
    assert events[-1].type == "run.done" and session.current_turn() is None
    assert run.result(timeout=CHILD_TIMEOUT).text == "one two"
    assert session.current_turn() is None and len(failed) == 3
    store.close()


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
    publisher.flush()
    assert log.prune() == 0  # still running
    from lousho_sync import ExecutionResult, RunDone, Usage
    done = ExecutionResult(text="x", finish_reason="stop", messages=(), usage=Usage(),
                           steps=1, run_id="t1")
    publisher.publish(RunDone(run_id="t1", seq=1, finish_reason="stop", result=done))
    publisher.close()  # its last write made
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
        writes.append(sum(len(events_of(row, turn_id, seq, -1)) for seq, row in rows))
        append(turn_id, rows, **kw)

    ops.append = counting  # type: ignore[method-assign]
    run = session.start("hi")
    events = list(run)
    assert run.result().text == "x" * 1000
    non_delta = sum(1 for e in events if e.type != "text.delta")
    assert sum(writes) == len(events) == non_delta + 1000
    assert len(writes) <= non_delta  # the 1000 deltas went with the next event's write


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_started_runs_reader_gets_each_delta_at_once_whatever_the_interval(
    kind: str, tmp_path: Path
) -> None:
    """Readers in the driving process take the events as they are made, not when the
    coalesced write reaches the store: with an hour-long interval the text still streams,
    while the store keeps at most one write per non-delta event."""
    gate = threading.Event()
    provider = GatedProvider(ANSWER, 20, 10, gate)
    store = MemorySessionStore() if kind == "memory" else make_store(kind, tmp_path)
    session = create_agent(provider=provider, store=store).session(id="s1")
    session.event_interval_s = 3600.0
    run = session.start("hi")
    seen = ""
    events = iter(run)
    for event in events:
        if event.type == "text.delta":
            seen += event.text
            if len(seen) >= len("".join(provider.pieces[:10])):
                break  # ten pieces read while the model holds the rest
    assert seen == "".join(provider.pieces[:10])
    attached = session.attach(run.turn_id, after=-1)  # another reader of this process
    head = [e for _, e in zip(range(2 + 10), attached, strict=False)]
    assert "".join(e.text for e in head if isinstance(e, TextDelta)) == seen
    gate.set()
    rest = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert seen + rest == ANSWER == run.result(timeout=CHILD_TIMEOUT).text
    assert [e.type for e in session.attach(run.turn_id)][-1] == "run.done"


def test_a_long_turns_log_is_bounded_by_merging_old_deltas() -> None:
    ops = MemoryEventOps()
    log = EventLog(ops, interval_s=0.0, max_rows=100)
    publisher = log.begin("t1", "s1", "host:1:x")
    for seq in range(1000):
        publisher.publish(TextDelta(run_id="t1", seq=seq, text=str(seq % 10)))
        publisher.flush()  # one write per delta (interval 0): the log grows past its bound
    publisher.close()
    head = ops.head("t1")
    assert head is not None and head.rows <= 200 and head.last_seq == 999
    events = list(log.follow("t1", -1, idle=lambda h: True))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "".join(
        str(s % 10) for s in range(1000))
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs)) and seqs[-1] == 999


@pytest.mark.parametrize("kind", STORE_KINDS, indirect=True)
def test_a_write_of_many_events_is_one_row_read_back_event_by_event(
    kind: str, tmp_path: Path
) -> None:
    """A turn's write of its start, 500 deltas, usage and end is one row of the store; a
    reader after any seq gets exactly the events after it, each with its own seq."""
    from lousho_sync import RunDone, RunStart, UsageEvent
    from lousho_sync.messages import Message, Usage

    store = make_store(kind, tmp_path)
    ops = event_ops_of(getattr(store, "sessions", store))
    log = EventLog(ops, interval_s=3600.0)
    log.begin("t1", "s1", "host:1:x")
    events: list[Any] = [RunStart(run_id="t1", seq=0, session_id="s1",
                                  input=(Message("user", "hi"),))]
    events += [TextDelta(run_id="t1", seq=i, text=f"<{i}é\n>") for i in range(1, 501)]
    events += [UsageEvent(run_id="t1", seq=501, usage=Usage(input_tokens=3), total=Usage(
        input_tokens=3)), RunDone(run_id="t1", seq=502, finish_reason="stop", result=None)]
    written = encode_rows(events)  # what the turn's publisher writes at its turn's end
    assert ops.append("t1", written, owner="host:1:x", status="done", ended_at=time.time())
    rows = ops.read("t1", -1, 10_000)
    assert len(rows) == 1 and rows[0][0] == 502
    for after in (-1, 0, 1, 250, 500, 501):
        read = list(log.follow("t1", after))
        assert [e.seq for e in read] == list(range(after + 1, 503))
        assert [(e.type, getattr(e, "text", None)) for e in read] == [
            (e.type, getattr(e, "text", None)) for e in events[after + 1:]]
    assert list(log.follow("t1", 502)) == []


def test_a_damaged_row_of_a_write_is_named_not_misread(tmp_path: Path) -> None:
    from lousho_sync.errors import StoreCorruptError

    store = SqliteStore(tmp_path / "s.db")
    ops = event_ops_of(store.sessions)
    log = EventLog(ops)
    bad = [
        (7, '{"type":"events","first":3,"items":["a","b"]}'),  # ends at 4, stored under 7
        (8, '{"type":"events","first":8,"items":[5]}'),  # a number where an event is
        (9, '{"type":"events","first":9,"items":"ab"}'),
    ]
    for seq, row in bad:
        ops.drop("t1")
        log.begin("t1", "s1", "host:1:x")
        assert ops.append("t1", [(seq, row)], owner="host:1:x", status="running",
                          ended_at=None)
        with pytest.raises(StoreCorruptError, match=f"event t1:{seq} .*cannot be read"):
            list(log.follow("t1", -1))
    assert log.head("t1") is not None  # the row is left as it was


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
        assert p.line() == "READY"
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


# --- takeover -----------------------------------------------------------------------------------
def applied(lines: list[dict[str, Any]]) -> str:
    """What a reader shows after applying each ``step.reset`` (it drops the text of that
    step and of any later one)."""
    shown: list[tuple[int, str]] = []
    step = 0
    for e in lines:
        if e.get("type") == "step.start":
            step = e["step"]
        elif e.get("type") == "step.reset":
            shown = [(s, t) for s, t in shown if s < e["step"]]
            step = e["step"]
        elif e.get("type") == "text.delta":
            shown.append((step, e["text"]))
    return "".join(t for _, t in shown)


def crash_and_take_over(kind: str, root: Path, hold_after: int) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]]]:
    """A driver process SIGKILLed mid-answer (after ``hold_after`` pieces) and a reader in
    another process that takes the turn over: (the driver's lines, the reader's)."""
    driver = child("drive", kind, str(root), "s1", ANSWER, "40", str(hold_after))
    try:
        turn = driver.line()["turn"]
        seen: list[dict[str, Any]] = []
        while sum(1 for e in seen if e["type"] == "text.delta") < hold_after:
            seen.append(driver.line())
        reader = child("attach", kind, str(root), "s1", turn, "-1",
                       LOUSHO_TEST_ANSWER=ANSWER, LOUSHO_TEST_CHUNKS="40")
        assert reader.line() == "READY"
    finally:
        driver.kill()
    return seen, finish(reader)


@pytest.mark.parametrize("kind", CROSS_PROCESS_KINDS, indirect=True)
def test_a_reader_takes_over_a_turn_whose_driver_was_killed(kind: str, tmp_path: Path) -> None:
    _, lines = crash_and_take_over(kind, tmp_path, 12)
    _taken_over_once(kind, tmp_path, lines)


def lose_the_lease_and_take_over(kind: str, root: Path, *, host: str | None = None) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]]]:
    """A driver process whose lease (TTL 2 s) lapses mid-answer — SIGSTOPped past it, or, with
    ``host``, an owner naming another host (its pid means nothing here) SIGKILLed — and a
    reader in another process that takes the turn over once the lease expired; a stopped
    driver is then continued and goes on. (The driver's lines after it went on, the
    reader's.)"""
    go = root / "go-on"
    env = {"LOUSHO_TEST_LEASE_TTL_S": "2", "LOUSHO_TEST_GO_FILE": str(go),
           "LOUSHO_TEST_SAY_STORED": "1"}
    if host is not None:
        env["LOUSHO_TEST_HOST"] = host
    driver = child("drive", kind, str(root), "s1", ANSWER, "40", "12", **env)
    try:
        turn = driver.line()["turn"]
        seen: list[dict[str, Any]] = []
        # stopped once its held answer is in the log: not inside a write of its events
        # (see the note on SQLite below)
        while sum(1 for e in seen if e.get("type") == "text.delta") < 12 or not any(
                e.get("stored") for e in seen):
            seen.append(driver.line())
        if host is None:
            os.kill(driver.proc.pid, signal.SIGSTOP)
        else:
            driver.kill()  # gone, but its owner names another host: only the lease tells
        reader = child("attach", kind, str(root), "s1", turn, "-1",
                       LOUSHO_TEST_ANSWER=ANSWER, LOUSHO_TEST_CHUNKS="40")
        assert reader.line() == "READY"
        lines = finish(reader)  # the turn was taken over and finished
        if host is not None:
            return [], lines
        go.touch()
        os.kill(driver.proc.pid, signal.SIGCONT)
        rest = []
        while True:
            line = driver.line()
            rest.append(line)
            if line.get("end"):
                break
        assert driver.proc.wait(timeout=CHILD_TIMEOUT) == 0, driver.stderr()
        return rest, lines
    finally:
        if driver.proc.poll() is None:
            os.kill(driver.proc.pid, signal.SIGCONT)
            driver.kill()


def _taken_over_once(kind: str, root: Path, lines: list[dict[str, Any]]) -> None:
    assert lines[-1] == {"end": True, "result": ANSWER}
    events = lines[:-1]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(len(seqs)))  # in order, nothing missing, nothing twice
    assert events[-1]["type"] == "run.done"
    resets = [e for e in events if e["type"] == "step.reset"]
    assert len(resets) == 1 and resets[0]["step"] == 1
    assert applied(events) == ANSWER  # after applying step.reset: the committed answer
    session = create_agent(provider=ScriptedProvider(default="x"),
                           store=make_store(kind, root)).session(id="s1")
    assert [m.text for m in session.load()] == ["go", ANSWER]  # committed once
    assert session.pending() is None and session.current_turn() is None


class _BeginOutage:
    """SqliteEventOps.begin failing as an unreachable store's write does: the first
    ``times`` calls (None: until :meth:`end`), each counted; the rest write."""

    def __init__(self, times: int | None) -> None:
        self.times = times
        self.failed = 0
        self.gave_up = threading.Event()  # one whole takeover's tries failed
        self._real = SqliteEventOps.begin

    def begin(self, ops: SqliteEventOps, head: Any) -> None:
        if self.times is None or self.failed < self.times:
            self.failed += 1
            if self.failed % (len(_detached._BEGIN_RETRY_S) + 1) == 0:
                self.gave_up.set()
            raise StoreUnavailableError("the store is unreachable (a test's outage)")
        self._real(ops, head)

    def end(self) -> None:
        self.times = self.failed

    def install(self) -> Any:
        """The function to put in place of SqliteEventOps.begin."""
        return lambda ops, head: self.begin(ops, head)


def _killed_mid_answer(root: Path) -> str:
    """A SQLite driver process SIGKILLed after 12 of its 40 pieces: its turn id."""
    driver = child("drive", "sqlite", str(root), "s1", ANSWER, "40", "12")
    try:
        turn: str = driver.line()["turn"]
        seen: list[dict[str, Any]] = []
        while sum(1 for e in seen if e["type"] == "text.delta") < 12:
            seen.append(driver.line())
    finally:
        driver.kill()
    return turn


def test_a_takeover_whose_store_is_away_for_a_moment_tries_again_and_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    turn = _killed_mid_answer(tmp_path)
    outage = _BeginOutage(times=2)
    monkeypatch.setattr(SqliteEventOps, "begin", outage.install())
    session = create_agent(provider=GatedProvider(ANSWER, 40, -1),
                           store=make_store("sqlite", tmp_path)).session(id="s1")
    events = [line_of(e) for e in session.attach(turn, after=-1)]
    assert outage.failed == 2
    lines = [*events, {"end": True, "result": ANSWER}]
    _taken_over_once("sqlite", tmp_path, lines)


def test_a_takeover_whose_store_stays_away_leaves_the_turn_pending_for_a_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    turn = _killed_mid_answer(tmp_path)
    outage = _BeginOutage(times=None)
    monkeypatch.setattr(SqliteEventOps, "begin", outage.install())
    session = create_agent(provider=GatedProvider(ANSWER, 40, -1),
                           store=make_store("sqlite", tmp_path)).session(id="s1")
    read: list[Any] = []
    reader = threading.Thread(target=lambda: read.extend(session.attach(turn, after=-1)),
                              daemon=True)
    reader.start()
    assert outage.gave_up.wait(WAIT_OUTAGE)  # one takeover tried its every write, and gave up
    for thread in threading.enumerate():  # and has ended
        if thread.name == f"lousho-takeover-{turn[:8]}":
            thread.join(WAIT_OUTAGE)
    pending = session.pending()  # the turn is kept, not dropped as an aborted one
    assert pending is not None and pending.status == "interrupted"
    assert [m.text for m in session.load()] == []
    outage.end()  # the store is back: the reader's next takeover finishes the turn
    reader.join(WAIT_OUTAGE)
    assert not reader.is_alive()
    lines = [*(line_of(e) for e in read), {"end": True, "result": ANSWER}]
    _taken_over_once("sqlite", tmp_path, lines)


# A driver stopped (SIGSTOP) past its lease, between its writes: it must hold nothing a
# takeover needs. PostgreSQL kept the rows of a transaction whose client stopped mid-way
# locked (a pipeline mid-way is not even "idle in transaction"): the event log's writes are
# one statement each, and PostgresStore has the server end a session idle in a
# transaction. SQLite's write lock is the file's: the event writes are one statement each
# (no transaction left open across Python code), but a driver stopped inside a statement's
# own run still holds the lock, and every writer, the takeover too, waits until it goes on
# or dies (documented); so the driver is stopped once its events are stored. Redis holds
# no lock across a stopped client.
@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres", "encrypted-sqlite"],
                         indirect=True)
def test_a_reader_takes_over_a_turn_whose_driver_was_stopped_past_its_lease(
    kind: str, tmp_path: Path
) -> None:
    """(The file store's lease is an OS lock that a stopped process keeps: there a stopped
    driver's turn waits for it, and a killed one's is taken over at once.)"""
    rest, lines = lose_the_lease_and_take_over(kind, tmp_path)
    _taken_over_once(kind, tmp_path, lines)
    # the stopped driver, continued, found its lease gone: it committed nothing
    assert rest[-1] == {"end": True, "error": "LOUSHO_LEASE_LOST"}


def test_a_reader_takes_over_a_turn_whose_lease_owner_on_another_host_stopped_renewing(
    tmp_path: Path,
) -> None:
    _, lines = lose_the_lease_and_take_over("sqlite", tmp_path, host="another-host")
    _taken_over_once("sqlite", tmp_path, lines)


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"], indirect=True)
def test_current_turn_says_interrupted_once_a_stopped_drivers_lease_lapsed(
    kind: str, tmp_path: Path
) -> None:
    """A driver alive on this host but stopped past its lease (TTL 2 s): the turn is
    "interrupted" as soon as the lease lapsed, not only once the process is gone."""
    driver = child("drive", kind, str(tmp_path), "s1", ANSWER, "40", "12",
                   LOUSHO_TEST_LEASE_TTL_S="2")
    try:
        turn = driver.line()["turn"]
        while driver.line()["type"] != "text.delta":
            pass  # the turn holds its lease and wrote events
        other = create_agent(provider=ScriptedProvider(default="x"), store=make_store(
            kind, tmp_path)).session(id="s1", lease_ttl_s=2.0)  # the TTL the driver uses
        info = other.current_turn()
        assert info is not None and (info.turn_id, info.status) == (turn, "running")
        os.kill(driver.proc.pid, signal.SIGSTOP)
        # nothing says when a lease lapses but its clock: ask until it has (the driver
        # stays stopped, so "running" can only turn into "interrupted")
        deadline = time.monotonic() + CHILD_TIMEOUT
        while (info := other.current_turn()) is not None and info.status == "running":
            assert time.monotonic() < deadline, "the stopped driver's lease never lapsed"
            threading.Event().wait(0.05)
        assert info is not None and (info.turn_id, info.status) == (turn, "interrupted")
        assert info.owner.split(":")[1] == str(driver.proc.pid)  # alive, but stopped
    finally:
        driver.kill()


def test_lousho_aio_start_attach_and_current_turn() -> None:
    import asyncio

    import lousho_aio

    async def main() -> None:
        gate = threading.Event()
        agent = lousho_aio.create_agent(provider=GatedProvider(ANSWER, 10, 3, gate),
                                        store=MemorySessionStore())
        session = agent.session(id="s1")
        run = await session.start("hi")
        assert run.detached
        async for event in run:
            if event.type == "text.delta":
                break  # leaving the loop does not abort a started run
        info = await session.current_turn()
        assert info is not None and info.turn_id == run.turn_id and info.status == "running"
        gate.set()
        assert (await run.result()).text == ANSWER
        texts = [e.text async for e in session.attach(run.turn_id, after=-1)
                 if e.type == "text.delta"]
        assert "".join(texts) == ANSWER
        assert await session.current_turn() is None

    asyncio.run(main())


def test_lousho_aio_attach_reads_the_store_in_the_pool_while_the_loop_goes_on() -> None:
    """A store read that waits does not stop the event loop: ``attach()`` returns at once,
    its read happens in the pool, and another coroutine runs (and here lets the read go
    on) meanwhile."""
    import asyncio

    import lousho_aio

    gate = threading.Event()
    on_loop: list[bool] = []

    class SlowOps(MemoryEventOps):
        slow = False

        def head(self, turn_id: str) -> TurnHead | None:
            if self.slow:
                try:
                    asyncio.get_running_loop()
                    on_loop.append(True)
                except RuntimeError:
                    on_loop.append(False)
                assert gate.wait(CHILD_TIMEOUT), "the read waited on the event loop"
            return super().head(turn_id)

    class SlowStore(MemorySessionStore):
        def __init__(self) -> None:
            super().__init__()
            self.ops = SlowOps()

        @property
        def capabilities(self) -> StoreCapabilities:  # adds an event log of its own
            return attrs.evolve(super().capabilities, events=True)

        def event_ops(self) -> SlowOps:
            return self.ops

    store = SlowStore()

    async def main() -> None:
        agent = lousho_aio.create_agent(provider=ScriptedProvider(default=ANSWER), store=store)
        session = agent.session(id="s1")
        run = await session.start("hi")
        await run.result()
        store.ops.slow = True
        order: list[str] = []

        async def other() -> None:
            await asyncio.sleep(0)
            order.append("other ran")
            gate.set()  # the store answers

        attached = session.attach(run.turn_id)  # reads nothing yet
        others = asyncio.ensure_future(other())
        texts = [e.text async for e in attached if e.type == "text.delta"]
        order.append("read")
        await others
        assert "".join(texts) == ANSWER
        assert order == ["other ran", "read"]
        with pytest.raises(TurnNotFoundError):
            async for _ in session.attach("no-such-turn"):
                pass

    asyncio.run(main())
    assert on_loop and not any(on_loop)  # every read of the store was in the pool


@pytest.mark.parametrize("kind", CROSS_PROCESS_KINDS, indirect=True)
def test_store_prune_removes_the_events_of_turns_ended_past_the_ttl(
    kind: str, tmp_path: Path
) -> None:
    import time

    from lousho_sync.stores._events import TurnHead
    from lousho_sync.stores.files import FileStore

    store = FileStore(tmp_path / "fs") if kind == "files" else make_store(kind, tmp_path)
    agent = create_agent(provider=ScriptedProvider(default="ok"), store=store)
    session = agent.session(id="s1")
    recent = session.start("hi")
    recent.result(timeout=CHILD_TIMEOUT)
    ops = event_ops_of(store.sessions)
    old = TurnHead(turn_id="old-turn", session_id="s2", owner="h:1:x",
                   started_at=time.time() - 7200)
    ops.begin(old)
    ops.append("old-turn", [(0, '{"type":"text.delta","text":"x"}')], owner="h:1:x",
               status="done", ended_at=time.time() - 3600)
    store.prune(older_than_s=86400)
    assert ops.head("old-turn") is None and ops.read("old-turn", -1, 10) == []
    assert ops.head(recent.turn_id) is not None  # ended now: kept event_ttl_s
    assert [e.type for e in session.attach(recent.turn_id)][-1] == "run.done"


def test_a_paused_turn_ends_its_readers_and_is_reported_paused(tmp_path: Path) -> None:
    from lousho_sync import tool

    @tool(needs_approval=True)
    def transfer(amount: float) -> str:
        """Send money."""
        return f"sent {amount}"

    provider = ScriptedProvider([Step(tool_calls=[("transfer", {"amount": 5})]), "Done."])
    agent = create_agent(provider=provider, tools=[transfer],
                         store=make_store("sqlite", tmp_path))
    session = agent.session(id="s1")
    run = session.start("pay")
    types = [e.type for e in session.attach(run.turn_id)]
    assert types[-2:] == ["approval.requested", "run.done"]
    result = run.result(timeout=CHILD_TIMEOUT)
    assert result.finish_reason == "awaiting-approval"
    info = session.current_turn()
    assert info is not None and (info.turn_id, info.status) == (run.turn_id, "paused")
    agent.approvals.resolve(id=result.approval_id or "", approved=True)
    assert session.current_turn() is None
    assert [m.text for m in session.load()][-1] == "Done."


def test_a_takeover_goes_on_after_rows_written_past_the_head(tmp_path: Path) -> None:
    """A driver killed between writing rows and updating its head (files: two writes)."""
    import time

    from lousho_sync.stores._events import TurnHead
    from lousho_sync.stores._lease import HOST

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process that existed and is dead: its pid is free
    owner = f"{HOST}:{gone.pid}:dead"
    store = make_store("files", tmp_path)
    ops = event_ops_of(store.sessions)
    ops.begin(TurnHead(turn_id="t1", session_id="s1", owner=owner, started_at=time.time()))
    rows = [(0, '{"type":"step.start","step":1}'), (1, '{"type":"text.delta","text":"a"}')]
    ops.append("t1", rows[:1], owner=owner, status="running", ended_at=None)
    (tmp_path / "sessions" / ".events" / "t1.log").open("a").write(f"1 {rows[1][1]}\n")
    assert ops.head("t1").last_seq == 0  # type: ignore[union-attr]
    session = create_agent(provider=ScriptedProvider(default="x"), store=store).session(id="s1")
    events = list(session.attach("t1"))  # taken over: nothing was recorded, so it failed
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.type for e in events][-2:] == ["error", "run.done"]


def _dead_owner() -> str:
    from lousho_sync.stores._lease import HOST

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process that existed and is dead: its pid is free
    return f"{HOST}:{gone.pid}:dead"


def _died_before_its_last_events(store: Any, turn_id: str, rows: list[Any], owner: str) -> None:
    """The log of ``turn_id`` as its driver left it when killed: ``rows``, still running."""
    import time

    from lousho_sync.stores._events import TurnHead

    ops = event_ops_of(store.sessions)
    ops.drop(turn_id)
    ops.begin(TurnHead(turn_id=turn_id, session_id="s1", owner=owner, started_at=time.time()))
    ops.append(turn_id, rows, owner=owner, status="running", ended_at=None)


def test_a_takeover_finds_a_committed_turn_by_its_id_not_by_its_input(tmp_path: Path) -> None:
    """The driver died after its commit, before its last events: the reader that takes the
    turn over gets that turn's answer, even when a later turn had the same input."""
    import gc

    store = make_store("sqlite", tmp_path)
    provider = ScriptedProvider([Step(text="one"), Step(text="two"), Step(text="three")])
    session = create_agent(provider=provider, store=store).session(id="s1")
    session.send("hi")
    run = session.start("hi")
    assert run.result(timeout=CHILD_TIMEOUT).text == "two"
    turn_id = run.turn_id
    (seq, row), = event_ops_of(store.sessions).read(turn_id, -1, 1)  # its first write
    start = events_of(row, turn_id, seq, -1)[0]
    assert start.type == "run.start"
    first = [(0, encode(start))]
    del run
    gc.collect()  # no handle of the turn in this process: readers read the log
    session.send("hi")  # the same input again, committed after it
    _died_before_its_last_events(store, turn_id, first, _dead_owner())
    events = list(session.attach(turn_id))
    assert [e.type for e in events] == ["run.start", "step.reset", "text.delta", "run.done"]
    assert events[2].text == "two" and events[-1].result.text == "two"  # type: ignore[union-attr]
    assert [m.text for m in session.load()] == ["hi", "one", "hi", "two", "hi", "three"]


def test_a_lost_turn_is_not_mistaken_for_a_committed_turn_with_the_same_input(
    tmp_path: Path,
) -> None:
    from lousho_sync import Message, RunStart
    from lousho_sync._event_rows import encode
    from lousho_sync.control import new_id

    store = make_store("sqlite", tmp_path)
    session = create_agent(provider=ScriptedProvider([Step(text="one")]),
                           store=store).session(id="s1")
    session.start("hi").result(timeout=CHILD_TIMEOUT)
    lost = new_id()  # started with the same input; its driver died before recording it
    start = RunStart(run_id=lost, seq=0, session_id="s1", input=(Message("user", "hi"),))
    _died_before_its_last_events(store, lost, [(0, encode(start))], _dead_owner())
    events = list(session.attach(lost))
    assert [e.type for e in events] == ["run.start", "error", "run.done"]
    assert "was lost" in str(events[1].error)  # type: ignore[union-attr]
    assert [m.text for m in session.load()] == ["hi", "one"]


def test_a_turn_logged_by_an_older_release_is_still_found_by_its_input(tmp_path: Path) -> None:
    """A log row without the commit seal's mark (written before commits recorded their
    turn): the committed turn is still recognised at the transcript's tail."""
    from lousho_sync.control import new_id

    store = make_store("sqlite", tmp_path)
    session = create_agent(provider=ScriptedProvider([Step(text="answer")]),
                           store=store).session(id="s1")
    session.send("hi")  # committed without a seal, as an older release did
    old = new_id()
    row = json.dumps({"type": "run.start", "session_id": "s1",
                      "input": [{"role": "user", "content": "hi"}]})
    _died_before_its_last_events(store, old, [(0, row)], _dead_owner())
    events = list(session.attach(old))
    assert [e.type for e in events] == ["run.start", "step.reset", "text.delta", "run.done"]
    assert events[-1].result.text == "answer"  # type: ignore[union-attr]


# --- the live tail (Redis, PostgreSQL) ------------------------------------------------------------
LIVE_KINDS = ["redis", "postgres", "encrypted-redis", "encrypted-postgres"]


def _ops_of(store: Any) -> Any:
    return event_ops_of(store.sessions if hasattr(store, "sessions") else store)


class RawChannel:
    """Every live message of the turns of the store of ``kind`` under ``root``, read on a
    connection of the test's own (Redis ``PSUBSCRIBE``, PostgreSQL ``LISTEN``) from its
    creation to a sentinel the test sends last (messages come in the order sent, so the
    sentinel comes after anything sent before it)."""

    def __init__(self, kind: str, root: Path) -> None:
        self.base = kind.removeprefix("encrypted-")
        self.live = live_of(_ops_of(make_store(self.base, root)))
        assert self.live is not None
        if self.base == "redis":
            import redis

            self.raw: Any = redis.Redis.from_url(os.environ["LOUSHO_TEST_REDIS_URL"])
            self.sub = self.raw.pubsub()
            self.sub.psubscribe(self.live.channel("*"))  # type: ignore[attr-defined]
            while True:  # subscribed once confirmed
                m = self.sub.get_message(timeout=CHILD_TIMEOUT)
                assert m is not None, "the subscription was never confirmed"
                if m["type"] == "psubscribe":
                    break
        else:
            import psycopg

            self.channel = self.live.channel  # type: ignore[attr-defined]
            self.raw = psycopg.connect(os.environ["LOUSHO_TEST_POSTGRES_URL"], autocommit=True)
            self.raw.execute(f'LISTEN "{self.channel}"')

    def messages(self, turn_id: str) -> list[str]:
        """The messages on ``turn_id``'s channel (PostgreSQL: its payloads; Redis: what it
        publishes, rows and the log's ``w``) up to now."""
        out: list[str] = []
        if self.base == "redis":
            mine, end = self.live.channel(turn_id), self.live.channel("end")  # type: ignore
            self.raw.publish(end, "end")
            while True:
                m = self.sub.get_message(timeout=CHILD_TIMEOUT)
                assert m is not None, "the sentinel never came"
                if m["type"] != "pmessage":
                    continue
                if m["channel"].decode() == end:
                    break
                if m["channel"].decode() == mine:
                    out.append(m["data"].decode())
            self.sub.close()
            self.raw.close()
            return out
        self.raw.execute("SELECT pg_notify(%s, 'end')", (self.channel,))
        for note in self.raw.notifies(timeout=CHILD_TIMEOUT):
            if note.payload == "end":
                break
            if note.payload.startswith(turn_id + " "):
                out.append(note.payload)
        else:
            raise AssertionError("the sentinel never came")
        self.raw.close()
        return out


def _deltas(reader: Child, n: int) -> list[dict[str, Any]]:
    """The reader's lines up to its ``n``-th text delta."""
    lines: list[dict[str, Any]] = []
    while sum(1 for e in lines if e.get("type") == "text.delta") < n:
        lines.append(reader.line())
    return lines


@pytest.mark.parametrize("kind", LIVE_KINDS, indirect=True)
def test_a_reader_in_another_process_gets_the_deltas_the_log_has_not_got_yet(
    kind: str, tmp_path: Path
) -> None:
    # the log is written at the turn's end only (interval 60 s): the reader has the first
    # deltas while the model is held mid-answer, from the live tail, then the rest and
    # run.done from the log, each event once, in order
    raw = RawChannel(kind, tmp_path)
    gate = threading.Event()
    provider = GatedProvider(ANSWER, 40, 12, gate)
    store = make_store(kind, tmp_path)
    session = create_agent(provider=provider, store=store).session(id="s1")
    session.event_interval_s = 60.0
    run = session.start("hi")
    wait(provider.reached, "the turn mid-answer")
    reader = child("attach", kind, str(tmp_path), "s1", run.turn_id, "-1")
    assert reader.line() == "READY"
    first = _deltas(reader, 12)
    assert _ops_of(store).read(run.turn_id, -1, 100) == []  # the log has none of them yet
    gate.set()
    rest = finish(reader)
    assert run.result(timeout=CHILD_TIMEOUT).text == ANSWER
    assert rest[-1] == {"end": True, "result": ANSWER}
    lines = first + rest[:-1]
    assert [e["seq"] for e in lines] == list(range(len(lines)))  # once each, in order
    assert lines[-1]["type"] == "run.done"
    assert text_of(lines) == ANSWER
    assert [m.text for m in session.load()] == ["hi", ANSWER]
    # a reader of the log afterwards sees the identical sequence
    assert [(e.type, e.seq) for e in session.attach(run.turn_id)] == [
        (e["type"], e["seq"]) for e in lines]
    sent = [m for m in raw.messages(run.turn_id) if m != "w"]
    assert sent  # they came live
    plain = [m for m in sent if '"type":' in m or '"items":' in m]  # an event's JSON
    assert bool(plain) is not kind.startswith("encrypted-")  # sealed like the log's rows


@pytest.mark.parametrize("kind", ["redis", "postgres"], indirect=True)
def test_nothing_is_sent_live_for_a_turn_no_reader_watches(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = RawChannel(kind, tmp_path)
    gate = threading.Event()
    provider = GatedProvider(ANSWER, 40, 12, gate)
    store = make_store(kind, tmp_path)
    live = live_of(_ops_of(store))
    assert live is not None
    told_no = threading.Event()
    asked = live.watched

    def watched(turn_id: str, *, ask: bool = False) -> bool:
        out = asked(turn_id, ask=ask)
        if ask and not out:
            told_no.set()
        return out

    monkeypatch.setattr(live, "watched", watched)
    session = create_agent(provider=provider, store=store).session(id="s1")
    session.event_interval_s = 60.0  # the writer asks whether a reader watches, each second
    run = session.start("hi")
    wait(provider.reached, "the turn mid-answer")
    wait(told_no, "the writer asking whether the turn is watched while its deltas wait")
    gate.set()
    assert run.result(timeout=CHILD_TIMEOUT).text == ANSWER
    assert raw.messages(run.turn_id) == []


@pytest.mark.parametrize("kind", ["redis", "postgres"], indirect=True)
def test_a_takeover_numbers_its_events_after_those_its_readers_got_live(
    kind: str, tmp_path: Path
) -> None:
    # the driver dies with deltas its reader got live but the log never got: the turn,
    # taken over by that reader, goes on after them (step.reset first), not over them
    driver = child("drive", kind, str(tmp_path), "s1", ANSWER, "40", "12",
                   LOUSHO_TEST_EVENT_INTERVAL_S="60")
    try:
        turn = driver.line()["turn"]
        _deltas(driver, 12)
        reader = child("attach", kind, str(tmp_path), "s1", turn, "-1",
                       LOUSHO_TEST_ANSWER=ANSWER, LOUSHO_TEST_CHUNKS="40")
        assert reader.line() == "READY"
        first = _deltas(reader, 12)
        assert _ops_of(make_store(kind, tmp_path)).read(turn, -1, 100) == []
    finally:
        driver.kill()
    lines = first + finish(reader)
    _taken_over_once(kind, tmp_path, lines)
    assert text_of(first) == ANSWER[:len(text_of(first))]


class _ScriptedTail:
    """A live tail that hands out scripted batches, each after its side effect (a write to
    the log), and says when it was closed."""

    def __init__(self, script: list[tuple[Any, list[Any]]]) -> None:
        self.script = script
        self.closed = False

    def get(self, after: int, timeout: float) -> list[Any]:
        assert self.script, f"the reader waited for more after seq {after}"
        effect, batch = self.script.pop(0)
        if effect is not None:
            effect()
        return batch

    def close(self) -> None:
        self.closed = True


def test_a_reader_merges_the_live_tail_with_the_log_once_each_in_order() -> None:
    from lousho_sync import RunDone, RunStart, StepStart

    turn = "t1"
    events: list[Any] = [RunStart(run_id=turn, seq=0, session_id="s1", input=()),
                         StepStart(run_id=turn, seq=1, step=1),
                         *(TextDelta(run_id=turn, seq=i, text=f"<{i}>") for i in range(2, 10)),
                         RunDone(run_id=turn, seq=10, finish_reason="stop", result=None)]

    def rows(lo: int, hi: int) -> list[tuple[int, str]]:
        return encode_rows(events[lo:hi + 1])

    ops = MemoryEventOps()
    ops.begin(TurnHead(turn_id=turn, session_id="s1", owner="o", started_at=0.0))

    def write(lo: int, hi: int) -> Any:
        return lambda: ops.append(turn, rows(lo, hi), owner="o", status="running",
                                  ended_at=None)

    write(0, 1)()
    tail = _ScriptedTail([
        (None, [*rows(2, 3)]),  # follows on from the log: at once
        (None, [*rows(2, 3), *rows(6, 7)]),  # had it; a gap (4, 5 not come): waits
        (write(2, 5), [None]),  # the log has 4 and 5: then 6, 7 from the tail
        (None, [*rows(8, 10)]),  # 8, 9 from the tail, run.done only from the log
        (write(6, 10), [None]),
    ])

    class Live:
        def tail(self, turn_id: str) -> _ScriptedTail:
            return tail

    ops.live = Live()  # type: ignore[attr-defined]
    log = EventLog(ops, poll_s=CHILD_TIMEOUT)
    got = []
    for event in log.follow(turn, -1):
        if event.type == "run.done":
            assert ops.read(turn, 9, 10)  # taken from the log
        got.append(event)
    assert [(e.type, e.seq) for e in got] == [(e.type, e.seq) for e in events]
    assert [e.text for e in got if e.type == "text.delta"] == [f"<{i}>" for i in range(2, 10)]
    assert tail.script == [] and tail.closed
    # a reader that leaves its loop unsubscribes
    tail = _ScriptedTail([(None, [])])
    reading = log.follow(turn, 3)
    assert next(reading).seq == 4
    reading.close()
    assert tail.closed


@pytest.mark.parametrize("kind", ["redis", "postgres"], indirect=True)
def test_a_live_send_is_fenced_by_the_owner_and_a_takeover_keeps_its_last_seq(
    kind: str, tmp_path: Path
) -> None:
    raw = RawChannel(kind, tmp_path)
    ops = _ops_of(make_store(kind, tmp_path))
    live = live_of(ops)
    assert live is not None
    turn = "live-fence-1"

    def row(seq: int, text: str = "x") -> list[tuple[int, str]]:
        return [(seq, encode(TextDelta(run_id=turn, seq=seq, text=text)))]

    head = TurnHead(turn_id=turn, session_id="s1", owner="a", started_at=0.0)
    ops.begin(head)
    live.mark(turn)  # type: ignore[attr-defined]  # (what a reader's tail does)
    live.send(turn, row(0), owner="a")
    live.send(turn, row(1), owner="b")  # not the owner: nothing
    ops.begin(attrs.evolve(head, owner="b"))  # a takeover
    assert live.sent(turn) == 0  # what readers may have seen, though the log has none
    live.send(turn, row(2), owner="a")  # the old owner: nothing
    live.send(turn, row(3), owner="b")
    # too large for a NOTIFY (PostgreSQL): neither it nor what follows it is sent
    live.send(turn, [*row(4, "y" * 9000), *row(5)], owner="b")
    sent = [m.removeprefix(turn + " ") for m in raw.messages(turn) if m != "w"]
    seqs = [int(m.split(" ", 1)[0]) for m in sent]
    assert seqs == ([0, 3, 4, 5] if kind == "redis" else [0, 3])
    assert live.sent(turn) == max(seqs)
