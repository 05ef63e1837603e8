"""The parameter kinds Python users write, each with its schema and the value the tool gets;
timeouts, prompt aborts while a tool runs, async tools, and the missing-description warning."""

from __future__ import annotations

import asyncio
import base64
import contextvars
import dataclasses
import datetime as dt
import decimal
import threading
import uuid
import warnings
from pathlib import Path
from typing import Annotated, Any, TypedDict

import annotated_types as at
import pydantic
import pytest
from conftest import WAIT, wait

import lousho_aio
from lousho_sync import ConfigError, LoushoWarning, ScriptedProvider, Step, create_agent
from lousho_sync.messages import ToolCall
from lousho_sync.signal import AbortController
from lousho_sync.tools import Tool, ToolContext, run_tool, tool


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)


class Address(TypedDict, total=False):
    street: str
    zip: str


class Contact(TypedDict):
    name: str
    address: Address


class Order(pydantic.BaseModel):
    sku: str
    quantity: int = pydantic.Field(ge=1, description="how many")
    point: Point | None = None


def _one(hint: object, default: object = ...) -> tuple[Tool, list[Any]]:
    """A documented tool with one parameter ``x: hint``, and the values it was called with."""
    got: list[Any] = []

    def f(x):  # type: ignore[no-untyped-def]
        """Echo."""
        got.append(x)
        return "ok"

    f.__annotations__ = {"x": hint}
    if default is not ...:
        f.__defaults__ = (default,)
    return tool(f), got


def _call(t: Tool, arguments: dict[str, Any]) -> tuple[str, bool]:
    call = ToolCall("c1", t.name, arguments)
    ctx = ToolContext(call=call, session_id=None, signal=AbortController().signal)
    return run_tool(t, call, context=ctx)


UID = uuid.UUID("12345678-1234-5678-1234-567812345678")

# (id, hint, schema of x, JSON sent, value the function receives)
KINDS: list[tuple[str, object, dict[str, Any], Any, Any]] = [
    ("str", str, {"type": "string"}, "a", "a"),
    ("int", int, {"type": "integer"}, 3, 3),
    ("float", float, {"type": "number"}, 2, 2.0),
    ("bool", bool, {"type": "boolean"}, True, True),
    ("list", list[int], {"type": "array", "items": {"type": "integer"}}, [1, 2], [1, 2]),
    ("dict", dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}},
     {"a": 1}, {"a": 1}),
    ("dataclass", Point, {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0},
                       "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["x"], "additionalProperties": False,
    }, {"x": 1, "tags": ["a"]}, Point(1, 0, ["a"])),
    ("TypedDict", Contact, {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "address": {"type": "object",
                        "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
                        "required": [], "additionalProperties": False},
        },
        "required": ["name", "address"], "additionalProperties": False,
    }, {"name": "Ann", "address": {"zip": "1000"}}, {"name": "Ann", "address": {"zip": "1000"}}),
    ("date", dt.date, {"type": "string", "format": "date"}, "2024-02-29", dt.date(2024, 2, 29)),
    ("datetime", dt.datetime, {"type": "string", "format": "date-time"},
     "2024-02-29T10:30:00+00:00",
     dt.datetime(2024, 2, 29, 10, 30, tzinfo=dt.UTC)),
    ("time", dt.time, {"type": "string", "format": "time"}, "10:30:00", dt.time(10, 30)),
    ("UUID", uuid.UUID, {"type": "string", "format": "uuid"}, str(UID), UID),
    ("Path", Path, {"type": "string"}, "/tmp/x.txt", Path("/tmp/x.txt")),
    ("Decimal", decimal.Decimal, {"type": "string", "format": "decimal"}, "10.25",
     decimal.Decimal("10.25")),
    ("set", set[str], {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
     ["a", "b", "a"], {"a", "b"}),
    ("frozenset", frozenset[int],
     {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 2],
     frozenset({1, 2})),
    ("bytes", bytes, {"type": "string", "contentEncoding": "base64"},
     base64.b64encode(b"\x00hi").decode(), b"\x00hi"),
    ("Annotated description", Annotated[int, "how many"],
     {"type": "integer", "description": "how many"}, 2, 2),
    ("annotated_types", Annotated[int, at.Ge(1), at.Lt(10)],
     {"type": "integer", "minimum": 1, "exclusiveMaximum": 10}, 9, 9),
    ("pydantic Field", Annotated[str, pydantic.Field(min_length=2, max_length=3)],
     {"type": "string", "minLength": 2, "maxLength": 3}, "abc", "abc"),
    ("pydantic BaseModel", Order, {
        "type": "object", "title": "Order",
        "properties": {
            "sku": {"type": "string", "title": "Sku"},
            "quantity": {"type": "integer", "minimum": 1, "default": None, "title": "Quantity",
                         "description": "how many"},
            "point": {"anyOf": [{"type": "object", "title": "Point",
                                 "properties": {"x": {"title": "X", "type": "integer"},
                                                "y": {"default": 0, "title": "Y",
                                                      "type": "integer"},
                                                "tags": {"items": {"type": "string"},
                                                         "title": "Tags", "type": "array"}},
                                 "required": ["x"]}, {"type": "null"}],
                      "default": None},
        },
        "required": ["sku", "quantity"],
    }, {"sku": "A1", "quantity": 2}, Order(sku="A1", quantity=2)),
]


