"""lousho_sync.sse: the frames a browser's EventSource reads, parsed as it parses them."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from lousho_sync import (
    InvalidEventIdError,
    InvalidInputError,
    LoushoError,
    ScriptedProvider,
    Step,
    create_agent,
    event_to_dict,
)
from lousho_sync.events import RunDone, RunEvent, StepStart, TextDelta
from lousho_sync.sse import (
    HEARTBEAT,
    parse_last_event_id,
    sse_frame,
    sse_frames,
    sse_stream,
    ui_message_stream,
)


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Frames as the HTML standard's event-stream parser dispatches them: one dict per
    blocks of lines, comments kept as ``{"comment": ...}`` so heartbeats can be counted."""
    frames: list[dict[str, Any]] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        frame: dict[str, Any] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                frame["comment"] = line[1:].strip()
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            frame[field] = frame[field] + "\n" + value if field in frame else value
        frames.append(frame)
    return frames


def test_a_turn_as_frames_with_ids_types_and_json() -> None:
    provider = ScriptedProvider([Step(text="Hello, Ali!", chunks=["Hello", ", ", "Ali!"])])
    run = create_agent(provider=provider).session("s1").stream("hi\nthere")
    events: list[RunEvent] = []

    def seen() -> Iterator[RunEvent]:
        for event in run:
            events.append(event)
            yield event

    text = "".join(sse_frames(seen(), heartbeat_s=None, retry_ms=1500))
    frames = parse_sse(text)
    assert frames[0] == {"retry": "1500"}
    frames = frames[1:]
    assert len(frames) == len(events) and events[-1].type == "run.done"
    for frame, event in zip(frames, events, strict=True):
        assert frame["id"] == f"{run.run_id}:{event.seq}"
        assert frame["event"] == event.type
        assert json.loads(frame["data"]) == json.loads(json.dumps(event_to_dict(event)))
    # a newline in the user's text stays inside one data line
    assert json.loads(frames[0]["data"])["input"][0]["content"] == "hi\nthere"
    deltas = [json.loads(f["data"])["text"] for f in frames if f["event"] == "text.delta"]
    assert "".join(deltas) == "Hello, Ali!"


def test_a_quiet_turn_gets_heartbeats_then_its_events() -> None:
    gate = threading.Event()
    provider = ScriptedProvider([Step(text="late answer", gate=gate)])
    run = create_agent(provider=provider).session("s1").stream("hi")
    frames = sse_frames(run, heartbeat_s=0.02)
    got = [next(frames)]
    while got[-1] != HEARTBEAT:  # the model holds its answer: the stream stays open
        got.append(next(frames))
    assert got[0].startswith("retry: ")
    assert next(frames) == HEARTBEAT  # and keeps beating while quiet
    gate.set()
    rest = [f for f in frames if f != HEARTBEAT]
    types = [parse_sse(f)[0]["event"] for f in rest]
    assert types[-1] == "run.done"
    assert run.result().text == "late answer"


def test_the_stream_ends_at_run_done() -> None:
    def source() -> Iterator[RunEvent]:
        yield StepStart(run_id="t1", seq=0, step=1)
        yield RunDone(run_id="t1", seq=1, finish_reason="awaiting-approval", result=None)
        yield TextDelta(run_id="t1", seq=2, text="never sent")

    for heartbeat_s in (None, 5.0):
        frames = parse_sse("".join(sse_frames(source(), heartbeat_s=heartbeat_s)))
        assert [f.get("id") for f in frames] == [None, "t1:0", "t1:1"]


def test_an_event_of_another_turn_is_never_sent() -> None:
    events = [TextDelta(run_id="t1", seq=0, text="mine"), TextDelta(run_id="t2", seq=1,
                                                                    text="foreign")]
    for heartbeat_s in (None, 5.0):
        sent: list[str] = []
        with pytest.raises(InvalidEventIdError, match="turn 't2' reached the stream of "
                                                      "turn 't1'"):
            for frame in sse_frames(iter(events), heartbeat_s=heartbeat_s, turn_id="t1"):
                sent.append(frame)
        assert "foreign" not in "".join(sent) and "mine" in "".join(sent)


def test_an_error_of_the_source_reaches_the_reader() -> None:
    def source() -> Iterator[RunEvent]:
        yield TextDelta(run_id="t1", seq=0, text="a")
        raise OSError("the event log is gone")

    with pytest.raises(OSError, match="the event log is gone"):
        list(sse_frames(source(), heartbeat_s=5.0))


