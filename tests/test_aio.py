"""lousho_aio: parity with the sync API, cancellation, streams, ASGI, and scale."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import WAIT

import lousho_aio
import lousho_sync
from lousho_aio import _bridge
from lousho_sync.agent import Agent, Approvals
from lousho_sync.errors import ConfigError, InvalidSessionIdError, SessionBusyError
from lousho_sync.events import RunEvent
from lousho_sync.messages import Message
from lousho_sync.providers.base import ModelEvent, ModelRequest
from lousho_sync.providers.scripted import ScriptedProvider, Step
from lousho_sync.run import AgentRun
from lousho_sync.session import Session
from lousho_sync.signal import AbortController, Signal
from lousho_sync.sqlite import SqliteStore
from lousho_sync.stores.base import ApprovalRecord
from lousho_sync.stores.files import FileSessionStore, FileStore
from lousho_sync.tools import tool

SYNC_ONLY = {"Agent", "AgentExecutor", "AgentRun", "Approvals", "Session", "create_agent"}

# SPEC §13: the coroutines; every other public member is plain.
COROUTINES = {
    "AsyncAgent": {"send", "resume"},
    "AsyncApprovals": {"resolve", "list", "get", "page"},
    "AsyncSession": {"send", "load", "compact", "clear", "pending", "resume",
                     "discard_pending", "delete", "undo", "fork", "set_metadata", "history",
                     "start", "current_turn", "abort_turn"},
    "AsyncAgentRun": {"result"},
}


class RecordingProvider(ScriptedProvider):
    """A ScriptedProvider that keeps the abort signal of every call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.signals: list[Signal] = []

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        self.signals.append(signal)
        return super().stream(request, signal=signal)


def entering(event: threading.Event, step: Step) -> Callable[[ModelRequest], Step]:
    """A script item that sets ``event`` when the provider reaches it."""

    def item(request: ModelRequest) -> Step:
        event.set()
        return step

    return item


async def until(event: threading.Event) -> None:
    """Await a threading.Event (with the test timeout) without blocking the loop."""
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, event.wait, WAIT), "timed out waiting"


def run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        async with asyncio.timeout(60):
            return await coro

    return asyncio.run(main())


def texts(messages: tuple[Message, ...]) -> list[str]:
    return [f"{m.role}:{m.text}" for m in messages]


# --- surface ------------------------------------------------------------------------------------
def test_reexports_are_the_sync_classes_themselves() -> None:
    for name in lousho_sync.__all__:
        if name in SYNC_ONLY:
            continue
        assert name in lousho_aio.__all__, name
        assert getattr(lousho_aio, name) is getattr(lousho_sync, name), name
    for name in ("AsyncAgent", "AsyncSession", "AsyncAgentRun", "AsyncApprovals",
                 "create_agent", "configure"):
        assert name in lousho_aio.__all__
    assert getattr(lousho_aio, "create_agent") is not lousho_sync.create_agent  # noqa: B009
    assert sorted(set(lousho_aio.__all__)) == sorted(lousho_aio.__all__)
    for name in lousho_aio.__all__:
        assert hasattr(lousho_aio, name), name