@pytest.mark.parametrize(("hint", "schema", "sent", "received"),
                         [k[1:] for k in KINDS], ids=[k[0] for k in KINDS])
def test_each_parameter_kind_has_its_schema_and_is_converted(
    hint: object, schema: dict[str, Any], sent: Any, received: Any
) -> None:
    t, calls = _one(hint)
    got = dict(t.parameters["properties"]["x"])
    if hint is Order:  # pydantic writes its own schema: compare what matters to a model
        quantity = got["properties"]["quantity"]
        assert quantity["minimum"] == 1 and quantity["description"] == "how many"
        assert got["required"] == ["sku", "quantity"]
        assert "$ref" not in repr(got) and "$defs" not in repr(got)  # refs inlined
        assert got["properties"]["point"]["anyOf"][0]["properties"]["x"]["type"] == "integer"
    else:
        assert got == schema
    assert _call(t, {"x": sent}) == ("ok", False)
    assert calls == [received]
    assert type(calls[0]) is type(received)


@pytest.mark.parametrize(("hint", "sent", "message"), [
    (dt.date, "29 Feb", "argument 'x': expected string (date), got '29 Feb'"),
    (uuid.UUID, "nope", "argument 'x': expected string (uuid), got 'nope'"),
    (decimal.Decimal, "NaN", "argument 'x': expected string (decimal), got 'NaN'"),
    (bytes, "***", "argument 'x': expected string (base64), got '***'"),
    (Annotated[int, at.Ge(1)], 0, "argument 'x': must be >= 1, got 0"),
    (Annotated[str, pydantic.Field(max_length=3)], "abcd",
     "argument 'x': must have at most this many characters: 3, got 'abcd'"),
    (Annotated[list[int], at.MinLen(1)], [], "argument 'x': must have at least this many items"),
    (Point, {"y": 1}, "argument 'x': missing required property 'x'"),
    (Order, {"sku": "A", "quantity": 0}, "argument 'x': quantity: Input should be greater"),
])
def test_a_bad_value_of_each_kind_is_an_error_result_naming_it(
    hint: object, sent: Any, message: str
) -> None:
    t, calls = _one(hint)
    text, is_error = _call(t, {"x": sent})
    assert is_error and message in text
    assert calls == []


def test_defaults_reach_the_schema_in_their_json_form() -> None:
    @tool
    def book(when: dt.date = dt.date(2025, 1, 2), seats: int = 2, note: str | None = None,
             tags: tuple[str, ...] = ("a",)) -> str:
        """Book."""
        return "ok"

    props = book.parameters["properties"]
    assert props["when"]["default"] == "2025-01-02"
    assert props["seats"]["default"] == 2
    assert props["note"]["default"] is None
    assert props["tags"]["default"] == ["a"]
    assert book.parameters["required"] == []


def test_untyped_object_default_is_left_out_of_the_schema() -> None:
    sentinel = object()

    @tool
    def f(x: Any = sentinel) -> str:
        """F."""
        return "ok"

    assert "default" not in f.parameters["properties"]["x"]


@pytest.mark.parametrize(("hint", "message"), [
    (Annotated[int, at.Predicate(lambda v: v % 2 == 0)], "cannot be written in JSON Schema"),
    (Annotated[str, at.Ge(1)], "does not apply to a string"),
    (Annotated[int, pydantic.Field(strict=True)], "cannot be written in JSON Schema"),
    (Annotated[dt.datetime, at.Timezone(None)], "cannot be written in JSON Schema"),
    (complex, "unsupported type complex"),
])
def test_constraints_that_cannot_be_kept_are_refused_at_decoration(
    hint: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _one(hint)


def test_a_tool_without_description_warns_once_naming_it() -> None:
    def nameless(x: int) -> int:
        return x

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tool(nameless)
        tool(nameless)
        tool(description="Given.")(nameless)
    texts = [str(w.message) for w in seen if issubclass(w.category, LoushoWarning)]
    assert len(texts) == 1 and "tool 'nameless'" in texts[0] and "no description" in texts[0]
    assert seen[0].filename == __file__  # it points at the user's line


# --- timeouts and aborts while a tool runs ------------------------------------------------


def test_a_tool_past_its_timeout_gives_the_model_an_in_doubt_error() -> None:
    release, finished = threading.Event(), threading.Event()

    @tool(timeout_s=0.05)
    def slow() -> str:
        """Slow."""
        release.wait(WAIT)
        finished.set()
        return "late"

    agent = create_agent(provider=ScriptedProvider(
        [Step(tool_calls=[("slow", {})]), "gave up"]), tools=[slow])
    session = agent.session()
    result = session.send("go")
    assert result.text == "gave up"
    tool_result = result.messages[2]
    assert tool_result.is_error
    assert "timed out after 0.05 s" in tool_result.text
    assert "may or may not have taken effect" in tool_result.text
    release.set()
    wait(finished, "the timed-out tool to finish in the background")
    assert [m.role for m in session.messages] == ["user", "assistant", "tool", "assistant"]


def test_an_abort_returns_while_a_tool_still_runs_and_keeps_nothing() -> None:
    started, release = threading.Event(), threading.Event()

    @tool
    def stuck() -> str:
        """Stuck."""
        started.set()
        release.wait(WAIT)
        return "done"

    agent = create_agent(provider=ScriptedProvider([Step(tool_calls=[("stuck", {})])],
                                                   default="never"), tools=[stuck])
    session = agent.session()
    run = session.stream("go")
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("result", run.result(timeout=WAIT)))
    t.start()
    wait(started, "the tool to start")
    run.abort("user left")
    t.join(WAIT)
    assert not t.is_alive(), "abort waited for the tool"
    assert not release.is_set()  # the tool is still running
    assert out["result"].finish_reason == "aborted"
    assert session.messages == ()
    release.set()