def test_a_client_that_leaves_closes_the_source_and_leaves_no_thread() -> None:
    gate = threading.Event()
    provider = ScriptedProvider([Step(text="answered after the client left", gate=gate)])
    session = create_agent(provider=provider).session("s1")
    run = session.stream("hi")
    frames = sse_frames(run, heartbeat_s=0.02)
    while next(frames) != HEARTBEAT:
        pass
    readers = [t for t in threading.enumerate() if t.name == "lousho-sse"]
    frames.close()  # the browser went away while the model was quiet
    gate.set()
    # the source is closed at its next event: a stream() run whose answer was complete is
    # saved, as when a for loop is left there
    assert run.result(timeout=30).text == "answered after the client left"
    for thread in readers:
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert [m.role for m in session.messages] == ["user", "assistant"]


def test_a_frame_of_a_turn_carries_turn_id_when_the_event_has_one() -> None:
    class Detached(TextDelta):
        turn_id = "turn-7"

    assert sse_frame(Detached(run_id="r", seq=4, text="x")).startswith("id: turn-7:4\n")


@pytest.mark.parametrize("value, expected", [
    ("t1:0", ("t1", 0)),
    ("run_ab-12.x:41", ("run_ab-12.x", 41)),
    (" t1:3 ", ("t1", 3)),
    ("a:b:7", ("a:b", 7)),
])
def test_a_last_event_id_is_read(value: str, expected: tuple[str, int]) -> None:
    assert parse_last_event_id(value) == expected


@pytest.mark.parametrize("value", ["", "t1", "t1:", ":3", "t1:-1", "t1:01", "t1:x",
                                   "t 1:3", "t1:" + "9" * 19, "<script>:1"])
def test_a_malformed_last_event_id_is_a_clear_400_error(value: str) -> None:
    with pytest.raises(InvalidEventIdError) as info:
        parse_last_event_id(value)
    assert isinstance(info.value, InvalidInputError)
    assert info.value.code == "LOUSHO_INVALID_EVENT_ID"
    assert info.value.event_id == value
    assert "is not of the form '<turn_id>:<seq>'" in str(info.value)


def test_a_last_event_id_of_another_turn_is_refused() -> None:
    with pytest.raises(InvalidEventIdError, match="names turn 't1', not turn 't2'"):
        parse_last_event_id("t1:5", turn_id="t2")
    with pytest.raises(InvalidEventIdError, match="must be a str, not int"):
        parse_last_event_id(5)