def _shape(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


def _check_twin(sync_obj: object, aio_obj: object) -> None:
    aio_cls = type(aio_obj).__name__
    coroutines = COROUTINES[aio_cls]
    public = [n for n in dir(sync_obj) if not n.startswith("_")]
    assert public
    for name in public:
        # (looked up statically: ``metadata`` is a property whose value is a coroutine)
        missing = object()
        assert inspect.getattr_static(aio_obj, name, missing) is not missing, (
            f"{aio_cls} lacks {name}")
        static = inspect.getattr_static(type(sync_obj), name, None)
        if inspect.isfunction(static):
            twin = inspect.getattr_static(type(aio_obj), name, None)
            assert inspect.isfunction(twin), f"{aio_cls}.{name} is not a method"
            assert _shape(static) == _shape(twin), f"{aio_cls}.{name} parameters differ"
            is_coro = inspect.iscoroutinefunction(twin)
            assert is_coro == (name in coroutines), (
                f"{aio_cls}.{name} must be {'a coroutine' if name in coroutines else 'plain'}"
            )
        elif isinstance(static, property):
            assert isinstance(inspect.getattr_static(type(aio_obj), name), property), name
    assert coroutines <= set(public)


def test_every_public_sync_member_has_an_aio_twin() -> None:
    provider = ScriptedProvider(default="ok")
    agent = lousho_aio.create_agent(provider=provider)
    assert isinstance(agent.sync, Agent) and isinstance(agent.sync.approvals, Approvals)
    session = agent.session("parity")
    assert isinstance(session.sync, Session)
    arun = session.stream("hi")
    assert isinstance(arun.sync, AgentRun)
    _check_twin(agent.sync, agent)
    _check_twin(agent.sync.approvals, agent.approvals)
    _check_twin(session.sync, session)
    _check_twin(arun.sync, arun)
    assert _shape(lousho_sync.create_agent) == _shape(lousho_aio.create_agent)
    assert hasattr(arun, "__aiter__") and not inspect.iscoroutinefunction(agent.stream)
    assert run(arun.result()).text == "ok"


# --- turns ----------------------------------------------------------------------------------
def test_sessions_send_stream_and_read_like_the_sync_api(tmp_path: Path) -> None:
    provider = ScriptedProvider(default=Step(chunks=["Hel", "lo"]))
    agent = lousho_aio.create_agent(provider=provider, store=FileStore(tmp_path))

    async def main() -> None:
        session = agent.session("u1")
        first = await session.send("Hi")
        assert first.text == "Hello" and first.finish_reason == "stop"
        stream = session.stream("Again")
        events = [e async for e in stream]
        assert [e.type for e in events] == ["run.start", "step.start", "text.delta",
                                            "text.delta", "usage", "run.done"]
        assert [e.seq for e in events] == list(range(6))
        assert {e.run_id for e in events} == {stream.run_id}
        assert (await stream.result()).text == "Hello" and stream.done
        with pytest.raises(RuntimeError):
            stream.__aiter__()
        unread = session.stream("Third")  # result() drives a stream nobody reads
        assert (await unread.result()).text == "Hello"
        assert len(session.messages) == 6
        assert len(await session.load()) == 6
        assert await session.pending() is None
        one_shot = await agent.send("alone")
        assert one_shot.text == "Hello" and len(one_shot.messages) == 2
        assert [e.type async for e in agent.stream("x")][-1] == "run.done"
        cleared: list[str] = []
        session.on(lambda e: cleared.append(e.type))
        await session.clear()
        assert texts(session.messages) == [] and cleared == ["context.cleared"]

    run(main())
    reloaded = lousho_sync.create_agent(provider=provider, store=FileStore(tmp_path))
    assert reloaded.session("u1").messages == ()


def test_concurrent_sends_on_one_session_run_in_call_order() -> None:
    def answer(request: ModelRequest) -> Step:
        return Step(text=f"after {len(request.messages)}")

    agent = lousho_aio.create_agent(provider=ScriptedProvider(default=answer))
    session = agent.session("order")

    async def main() -> None:
        results = await asyncio.gather(*(session.send(f"m{i}") for i in range(8)))
        assert [r.text for r in results] == [f"after {2 * i + 1}" for i in range(8)]
        assert [m.text for m in session.messages if m.role == "user"] == [
            f"m{i}" for i in range(8)]

    run(main())


def test_contextvars_reach_the_worker_thread() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")

    def answer(request: ModelRequest) -> Step:
        return Step(text=f"{var.get()} in {threading.current_thread().name}")

    agent = lousho_aio.create_agent(provider=ScriptedProvider(default=answer))

    async def main() -> None:
        var.set("acme")
        result = await agent.session().send("hi")
        assert result.text.startswith("acme in lousho-aio")
        events = [e async for e in agent.stream("hi")]
        assert events[-1].result is not None  # type: ignore[attr-defined]
        assert events[-1].result.text.startswith("acme in ")  # type: ignore[attr-defined]

    run(main())


@tool(needs_approval=True)
def transfer(amount: float, to: str) -> str:
    """Send money."""
    return f"sent {amount} to {to}"


def test_approvals_and_an_async_approve_callback() -> None:
    provider = ScriptedProvider(
        [Step(tool_calls=[("transfer", {"amount": 5.0, "to": "Bob"})]), "Sent.",
         Step(tool_calls=[("transfer", {"amount": 7.0, "to": "Ann"})]), "Done."])
    agent = lousho_aio.create_agent(provider=provider, tools=[transfer])

    async def main() -> None:
        session = agent.session("pay")
        paused = await session.send("Send 5 to Bob.")
        assert paused.finish_reason == "awaiting-approval" and paused.approval_id
        pending = await session.pending()
        assert pending is not None and pending.approval_id == paused.approval_id
        assert [r.id for r in await agent.approvals.list("pay")] == [paused.approval_id]
        record = await agent.approvals.get(paused.approval_id)
        assert record is not None and record.call.name == "transfer"
        done = await agent.approvals.resolve(id=paused.approval_id, approved=True)
        assert done is not None and done.text == "Sent."

        loop_thread = threading.get_ident()
        seen: list[int] = []

        async def approve(record: ApprovalRecord) -> bool:
            seen.append(threading.get_ident())
            await asyncio.sleep(0)
            return bool(record.call.arguments["to"] == "Ann")

        result = await session.send("Send 7 to Ann.", approve=approve)
        assert result.text == "Done." and seen == [loop_thread]
        assert texts(session.messages)[-2:] == ["tool:sent 7.0 to Ann", "assistant:Done."]

    run(main())


def test_enqueue_and_steer_reach_the_running_turn() -> None:
    gate, entered = threading.Event(), threading.Event()
    steer_gate, steer_entered = threading.Event(), threading.Event()
    provider = ScriptedProvider(
        [entering(entered, Step(text="a", gate=gate)), "b",
         entering(steer_entered, Step(text="never", gate=steer_gate)), "steered"])
    agent = lousho_aio.create_agent(provider=provider)

    async def main() -> None:
        session = agent.session("q1")
        stream = session.stream("go")
        seen: list[str] = []

        async def consume() -> None:
            async for event in stream:
                seen.append(event.type)

        task = asyncio.create_task(consume())
        await until(entered)
        assert stream.enqueue("more")
        gate.set()
        await task
        assert "input.queued" in seen and "input.applied" in seen
        assert (await stream.result()).text == "b"
        assert not stream.enqueue("too late")
        second = session.stream("go on")
        waiter = asyncio.create_task(second.result())
        await until(steer_entered)
        assert second.steer("no, that")
        assert (await waiter).text == "steered"
        assert texts(session.messages)[-3:] == ["user:go on", "user:no, that",
                                                "assistant:steered"]

    try:
        run(main())
    finally:
        gate.set()
        steer_gate.set()


def test_the_library_never_starts_its_own_event_loop() -> None:
    for path in Path(lousho_aio.__file__).parent.glob("*.py"):
        source = path.read_text(encoding="utf-8")
        for forbidden in ("asyncio.run(", "run_until_complete", "new_event_loop"):
            assert forbidden not in source, f"{path.name} uses {forbidden}"


# --- cancellation ---------------------------------------------------------------------------
def test_cancelling_send_during_a_provider_delay_aborts_the_turn(tmp_path: Path) -> None:
    entered = threading.Event()
    provider = RecordingProvider(
        ["first", entering(entered, Step(text="late", delay_s=30))], default="third")
    agent = lousho_aio.create_agent(provider=provider)
    store = FileSessionStore(tmp_path)

    async def main() -> None:
        session = agent.session("c1", store=store)
        await session.send("one")
        before = session.messages
        task = asyncio.create_task(session.send("two"))
        await until(entered)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert provider.signals[-1].aborted  # the provider saw the abort
        assert session.messages == before
        assert await session.pending() is None
        assert (await session.send("three")).text == "third"

    run(main())
    assert texts(tuple(store.load("c1") or ())) == [
        "user:one", "assistant:first", "user:three", "assistant:third"]


def test_cancelling_a_streaming_consumer_aborts_the_run(tmp_path: Path) -> None:
    entered = threading.Event()
    provider = RecordingProvider(["first", entering(entered, Step(text="x", delay_s=30))])
    store = FileSessionStore(tmp_path)
    agent = lousho_aio.create_agent(provider=provider, store=store)

    async def main() -> None:
        session = agent.session("c2")
        await session.send("one")
        stream = session.stream("two")
        seen: list[str] = []

        async def consume() -> None:
            async for event in stream:
                seen.append(event.type)

        task = asyncio.create_task(consume())
        await until(entered)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["run.start", "step.start"]
        assert provider.signals[-1].aborted and stream.done
        assert (await stream.result()).finish_reason == "aborted"
        assert texts(session.messages) == ["user:one", "assistant:first"]

    run(main())
    assert texts(tuple(store.load("c2") or ())) == ["user:one", "assistant:first"]


def test_leaving_the_async_for_early_aborts_the_run() -> None:
    entered = threading.Event()
    provider = RecordingProvider([entering(entered, Step(text="x", delay_s=30))])
    agent = lousho_aio.create_agent(provider=provider)

    async def main() -> None:
        session = agent.session("b1")
        stream = session.stream("go")
        async for event in stream:
            if event.type == "step.start":
                break
        result = await stream.result()
        assert result.finish_reason == "aborted"
        assert session.messages == ()
        if provider.signals:  # the pump may not have reached the provider
            assert provider.signals[-1].aborted

    run(main())


def test_cancelling_compact_aborts_the_summary_call() -> None:
    entered = threading.Event()
    provider = RecordingProvider(
        ["1", "2", "3", entering(entered, Step(text="no", delay_s=30)), "the summary"])
    agent = lousho_aio.create_agent(provider=provider)

    async def main() -> None:
        session = agent.session("k1")
        for text in ("a", "b", "c"):
            await session.send(text)
        before = session.messages
        events: list[str] = []
        session.on(lambda e: events.append(e.type))
        task = asyncio.create_task(session.compact(keep_last=2))
        await until(entered)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert provider.signals[-1].aborted and session.messages == before
        await session.compact(keep_last=2)
        assert len(session.messages) == 3 and "the summary" in session.messages[0].text
        assert events == ["compaction.start", "compaction.start", "compaction.done"]

    run(main())


def test_asyncio_timeout_aborts_a_turn() -> None:
    entered = threading.Event()
    provider = RecordingProvider(["kept", entering(entered, Step(text="x", delay_s=30))])
    agent = lousho_aio.create_agent(provider=provider)

    async def main() -> None:
        session = agent.session("t1")
        await session.send("one")
        scopes: list[asyncio.Timeout] = []

        async def turn() -> None:
            async with asyncio.timeout(None) as scope:
                scopes.append(scope)
                await session.send("two")

        task = asyncio.create_task(turn())
        await until(entered)
        scopes[0].reschedule(asyncio.get_running_loop().time())
        with pytest.raises(TimeoutError):
            await task
        assert provider.signals[-1].aborted
        assert texts(session.messages) == ["user:one", "assistant:kept"]

    run(main())


def test_cancelling_result_aborts_and_timeout_lets_the_run_go_on() -> None:
    entered = threading.Event()
    gate = threading.Event()
    provider = RecordingProvider(
        [entering(entered, Step(text="x", delay_s=30)), Step(text="gated", gate=gate)])
    agent = lousho_aio.create_agent(provider=provider)

    async def main() -> None:
        session = agent.session("r1")
        stream = session.stream("go")
        task = asyncio.create_task(stream.result())
        await until(entered)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert provider.signals[-1].aborted and stream.done
        gated = session.stream("again")
        with pytest.raises(TimeoutError):
            await gated.result(timeout=0.01)
        assert not gated.done
        gate.set()
        assert (await gated.result()).text == "gated"

    try:
        run(main())
    finally:
        gate.set()


def test_signals_and_abort_from_the_loop() -> None:
    entered = threading.Event()
    provider = RecordingProvider([entering(entered, Step(text="x", delay_s=30))],
                                 default="ok")
    agent = lousho_aio.create_agent(provider=provider)

    async def main() -> None:
        controller = AbortController()
        task = asyncio.create_task(agent.session("s1").send("go", signal=controller.signal))
        await until(entered)
        controller.abort("user left")
        result = await task
        assert result.finish_reason == "aborted" and provider.signals[-1].reason == "user left"
        stream = agent.stream("again")
        stream.abort()
        assert (await stream.result()).finish_reason == "aborted"

    run(main())


def test_reject_policy_raises_at_once() -> None:
    gate = threading.Event()
    agent = lousho_aio.create_agent(provider=ScriptedProvider([Step(text="a", gate=gate)]))

    async def main() -> None:
        session = agent.session("busy", turn_policy="reject")
        first = session.stream("one")
        task = asyncio.create_task(first.result())
        with pytest.raises(SessionBusyError):
            await session.send("two")
        gate.set()
        assert (await task).text == "a"

    try:
        run(main())
    finally:
        gate.set()


# --- configuration ------------------------------------------------------------------------------
def test_pool_size_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lousho_aio.DEFAULT_MAX_WORKERS >= 1000
    monkeypatch.setenv("LOUSHO_AIO_THREADS", "64")
    assert _bridge._from_env() == 64
    monkeypatch.setenv("LOUSHO_AIO_THREADS", "lots")
    with pytest.raises(ConfigError, match="LOUSHO_AIO_THREADS"):
        _bridge._from_env()
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigError, match="max_workers"):
            lousho_aio.configure(max_workers=bad)  # type: ignore[arg-type]