def test_a_tool_sees_the_turns_contextvars() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    seen: list[str] = []

    @tool
    def who() -> str:
        """Who."""
        seen.append(var.get("unset"))
        return "ok"

    agent = create_agent(provider=ScriptedProvider([Step(tool_calls=[("who", {})]), "k"]),
                         tools=[who])
    var.set("req-7")
    agent.send("go")
    assert seen == ["req-7"]


def test_a_tool_setting_a_contextvar_leaves_the_callers_value_as_it_was() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="caller")

    @tool
    def change() -> str:
        """Change."""
        var.set("tool")
        return var.get()

    agent = create_agent(
        provider=ScriptedProvider([Step(tool_calls=[("change", {})]), "k"] * 2), tools=[change]
    )
    result = agent.send("go")
    assert result.messages[2].text == "tool"
    assert var.get() == "caller"
    agent.send("go", signal=AbortController().signal)  # the worker-thread path
    assert var.get() == "caller"


def test_a_tool_runs_on_the_callers_thread_only_where_nothing_can_abort_it() -> None:
    threads: list[int] = []

    @tool
    def where() -> str:
        """Where."""
        threads.append(threading.get_ident())
        return "ok"

    @tool(timeout_s=WAIT)
    def bounded() -> str:
        """Bounded."""
        threads.append(threading.get_ident())
        return "ok"

    def agent_with(name: str) -> Any:
        return create_agent(provider=ScriptedProvider([Step(tool_calls=[(name, {})]), "k"]),
                            tools=[where, bounded])

    me = threading.get_ident()
    agent_with("where").send("go")  # no signal, result driven here: nobody can abort it
    assert threads == [me]
    agent_with("where").send("go", signal=AbortController().signal)
    agent_with("bounded").send("go")  # a timeout needs a thread to walk away from
    run = agent_with("where").stream("go")  # the handle can abort it from anywhere
    run.result()
    session = agent_with("where").session()
    session.send("go")  # another call may roll the session's turn back
    assert len(threads) == 5 and me not in threads[1:]


# --- async tools -----------------------------------------------------------------------------


@tool
async def lookup(city: str) -> str:
    """Look a city up."""
    await asyncio.sleep(0)
    return f"sunny in {city} on loop {id(asyncio.get_running_loop())}"


def test_the_sync_core_refuses_an_async_tool_before_any_model_call() -> None:
    provider = ScriptedProvider([Step(tool_calls=[("lookup", {"city": "Oslo"})])], default="x")
    agent = create_agent(provider=provider, tools=[lookup])
    session = agent.session()
    with pytest.raises(ConfigError, match=r"tool 'lookup' is an async def function.*lousho_aio"):
        session.send("weather?")
    assert provider.requests == []  # refused before paying for a model call
    assert session.messages == ()
    assert lookup.is_async


def test_lousho_aio_runs_an_async_tool_on_its_loop() -> None:
    async def main() -> tuple[str, int]:
        agent = lousho_aio.create_agent(
            provider=ScriptedProvider([Step(tool_calls=[("lookup", {"city": "Oslo"})]), "ok"]),
            tools=[lookup])
        result = await agent.session().send("weather?")
        return result.messages[2].text, id(asyncio.get_running_loop())

    text, loop_id = asyncio.run(main())
    assert text == f"sunny in Oslo on loop {loop_id}"


def test_an_async_tool_past_its_timeout_is_cancelled() -> None:
    cancelled = threading.Event()

    @tool(timeout_s=0.05)
    async def hang() -> str:
        """Hang."""
        try:
            await asyncio.sleep(WAIT)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    async def main() -> str:
        agent = lousho_aio.create_agent(
            provider=ScriptedProvider([Step(tool_calls=[("hang", {})]), "ok"]), tools=[hang])
        result = await agent.session().send("go")
        await asyncio.get_running_loop().run_in_executor(None, wait, cancelled, "cancel")
        return result.messages[2].text

    assert "timed out after 0.05 s" in asyncio.run(main())
    assert cancelled.is_set()