@pytest.mark.parametrize("kwargs, message", [
    ({"heartbeat_s": 0}, "heartbeat_s must be a number > 0 or None, not 0"),
    ({"heartbeat_s": "15"}, "heartbeat_s must be a number > 0 or None"),
    ({"retry_ms": -1}, "retry_ms must be an int >= 0, not -1"),
    ({"retry_ms": 1.5}, "retry_ms must be an int >= 0"),
])
def test_bad_arguments_are_refused_at_the_call(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        sse_frames(iter(()), **kwargs)


# --- lousho_aio twin ---------------------------------------------------------------------


def test_the_aio_twin_yields_the_same_frames() -> None:
    import lousho_aio
    from lousho_aio.sse import sse_frames as async_frames

    async def main() -> tuple[list[str], list[str]]:
        provider = ScriptedProvider([Step(text="Hello, Ali!", chunks=["Hello", ", Ali!"])])
        session = lousho_aio.create_agent(provider=provider).session("s1")
        events: list[RunEvent] = []

        async def seen() -> Any:
            async for event in session.stream("hi"):
                events.append(event)
                yield event

        frames = [f async for f in async_frames(seen(), heartbeat_s=5.0, retry_ms=1500)]
        return frames, ["retry: 1500\n\n"] + [sse_frame(e) for e in events]

    frames, expected = asyncio.run(main())
    assert frames == expected
    assert parse_sse(frames[-1])[0]["event"] == "run.done"


def test_the_aio_twin_beats_while_quiet_without_cancelling_the_read() -> None:
    import lousho_aio
    from lousho_aio.sse import sse_frames as async_frames

    gate = threading.Event()

    async def main() -> tuple[list[str], list[str], str, list[str]]:
        provider = ScriptedProvider([Step(text="late answer", gate=gate)])
        session = lousho_aio.create_agent(provider=provider).session("s1")
        run = session.stream("hi")
        frames = async_frames(run, heartbeat_s=0.02)
        got = [await anext(frames)]
        while got[-1] != HEARTBEAT:
            got.append(await anext(frames))
        got.append(await anext(frames))
        gate.set()
        rest = [f async for f in frames if f != HEARTBEAT]
        return got, rest, (await run.result()).text, [m.role for m in session.messages]

    got, rest, text, roles = asyncio.run(main())
    assert parse_sse(rest[-1])[0]["event"] == "run.done"
    assert got[0].startswith("retry: ") and got[-2:] == [HEARTBEAT, HEARTBEAT]
    assert text == "late answer" and roles == ["user", "assistant"]


def test_the_aio_twin_refuses_another_turn_and_bad_arguments() -> None:
    from lousho_aio.sse import sse_frames as async_frames

    async def source() -> Any:
        yield TextDelta(run_id="t1", seq=0, text="mine")
        yield TextDelta(run_id="t2", seq=1, text="foreign")

    async def main() -> list[str]:
        sent: list[str] = []
        with pytest.raises(InvalidEventIdError, match="turn 't2' reached the stream"):
            async for frame in async_frames(source(), turn_id="t1"):
                sent.append(frame)
        return sent

    sent = asyncio.run(main())
    assert "mine" in "".join(sent) and "foreign" not in "".join(sent)
    with pytest.raises(InvalidInputError, match="heartbeat_s must be"):
        async_frames(source(), heartbeat_s=-1)


# --- sse_stream over a session's attach() --------------------------------------------------


class _TurnNotFound(LoushoError):
    code = "LOUSHO_TURN_NOT_FOUND"


class _LoggedTurns:
    """A session's event log as attach() reads it: the events of finished turns by id."""

    def __init__(self, turns: dict[str, list[RunEvent]]) -> None:
        self.turns = turns
        self.calls: list[tuple[str | None, int]] = []

    def attach(self, turn_id: str | None = None, *, after: int = -1) -> Iterator[RunEvent]:
        self.calls.append((turn_id, after))
        key = turn_id if turn_id is not None else list(self.turns)[-1]
        if key not in self.turns:
            raise _TurnNotFound(f"no turn {key!r}")
        return iter([e for e in self.turns[key] if e.seq > after])


def _logged_turn(turn_id: str) -> list[RunEvent]:
    provider = ScriptedProvider([Step(text="one two three", chunks=["one ", "two ", "three"])])
    run = create_agent(provider=provider).session("s1").stream("hi")
    return [attrs.evolve(e, run_id=turn_id) for e in run]


def test_sse_stream_resumes_after_the_last_event_id() -> None:
    log = _LoggedTurns({"t1": _logged_turn("t1")})
    first = parse_sse("".join(sse_stream(log, heartbeat_s=None)))[1:]
    assert log.calls == [(None, -1)]
    cut = first[3]["id"]  # the browser saw up to here, then the connection dropped
    rest = parse_sse("".join(sse_stream(log, last_event_id=cut, heartbeat_s=None)))[1:]
    assert log.calls[-1] == ("t1", 3)
    assert first[4:] == rest
    assert rest[-1]["event"] == "run.done"


def test_sse_stream_refuses_a_foreign_or_unknown_last_event_id_before_any_frame() -> None:
    log = _LoggedTurns({"t1": _logged_turn("t1"), "t2": _logged_turn("t2")})
    with pytest.raises(InvalidEventIdError, match="names turn 't1', not turn 't2'"):
        sse_stream(log, last_event_id="t1:3", turn_id="t2")
    with pytest.raises(InvalidEventIdError, match="names turn 'other-session-turn', which "
                                                  "this session does not have") as info:
        sse_stream(log, last_event_id="other-session-turn:3")
    assert isinstance(info.value.__cause__, _TurnNotFound)
    with pytest.raises(InvalidEventIdError, match="is not of the form"):
        ui_message_stream(log, last_event_id="garbage")
    with pytest.raises(_TurnNotFound):  # no Last-Event-ID: not the browser's fault
        sse_stream(log, turn_id="t9")


def test_ui_message_stream_reads_the_turn_as_parts() -> None:
    log = _LoggedTurns({"t1": _logged_turn("t1")})
    text = "".join(ui_message_stream(log, heartbeat_s=None))
    parts = [json.loads(b[6:]) for b in text.split("\n\n") if b and b != "data: [DONE]"]
    assert text.endswith("data: [DONE]\n\n")
    assert parts[0]["type"] == "start" and parts[0]["messageId"] == "t1"
    assert "".join(p["delta"] for p in parts if p["type"] == "text-delta") == "one two three"


def test_the_aio_sse_stream_resumes_after_the_last_event_id() -> None:
    from lousho_aio.sse import sse_stream as async_sse_stream

    class _AsyncLoggedTurns(_LoggedTurns):
        def attach(self, turn_id: str | None = None, *, after: int = -1) -> Any:
            events = super().attach(turn_id, after=after)

            async def read() -> Any:
                for event in events:
                    yield event
            return read()

    turn = _logged_turn("t1")
    log = _AsyncLoggedTurns({"t1": turn})

    async def main() -> list[str]:
        return [f async for f in async_sse_stream(log, last_event_id="t1:2", heartbeat_s=5.0)]

    frames = asyncio.run(main())
    expected = list(sse_stream(_LoggedTurns({"t1": turn}), last_event_id="t1:2",
                               heartbeat_s=None))
    assert frames == expected and len(frames) > 3 and log.calls == [("t1", 2)]
    with pytest.raises(InvalidEventIdError):
        async_sse_stream(log, last_event_id="t1:2", turn_id="t3")


# --- over a real session's detached turns (SQLite) ------------------------------------------


def _sqlite_session(tmp_path: Path, sid: str, script: list[Any]) -> Any:
    from lousho_sync.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "agent.db")
    return create_agent(provider=ScriptedProvider(script), store=store).session(sid)