# --- ASGI -----------------------------------------------------------------------------------------
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def make_app(agent: lousho_aio.AsyncAgent) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A plain ASGI app: POST /?client=ID with the user's text; replies with the turn's
    text. One durable session per client id."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        query = urllib.parse.parse_qs(scope["query_string"].decode())
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            session = agent.session(query.get("client", [""])[0])
            status, reply = 200, (await session.send(body.decode())).text
        except InvalidSessionIdError as exc:
            status, reply = 400, str(exc)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": reply.encode()})

    return app


async def request(app: Callable[[Scope, Receive, Send], Awaitable[None]], client: str,
                  text: str) -> tuple[int, str]:
    """Drive ``app`` in-process like a server would."""
    chunks = [{"type": "http.request", "body": text[:2].encode(), "more_body": True},
              {"type": "http.request", "body": text[2:].encode(), "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return chunks.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "path": "/", "raw_path": b"/",
             "query_string": urllib.parse.urlencode({"client": client}).encode(),
             "headers": [], "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    return sent[0]["status"], sent[1]["body"].decode()


def test_asgi_app_keeps_a_durable_session_per_client(tmp_path: Path) -> None:
    def answer(request: ModelRequest) -> Step:
        users = [m.text for m in request.messages if m.role == "user"]
        return Step(text=f"turn {len(users)}: {users[-1]}")

    db = tmp_path / "agent.db"

    async def serve(store: SqliteStore, clients: list[str]) -> dict[str, list[str]]:
        app = make_app(lousho_aio.create_agent(provider=ScriptedProvider(default=answer),
                                               store=store))

        async def client(name: str) -> list[str]:
            out = []
            for text in ("hello", "again"):
                status, body = await request(app, name, text)
                assert status == 200
                out.append(body)
            return out

        replies = await asyncio.gather(*(client(c) for c in clients))
        bob = await asyncio.gather(request(app, "bob", "x1"), request(app, "bob", "x2"))
        assert sorted(b for _, b in bob) == ["turn 3: x1", "turn 4: x2"]
        status, body = await request(app, "not ok!", "hi")
        assert status == 400 and "not ok!" in body
        return dict(zip(clients, replies, strict=True))

    clients = [f"client-{i}" for i in range(20)] + ["bob"]
    with SqliteStore(db) as store:
        replies = run(serve(store, clients))
    assert all(r == ["turn 1: hello", "turn 2: again"] for r in replies.values())
    with SqliteStore(db) as store:  # a restarted server sees the history
        app = make_app(lousho_aio.create_agent(provider=ScriptedProvider(default=answer),
                                               store=store))
        assert run(request(app, "client-3", "back")) == (200, "turn 3: back")
        assert len(store.sessions.load("client-3") or ()) == 6


# --- scale ----------------------------------------------------------------------------------------
def test_a_thousand_sessions_are_not_serialized_by_the_pool() -> None:
    target = 500
    lock = threading.Lock()
    state = {"in_flight": 0, "max": 0}
    reached = threading.Event()

    def held(request: ModelRequest) -> Step:
        with lock:
            state["in_flight"] += 1
            state["max"] = max(state["max"], state["in_flight"])
            if state["in_flight"] >= target:
                reached.set()
        try:
            if not reached.wait(WAIT):
                reached.set()  # fail fast: release everyone, the assertion below reports it
        finally:
            with lock:
                state["in_flight"] -= 1
        return Step(text="ok")

    agent = lousho_aio.create_agent(provider=ScriptedProvider(default=held))

    async def main() -> list[str]:
        sessions = [agent.session(f"s{i}") for i in range(1000)]
        results = await asyncio.gather(*(s.send("hi") for s in sessions))
        return [r.text for r in results]

    assert run(main()) == ["ok"] * 1000
    assert state["max"] >= target, f"only {state['max']} provider calls were in flight at once"


def test_stream_events_of_many_concurrent_runs_are_complete() -> None:
    agent = lousho_aio.create_agent(
        provider=ScriptedProvider(default=Step(chunks=[str(i) for i in range(200)])))

    async def read(i: int) -> list[RunEvent]:
        return [e async for e in agent.session(f"m{i}").stream("go")]

    async def main() -> None:
        runs = await asyncio.gather(*(read(i) for i in range(50)))
        for events in runs:
            deltas = [e.text for e in events if e.type == "text.delta"]  # type: ignore[attr-defined]
            assert deltas == [str(i) for i in range(200)]
            assert [e.seq for e in events] == list(range(len(events)))

    run(main())
