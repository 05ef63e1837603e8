"""The session mailbox (SPEC §17): ``"queue"``, ``"rollback"`` and ``abort_turn()`` from a
process that does not own the running turn, with real processes sharing one store."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CHILD_TIMEOUT, read_line
from crash_child import make_store

from lousho_sync import ModelRequest, ScriptedProvider, Step, create_agent, tool
from lousho_sync._mailbox import mail_key, post_abort, post_input, register
from lousho_sync.control import TurnControl
from lousho_sync.messages import Message
from lousho_sync.stores._lease import HOST, make_owner
from lousho_sync.stores._mail import MailOps, MailPush
from lousho_sync.stores.memory import memory_store

HERE = Path(__file__).resolve().parent
MAILBOX_KINDS = ["sqlite", "files", "redis", "postgres", "encrypted-sqlite"]  # with a mailbox
PUSH_KINDS = ["redis", "postgres"]  # the shared stores that wake the owner (not polled)


def _spawn(role: str, kind: str, root: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, str(HERE / "mail_child.py"), role, kind, str(root)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert read_line(p) == "ready", p.stderr.read() if p.stderr else ""
    return p


def _go(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.write("go\n")
    p.stdin.flush()


def _result(p: subprocess.Popen[str]) -> Any:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _owner_in_tool(kind: str, root: Path, role: str = "owner") -> subprocess.Popen[str]:
    owner = _spawn(role, kind, root)
    _go(owner)
    assert read_line(owner) == "IN_TOOL"
    return owner


def _retry(role: str, kind: str, root: Path) -> Any:
    """Run ``role`` once more in a child of its own, after the others ended: its result."""
    retry = _spawn(role, kind, root)
    try:
        _go(retry)
        return _result(retry)
    finally:
        if retry.poll() is None:
            retry.kill()


def _with_owner(role: str, kind: str, root: Path, owner: str = "owner") -> tuple[Any, Any]:
    """The results of an ``owner`` process held in its tool and of a ``role`` process
    released then (both killed when the test fails)."""
    procs = [_owner_in_tool(kind, root, owner)]
    try:
        procs.append(_spawn(role, kind, root))
        _go(procs[1])
        return _result(procs[0]), _result(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _messages(kind: str, root: Path) -> list[tuple[str, str]]:
    store = make_store(kind, root)
    try:
        s = create_agent(provider=ScriptedProvider(default="x"), store=store).session(id="mailbox")
        return [(m.role, m.text) for m in s.messages]
    finally:
        _close(store)


def _lease_held(kind: str, root: Path) -> bool:
    store = make_store(kind, root)
    try:
        return bool(store.sessions.lease_held("mailbox"))
    finally:
        _close(store)


def _fence_token(kind: str, root: Path) -> Any:
    store = make_store(kind, root)
    try:
        return store.sessions.fence_token("mailbox")
    finally:
        _close(store)


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_queue_from_another_process_joins_the_running_turn(kind: str, tmp_path: Path) -> None:
    a, b = _with_owner("queue", kind, tmp_path)
    assert a["text"] == "saw: A,B" and a["joined"] is False
    assert b["joined"] is True and b["run_id"] == a["run_id"] and b["text"] == a["text"]
    assert b["messages"] == a["messages"]
    # one turn: B's message after the step's tool result, then the answer that saw it
    assert _messages(kind, tmp_path) == [("user", "A"), ("assistant", ""), ("tool", "held"),
                                         ("user", "B"), ("assistant", "saw: A,B")]


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_a_stream_that_joins_another_process_turn_yields_it_from_the_join_on(
    kind: str, tmp_path: Path
) -> None:
    # A's turn is a plain send() (it writes no event log of its own): B's stream reads it
    # from B's input on, as that turn's events, to its end
    a, b = _with_owner("streamqueue", kind, tmp_path)
    assert b["joined"] is True and b["run_id"] == a["run_id"] and b["text"] == a["text"]
    events = b["events"]
    types = [e["type"] for e in events]
    assert types[0] == "input.queued" and events[0]["input"] == ["B"]
    assert types[1] == "input.applied" and events[1]["input"] == ["B"]
    assert types[-1] == "run.done" and "step.start" in types and "usage" in types
    assert "".join(e["text"] for e in events if e["type"] == "text.delta") == "saw: A,B"
    assert {e["run_id"] for e in events} == {a["run_id"]}
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs))
    assert _messages(kind, tmp_path) == [("user", "A"), ("assistant", ""), ("tool", "held"),
                                         ("user", "B"), ("assistant", "saw: A,B")]


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_a_joined_turn_keeps_the_lease_until_its_log_says_it_ended(
    kind: str, tmp_path: Path
) -> None:
    """The owner committed the turn B's input joined and has not written its run.done to
    the log yet: the lease is still its, so B cannot take it, find its input committed and
    miss the turn it joined (it read only its own run.done)."""
    owner = _owner_in_tool(kind, tmp_path, "endowner")
    procs = [owner]
    try:
        procs.append(_spawn("streamqueue", kind, tmp_path))
        _go(procs[1])
        assert read_line(owner) == "ENDING"  # committed; its log's end not written yet
        assert _lease_held(kind, tmp_path)
        _go(owner)
        a, b = _result(owner), _result(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert b["joined"] is True and b["run_id"] == a["run_id"] and b["text"] == "saw: A,B"
    types = [e["type"] for e in b["events"]]
    assert types[0] == "input.queued" and types[-1] == "run.done"


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_rollback_from_another_process_drops_the_turn_and_runs_next(
    kind: str, tmp_path: Path
) -> None:
    a, b = _with_owner("rollback", kind, tmp_path)
    assert a["finish"] == "aborted" and b["text"] == "saw: B" and b["joined"] is False
    assert _messages(kind, tmp_path) == [("user", "B"), ("assistant", "saw: B")]


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_abort_turn_from_another_process_stops_the_turn(kind: str, tmp_path: Path) -> None:
    a, b = _with_owner("abort", kind, tmp_path)
    assert b == {"asked": True} and a["finish"] == "aborted"
    assert _messages(kind, tmp_path) == []
    token = _fence_token(kind, tmp_path)
    idle = _spawn("abort", kind, tmp_path)  # no turn runs now: nothing to abort
    _go(idle)
    assert _result(idle) == {"asked": False}
    # asking took no lease: the fence token of the session is the one A's turn had
    assert _fence_token(kind, tmp_path) == token


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_abort_on_a_run_attached_in_another_process_stops_the_turn(
    kind: str, tmp_path: Path
) -> None:
    a, b = _with_owner("attachabort", kind, tmp_path, owner="startowner")
    assert a["finish"] == "aborted" and b == {"finish": "aborted"}
    assert _messages(kind, tmp_path) == []


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_steer_from_another_process_makes_a_silent_model_call_again(
    kind: str, tmp_path: Path
) -> None:
    owner = _spawn("steerowner", kind, tmp_path)
    procs = [owner]
    try:
        _go(owner)
        assert read_line(owner) == "IN_CALL"  # A's model call has emitted nothing yet
        procs.append(_spawn("steer", kind, tmp_path))
        _go(procs[1])
        a, b = _result(owner), _result(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert a["text"] == "saw: A,B" and b["joined"] is True and b["run_id"] == a["run_id"]
    assert _messages(kind, tmp_path) == [("user", "A"), ("user", "B"),
                                         ("assistant", "saw: A,B")]


# --- the mailbox primitives on every store ------------------------------------------------------
def _close(*stores: Any) -> None:
    for s in stores:
        close = getattr(s, "close", None)
        if close is not None:
            close()


@pytest.fixture
def two_views(kind: str, tmp_path: Path) -> Iterator[tuple[MailOps, MailOps]]:
    """The mailbox of one store as two processes see it: two store objects (the memory
    store's "processes" are threads and Session objects sharing one)."""
    if kind == "memory":
        ops = memory_store().sessions.mail_ops()
        yield ops, ops
        return
    a, b = make_store(kind, tmp_path), make_store(kind, tmp_path)
    try:
        yield a.sessions.mail_ops(), b.sessions.mail_ops()
    finally:
        _close(a, b)


@pytest.mark.parametrize("kind", ["memory", *MAILBOX_KINDS], indirect=True)
def test_each_mail_is_taken_once_in_arrival_order(two_views: tuple[MailOps, MailOps]) -> None:
    owner, poster = two_views
    before = owner.version()
    for n, sid in enumerate(["s1", "s2", "s1", "s1"]):
        poster.post(sid, f"mail:{n}", "queue", json.dumps(n), time.time())
    poster.post("s1", "mail:gone", "queue", "[]", time.time(), "a poster")
    assert [m.mail_id for m in owner.line("s1")] == ["mail:0", "mail:2", "mail:3", "mail:gone"]
    assert owner.line("s1")[-1].poster == "a poster"
    poster.drop("mail:gone", "s1")  # a poster that got the lease takes its mail back
    assert owner.version() != before  # what a polling owner checks
    barrier = threading.Barrier(4)
    got: list[list[str]] = []

    def take(ops: MailOps) -> None:
        barrier.wait()
        got.append([m.mail_id for m in ops.take(["s1", "s2"])])

    threads = [threading.Thread(target=take, args=(ops,)) for ops in (owner, poster) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    taken = [m for batch in got for m in batch]
    assert sorted(taken) == ["mail:0", "mail:1", "mail:2", "mail:3"]  # once each, none dropped
    for batch in got:  # every taker got its mail of s1 in arrival order
        s1 = [m for m in batch if m != "mail:1"]
        assert s1 == sorted(s1)
    assert owner.take(["s1", "s2"]) == []
    # taken mail stays in the line until its poster drops it
    assert [m.mail_id for m in poster.line("s1")] == ["mail:0", "mail:2", "mail:3"]


@pytest.mark.parametrize("kind", ["memory", *PUSH_KINDS], indirect=True)
def test_a_post_wakes_the_owner_with_its_session(two_views: tuple[MailOps, MailOps]) -> None:
    owner, poster = two_views
    assert isinstance(owner, MailPush)
    woken: list[str | None] = []
    listening, posted = threading.Event(), threading.Event()

    def wake(session_id: str | None) -> None:
        woken.append(session_id)
        (posted if session_id == "s9" else listening).set()

    stop = owner.subscribe(wake)
    try:
        assert listening.wait(CHILD_TIMEOUT)  # wake(None) first: look at everything
        poster.post("s9", "mail:9", "queue", "[]", time.time())
        assert posted.wait(CHILD_TIMEOUT)
    finally:
        stop()
    assert woken[0] is None and "s9" in woken


# --- wake-ups that are lost only delay ------------------------------------------------------------
def _queue_joins(kind: str, root: Path, store: Any, monkeypatch: pytest.MonkeyPatch,
                 between: Any = None) -> None:
    """A (on ``store``) runs a turn whose tool waits for input; once A's mailbox was looked
    at, ``between()`` runs and B (another store object, as another process) sends with
    "queue": B's message must join A's turn."""
    looked = threading.Event()
    ops = store.sessions.mail_ops()
    real_take = ops.take

    def take(session_ids: Any) -> Any:
        out = real_take(session_ids)
        looked.set()
        return out

    monkeypatch.setattr(ops, "take", take)
    holder: dict[str, Any] = {}

    @tool
    def hold() -> str:
        """Wait for another call's input."""
        control = holder["a"]._state.current.control
        assert looked.wait(CHILD_TIMEOUT)  # A's first look is over: B's mail comes later
        holder["in_tool"].set()
        control.offered.wait(CHILD_TIMEOUT)
        return "held"

    def answer(request: ModelRequest) -> Step | str:
        msgs = list(request.messages)
        if msgs[-1].role == "user" and msgs[-1].text == "A":
            return Step(tool_calls=[("hold", {})])
        return "saw: " + ",".join(m.text for m in msgs if m.role == "user")

    a_agent = create_agent(provider=ScriptedProvider(default=answer), tools=[hold],
                           store=store)
    b_store = make_store(kind, root)
    try:
        b = create_agent(provider=ScriptedProvider(default=answer),
                         store=b_store).session(id="lost", turn_policy="queue")
        a = holder["a"] = a_agent.session(id="lost")
        holder["in_tool"] = threading.Event()
        out: dict[str, Any] = {}
        t = threading.Thread(target=lambda: out.setdefault("a", a.send("A")))
        t.start()
        assert holder["in_tool"].wait(CHILD_TIMEOUT)
        if between is not None:
            between()
        r = b.send("B")
        t.join(CHILD_TIMEOUT)
    finally:
        _close(b_store)
    assert r.joined is True and out["a"].text == "saw: A,B" and r.run_id == out["a"].run_id


@pytest.mark.parametrize("kind", PUSH_KINDS, indirect=True)
def test_mail_whose_wake_up_is_lost_still_joins_the_turn(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(kind, tmp_path)
    ops = store.sessions.mail_ops()
    # every wake-up of A's mailbox is lost: only the fallback look finds B's mail
    monkeypatch.setattr(ops, "subscribe", lambda wake: lambda: None)
    try:
        _queue_joins(kind, tmp_path, store, monkeypatch)
    finally:
        _close(store)


@pytest.mark.parametrize("kind", PUSH_KINDS, indirect=True)
def test_mail_posted_while_the_wake_up_connection_is_down_joins_the_turn(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(kind, tmp_path)

    if kind == "postgres":  # the store's LISTEN connection is up (it tells its subscribers)
        up = threading.Event()
        stop = store.sessions.mail_ops().subscribe(lambda sid: up.set() if sid is None else None)
        assert up.wait(CHILD_TIMEOUT)
        stop()

    def cut() -> None:  # the server drops the connection the owner is woken through
        if kind == "redis":
            import redis

            raw = redis.Redis.from_url(request.getfixturevalue("redis_url"))
            try:  # every other client: the wake-up reader's and the stores' pooled ones
                raw.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            finally:
                raw.close()
        else:
            import psycopg

            with psycopg.connect(request.getfixturevalue("postgres_url"),
                                 autocommit=True) as c:
                n = c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                              "WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"
                              ).fetchone()
                assert n is not None and n[0] >= 1

    try:
        _queue_joins(kind, tmp_path, store, monkeypatch, between=cut)
    finally:
        _close(store)


# --- next turns in arrival order; the input of a sender that died -------------------------------
def _reap(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _line(kind: str, root: Path, label: str, policy: str = "line") -> subprocess.Popen[str]:
    """A process sending ``label`` with "queue" (or "rollback"); returns once its mail is in
    the mailbox."""
    p = _spawn(f"{policy}:{label}", kind, root)
    _go(p)
    assert read_line(p) == "POSTED"
    return p


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_inputs_waiting_for_the_lease_run_in_arrival_order(kind: str, tmp_path: Path) -> None:
    holder = _spawn("holder", kind, tmp_path)  # another process's turn holds the lease
    procs = [holder]
    try:
        _go(holder)
        assert read_line(holder) == "HELD"
        arrival = ["P2", "P3", "P1"]  # each posts once the one before it is in the mailbox
        procs += [_line(kind, tmp_path, label) for label in arrival]
        _go(holder)  # the turn ends: its lease is released
        assert _result(holder) == {"released": True}
        results = [_result(p) for p in procs[1:]]
    finally:
        _reap(procs)
    users = [text for role, text in _messages(kind, tmp_path) if role == "user"]
    assert users == arrival
    assert all(r["finish"] == "stop" for r in results)


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_the_input_of_a_sender_killed_while_it_waited_is_not_stored(
    kind: str, tmp_path: Path
) -> None:
    holder = _spawn("holder", kind, tmp_path)
    procs = [holder]
    try:
        _go(holder)
        assert read_line(holder) == "HELD"
        doomed = _line(kind, tmp_path, "P1")
        doomed.kill()  # SIGKILL: its send() never returns, so nobody learns of P1
        doomed.wait()
        procs.append(_line(kind, tmp_path, "P2"))
        _go(holder)
        assert _result(holder) == {"released": True}
        p2 = _result(procs[1])
    finally:
        _reap(procs)
    assert p2["text"] == "saw: P2"
    assert [text for role, text in _messages(kind, tmp_path) if role == "user"] == ["P2"]
    store = make_store(kind, tmp_path)
    try:
        assert store.sessions.mail_ops().line("mailbox") == []  # nothing of P1 is left
    finally:
        _close(store)


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_a_rollback_whose_turn_ended_before_its_abort_was_taken_runs_its_input(
    kind: str, tmp_path: Path
) -> None:
    holder = _spawn("holder", kind, tmp_path)  # the lease is held, but nobody takes mail
    procs = [holder]
    try:
        _go(holder)
        assert read_line(holder) == "HELD"
        procs.append(_line(kind, tmp_path, "B", "rollback"))  # its abort is in the mailbox
        _go(holder)  # what it would abort ends first
        assert _result(holder) == {"released": True}
        b = _result(procs[1])
    finally:
        _reap(procs)
    assert b["finish"] == "stop" and b["text"] == "saw: B"  # its own turn was not aborted
    assert _messages(kind, tmp_path) == [("user", "B"), ("assistant", "saw: B")]


def test_the_owner_drops_input_whose_sender_died_before_it_was_taken() -> None:
    ops = memory_store().sessions.mail_ops()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead, alive = f"{HOST}:{int(gone.stdout)}:0", make_owner()
    for text, poster in (("from the dead", dead), ("alive", alive)):
        post_input(ops, "s", (Message("user", text),), steer=False, mail_id=mail_key(),
                   poster=poster)
    control = TurnControl()
    unregister = register(ops, "s", control)
    try:
        assert control.offered.wait(CHILD_TIMEOUT)
    finally:
        unregister()
    assert [m.text for m in control.queued()] == ["alive"]
    assert [m.poster for m in ops.line("s")] == [alive]  # the dead sender's mail is gone


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_a_keyed_queue_call_joins_and_its_retry_replays_that_turn(
    kind: str, tmp_path: Path
) -> None:
    a, b = _with_owner("keyqueue", kind, tmp_path)
    c = _retry("keyqueue", kind, tmp_path)  # the same key again, after the commit
    assert b["joined"] is True and b["replayed"] is False and b["run_id"] == a["run_id"]
    assert c["replayed"] is True and c["joined"] is False and c["run_id"] == a["run_id"]
    assert c["text"] == b["text"] == a["text"] == "saw: A,B"
    assert _messages(kind, tmp_path) == [("user", "A"), ("assistant", ""), ("tool", "held"),
                                         ("user", "B"), ("assistant", "saw: A,B")]


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_a_keyed_rollback_drops_the_turn_and_its_retry_replays(
    kind: str, tmp_path: Path
) -> None:
    a, b = _with_owner("keyrollback", kind, tmp_path)
    assert a["finish"] == "aborted"
    assert b["text"] == "saw: B" and b["joined"] is False and b["replayed"] is False
    c = _retry("keyrollback", kind, tmp_path)  # the same key again, after the commit
    assert c["replayed"] is True and c["run_id"] == b["run_id"] and c["text"] == "saw: B"
    assert _messages(kind, tmp_path) == [("user", "B"), ("assistant", "saw: B")]


@pytest.mark.parametrize("kind", MAILBOX_KINDS, indirect=True)
def test_a_keyed_rollback_retry_never_drops_the_turn_of_its_key(
    kind: str, tmp_path: Path
) -> None:
    owner = _owner_in_tool(kind, tmp_path, "keyowner")  # runs the turn of "req-1"
    procs = [owner]
    try:
        procs.append(_spawn("keyrollback", kind, tmp_path))  # a retry of "req-1"
        _go(procs[1])
        assert read_line(procs[1]) == "FOUND"  # it met the running turn of its key
        _go(owner)  # the turn's tool returns
        a, b = _result(owner), _result(procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert a["finish"] == "stop" and a["text"] == "saw: A" and a["replayed"] is False
    assert b["replayed"] is True and b["run_id"] == a["run_id"] and b["text"] == "saw: A"
    assert _messages(kind, tmp_path) == [("user", "A"), ("assistant", ""), ("tool", "held"),
                                         ("assistant", "saw: A")]


def test_an_abort_naming_a_key_spares_the_turn_that_took_that_key() -> None:
    ops = memory_store().sessions.mail_ops()
    control = TurnControl()
    control.keys.add("req-1")  # the turn's own input claims it
    post_abort(ops, "s", "mine", None, "req-1")  # a keyed rollback's retry: not this turn
    post_abort(ops, "s", "other", None, "req-2")  # another request's rollback
    unregister = register(ops, "s", control)
    try:
        assert control.signal.wait(CHILD_TIMEOUT)
    finally:
        unregister()
    assert control.signal.reason == "other"  # taken in order: the first one spared it
    assert ops.line("s") == []  # both were taken and dropped


@pytest.mark.parametrize("kind", ["sqlite", "files", "redis", "postgres", "encrypted-sqlite"],
                         indirect=True)
def test_prune_drops_mail_older_than_its_bound(kind: str, tmp_path: Path) -> None:
    from lousho_sync.stores._mail import MAIL_TTL_S

    if kind == "files":
        from lousho_sync.stores.files import FileStore

        store: Any = FileStore(tmp_path)
    else:
        store = make_store(kind, tmp_path)
    try:
        ops = store.sessions.mail_ops()
        # an abort no turn took, long ago, and input a poster waits with now
        post_abort_at = time.time() - MAIL_TTL_S - 60
        ops.post("s", mail_key(), "abort", json.dumps({"reason": None}), post_abort_at)
        fresh = mail_key()
        post_input(ops, "s", (Message("user", "B"),), steer=False, mail_id=fresh,
                   poster=make_owner())
        assert store.prune(7 * 86400).mails == 1
        assert [m.mail_id for m in ops.line("s")] == [fresh]
        assert store.prune(7 * 86400).mails == 0
    finally:
        _close(store)