def test_sse_stream_of_a_started_turn_resumes_after_last_event_id(tmp_path: Path) -> None:
    session = _sqlite_session(tmp_path, "s1", [Step(text="x", chunks=["one ", "two ", "three"])])
    run = session.start("hi")
    turn_id = run.turn_id
    frames = parse_sse("".join(sse_stream(session, turn_id=turn_id, heartbeat_s=5.0)))[1:]
    assert frames[0]["id"] == f"{turn_id}:0" and frames[-1]["event"] == "run.done"
    assert all(f["id"] == f"{turn_id}:{json.loads(f['data'])['seq']}" for f in frames)
    assert json.loads(frames[-1]["data"])["result"]["text"] == "one two three"
    assert session.messages[-1].text == "one two three"
    for cut in range(len(frames) - 1):
        rest = parse_sse("".join(sse_stream(session, last_event_id=frames[cut]["id"],
                                            heartbeat_s=None)))[1:]
        assert rest == frames[cut + 1:]
    latest = parse_sse("".join(sse_stream(session, heartbeat_s=None)))[1:]
    assert latest == frames  # no turn id: the session's latest turn


def test_sse_stream_never_streams_another_sessions_turn(tmp_path: Path) -> None:
    from lousho_sync import TurnNotFoundError

    mine = _sqlite_session(tmp_path, "mine", [Step(text="mine")])
    theirs = _sqlite_session(tmp_path, "theirs", [Step(text="secret")])
    theirs_turn = theirs.start("hi").turn_id
    theirs.attach(theirs_turn).result()
    mine.start("hi").result()
    with pytest.raises(InvalidEventIdError, match="which this session does not have") as info:
        sse_stream(mine, last_event_id=f"{theirs_turn}:0")
    assert isinstance(info.value.__cause__, TurnNotFoundError)
    with pytest.raises(TurnNotFoundError):
        sse_stream(mine, turn_id=theirs_turn)
    with pytest.raises(TurnNotFoundError):
        sse_stream(_sqlite_session(tmp_path, "empty", []))


def test_the_aio_sse_stream_of_a_started_turn(tmp_path: Path) -> None:
    import lousho_aio
    from lousho_aio.sse import sse_stream as async_sse_stream
    from lousho_sync.sqlite import SqliteStore

    async def main() -> tuple[list[str], list[str]]:
        agent = lousho_aio.create_agent(
            provider=ScriptedProvider([Step(text="x", chunks=["a", "b", "c"])]),
            store=SqliteStore(tmp_path / "aio.db"))
        session = agent.session("s1")
        run = await session.start("hi")
        await run.result()
        whole = [f async for f in async_sse_stream(session, turn_id=run.turn_id)]
        rest = [f async for f in async_sse_stream(session, last_event_id=f"{run.turn_id}:1")]
        return whole, rest

    whole, rest = asyncio.run(main())
    assert whole[0] == rest[0] == "retry: 2000\n\n"
    assert rest[1:] == whole[3:]
    assert parse_sse(whole[-1])[0]["event"] == "run.done"


def test_a_quiet_started_turn_beats_and_a_reader_that_leaves_leaves_it_running(
    tmp_path: Path,
) -> None:
    gate = threading.Event()
    session = _sqlite_session(tmp_path, "s1", [Step(text="late", chunks=["la", "te"],
                                                    gate=gate)])
    run = session.start("hi")
    frames = sse_stream(session, turn_id=run.turn_id, heartbeat_s=0.02)
    seen = [next(frames)]
    while seen[-1] != HEARTBEAT:  # the model holds its answer: heartbeats keep it open
        seen.append(next(frames))
    assert seen[0] == "retry: 2000\n\n" and "event: run.start" in "".join(seen)
    frames.close()  # the browser went away
    gate.set()
    assert run.result(timeout=60).text == "late"  # the turn went on and was committed
    assert session.messages[-1].text == "late"
    rest = parse_sse("".join(sse_stream(session, turn_id=run.turn_id, heartbeat_s=None)))
    assert rest[-1]["event"] == "run.done"
