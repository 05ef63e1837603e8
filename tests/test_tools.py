"""Tools: schema from hints and docstrings, validation, conversion, and run_tool results."""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Optional

import attrs
import pytest

from lousho_sync.errors import ConfigError, PropagatingToolError
from lousho_sync.messages import ToolCall
from lousho_sync.providers.base import ToolSpec
from lousho_sync.signal import AbortController
from lousho_sync.tools import Tool, ToolContext, run_tool, tool


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@attrs.frozen
class Person:
    name: Annotated[str, "full name"]
    age: int = 0


@attrs.frozen
class Team:
    lead: Person
    members: tuple[Person, ...] = ()


@attrs.frozen
class Positive:
    value: int = attrs.field(validator=attrs.validators.gt(0))


@attrs.define
class Node:
    child: Node | None = None


@dataclasses.dataclass
class Point:
    x: int
    y: int


def _ctx(call: ToolCall | None = None, session_id: str | None = "s1") -> ToolContext:
    call = call or ToolCall("call-1", "t", {})
    return ToolContext(call=call, session_id=session_id, signal=AbortController().signal)


def _run(t: Tool | None, arguments: Mapping[str, Any], name: str = "t") -> tuple[str, bool]:
    call = ToolCall("call-1", t.name if t else name, arguments)
    return run_tool(t, call, context=_ctx(call))


def _schema_of(hint: object) -> dict[str, Any]:
    """The property schema @tool makes for a single parameter ``x: hint``."""

    def f(x):  # type: ignore[no-untyped-def]
        return x

    f.__annotations__ = {"x": hint}
    return dict(tool(f).parameters["properties"]["x"])


# --------------------------------------------------------------------------- schemas


@pytest.mark.parametrize(
    ("hint", "schema"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (None, {"type": "null"}),
        (Any, {}),
        (Optional[int], {"type": ["integer", "null"]}),  # noqa: UP045 - the typing spelling
        (int | None, {"type": ["integer", "null"]}),
        (str | int, {"type": ["string", "integer"]}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (tuple[str, ...], {"type": "array", "items": {"type": "string"}}),
        (Sequence[float], {"type": "array", "items": {"type": "number"}}),
        (list, {"type": "array"}),
        (
            tuple[int, str],
            {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "minItems": 2,
                "maxItems": 2,
            },
        ),
        (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (Mapping[str, list[str]], {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        }),
        (dict, {"type": "object"}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1, "x"], {"enum": [1, "x"]}),
        (Color, {"type": "string", "enum": ["red", "green"]}),
        (Level, {"type": "integer", "enum": [1, 2]}),
        (
            Person,
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "full name"},
                    "age": {"type": "integer", "default": 0},
                },
                "required": ["name"],
                "additionalProperties": False,
            },
        ),
        (Annotated[int, "how many"], {"type": "integer", "description": "how many"}),
        (Annotated[int, 42, "text wins over other metadata"], {
            "type": "integer", "description": "text wins over other metadata",
        }),
        (list[Annotated[str, "a tag"]], {
            "type": "array", "items": {"type": "string", "description": "a tag"},
        }),
        (Color | None, {"anyOf": [{"type": "string", "enum": ["red", "green"]}, {"type": "null"}]}),
        (Person | None, {"anyOf": [_schema_of(Person), {"type": "null"}]}),
        (int | Any, {}),
    ],
)
def test_schema_for_each_supported_hint(hint: object, schema: dict[str, Any]) -> None:
    assert _schema_of(hint) == schema


def transfer(amount: float, to: str, memo: str | None = None) -> str:
    """Send money.

    The money leaves at once.

    Args:
        amount: How much to send,
            in dollars.
        to (str): Who gets it.
    """
    return f"sent {amount!r} to {to}"


def test_whole_schema_and_description_of_a_decorated_function() -> None:
    t = tool(transfer)
    assert t.name == "transfer"
    assert t.description == "Send money."
    assert t.parameters == {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "description": "How much to send, in dollars."},
            "to": {"type": "string", "description": "Who gets it."},
            "memo": {"type": ["string", "null"], "default": None},
        },
        "required": ["amount", "to"],
        "additionalProperties": False,
    }
    assert t.spec() == ToolSpec("transfer", "Send money.", t.parameters)
    assert t.spec() is t.spec()  # built once


def test_no_parameters_gives_an_empty_closed_object() -> None:
    @tool
    def ping() -> str:
        return "pong"

    assert ping.parameters == {
        "type": "object", "properties": {}, "required": [], "additionalProperties": False,
    }
    assert ping.description == ""
    assert _run(ping, {}) == ("pong", False)
    assert _run(ping, {"x": 1}) == (
        "invalid arguments for tool 'ping': unexpected argument 'x' (no argument is expected)",
        True,
    )


def test_sphinx_param_lines_and_multiline_first_paragraph() -> None:
    @tool
    def search(query: str, limit: int = 10) -> list[str]:
        """Search the
        index for documents.

        :param query: Words to look for,
            any order.
        :param int limit: At most this many.
        :returns: the ids.
        """
        return []

    assert search.description == "Search the index for documents."
    props = search.parameters["properties"]
    assert props["query"]["description"] == "Words to look for, any order."
    assert props["limit"]["description"] == "At most this many."
    assert search.parameters["required"] == ["query"]


def test_annotated_description_wins_over_docstring_and_description_override() -> None:
    @tool(description="Custom text.")
    def f(x: Annotated[int, "from Annotated"], y: int) -> None:
        """Ignored summary.

        Args:
            x: from the docstring
            y: y from the docstring

        Returns:
            nothing: really.
        """

    assert f.description == "Custom text."
    assert f.parameters["properties"]["x"]["description"] == "from Annotated"
    assert f.parameters["properties"]["y"]["description"] == "y from the docstring"
    assert "nothing" not in f.parameters["properties"]


# ----------------------------------------------------------------------- the decorator


def test_bare_and_parameterised_decorator_and_name_override() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    @tool(name="sum-two", needs_approval=True, on_interrupted="report")
    def add2(a: int, b: int) -> int:
        return a + b

    assert isinstance(add, Tool)
    assert isinstance(add2, Tool)
    assert add(2, 3) == 5  # the decorated function stays callable
    assert add2(a=2, b=3) == 5
    assert (add.name, add.needs_approval, add.on_interrupted) == ("add", False, "rerun")
    assert (add2.name, add2.needs_approval, add2.on_interrupted) == ("sum-two", True, "report")
    assert add2.spec().name == "sum-two"
    assert _run(add2, {"a": 1, "b": 2}) == ("3", False)


def test_needs_approval_bool_and_callable() -> None:
    @tool(needs_approval=True)
    def always(x: int) -> int:
        return x

    seen: list[dict[str, Any]] = []

    def big(amount: float, color: Color = Color.RED) -> bool:
        seen.append({"amount": amount, "color": color})
        return amount > 100

    @tool(needs_approval=big)
    def pay(amount: float, color: Color = Color.RED) -> str:
        return "ok"

    assert always.requires_approval({"x": 1}) is True
    assert tool(transfer).requires_approval({"amount": 1, "to": "x"}) is False
    assert pay.requires_approval({"amount": 500}) is True
    assert pay.requires_approval({"amount": 5, "color": "green"}) is False
    assert seen == [
        {"amount": 500.0, "color": Color.RED},
        {"amount": 5.0, "color": Color.GREEN},  # the predicate sees converted arguments
    ]
    # invalid arguments: the call will not run, so nothing to approve
    assert pay.requires_approval({"amount": "lots"}) is False


def test_needs_approval_predicate_that_raises_asks_for_approval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(x: int) -> bool:
        raise RuntimeError("oops")

    t = tool(needs_approval=broken)(lambda_free_identity)
    with caplog.at_level(logging.WARNING, logger="lousho_sync.tools"):
        assert t.requires_approval({"x": 1}) is True
    assert "needs_approval of tool 'lambda_free_identity' raised" in caplog.text


def lambda_free_identity(x: int) -> int:
    return x


# ------------------------------------------------------------------------- validation


def test_invalid_arguments_messages() -> None:
    t = tool(transfer)
    assert t.validate({"amount": 5, "to": "bob"}) is None
    assert t.validate({"amount": "ten", "to": "bob"}) == (
        "argument 'amount': expected number, got 'ten'"
    )
    assert t.validate({"amount": True, "to": "bob"}) == (
        "argument 'amount': expected number, got True"
    )
    assert t.validate({"to": "bob"}) == "missing required argument 'amount'"
    assert t.validate({"amount": 1, "to": "bob", "fee": 2}) == (
        "unexpected argument 'fee' (expected one of: amount, to, memo)"
    )
    assert t.validate({"amount": 1, "to": "bob", "memo": 7}) == (
        "argument 'memo': expected string or null, got 7"
    )
    assert t.validate([1, 2]) == "arguments must be a JSON object, got [1, 2]"  # type: ignore[arg-type]


def test_invalid_arguments_become_an_error_result_and_the_tool_is_not_called() -> None:
    calls: list[int] = []

    @tool
    def count(n: int) -> int:
        calls.append(n)
        return n

    assert _run(count, {"n": "3"}) == (
        "invalid arguments for tool 'count': argument 'n': expected integer, got '3'",
        True,
    )
    assert _run(count, {"n": True}) == (
        "invalid arguments for tool 'count': argument 'n': expected integer, got True",
        True,
    )
    assert calls == []
    assert _run(count, {"n": 3.0}) == ("3", False)  # an integral number is an integer
    assert calls == [3]
    assert type(calls[0]) is int


def test_nested_validation_names_the_path() -> None:
    @tool
    def plan(
        team: Team,
        tags: list[str],
        scores: dict[str, int],
        pair: tuple[int, str],
        level: Level,
        mode: Literal["fast", "slow"] = "fast",
    ) -> None:
        return None

    good = {
        "team": {"lead": {"name": "Ann"}},
        "tags": [],
        "scores": {},
        "pair": [1, "a"],
        "level": 1,
    }
    assert plan.validate(good) is None
    cases = {
        "team": ({"lead": {"name": 5}}, "argument 'team.lead.name': expected string, got 5"),
        "tags": (["a", 2], "argument 'tags[1]': expected string, got 2"),
        "scores": ({"a": "x"}, "argument 'scores.a': expected integer, got 'x'"),
        "pair": ([1], "argument 'pair': expected 2 items, got 1"),
        "level": (3, "argument 'level': expected one of 1, 2, got 3"),
        "mode": ("medium", "argument 'mode': expected one of 'fast', 'slow', got 'medium'"),
    }
    for key, (value, message) in cases.items():
        assert plan.validate({**good, key: value}) == message, key
    assert plan.validate({**good, "team": {"lead": {"name": "A", "x": 1}}}) == (
        "argument 'team.lead': unexpected property 'x' (expected one of: name, age)"
    )
    assert plan.validate({**good, "team": {"members": []}}) == (
        "argument 'team': missing required property 'lead'"
    )
    assert plan.validate({**good, "team": []}) == "argument 'team': expected object, got []"
    assert plan.validate({**good, "level": True}) == (
        "argument 'level': expected one of 1, 2, got True"
    )


def test_attrs_validator_failure_is_an_invalid_argument() -> None:
    @tool
    def f(p: Positive) -> int:
        return p.value

    assert _run(f, {"p": {"value": 3}}) == ("3", False)
    text, is_error = _run(f, {"p": {"value": -1}})
    assert is_error
    assert text.startswith("invalid arguments for tool 'f': argument 'p': ValueError: ")


def test_enum_attrs_tuple_and_float_conversion() -> None:
    got: dict[str, Any] = {}

    @tool
    def f(
        color: Color,
        level: Level,
        team: Team,
        pair: tuple[int, str],
        many: tuple[Person, ...],
        price: float,
        picked: Literal[Color.GREEN] | None = None,
    ) -> None:
        got.update(locals())

    args = {
        "color": "green",
        "level": 2,
        "team": {"lead": {"name": "Ann", "age": 40}, "members": [{"name": "Bo"}]},
        "pair": [7, "x"],
        "many": [{"name": "Cy"}],
        "price": 3,
        "picked": "green",
    }
    assert _run(f, args) == ("", False)
    assert got["color"] is Color.GREEN
    assert got["level"] is Level.HIGH
    assert got["team"] == Team(Person("Ann", 40), (Person("Bo"),))
    assert got["pair"] == (7, "x")
    assert got["many"] == (Person("Cy"),)
    assert got["price"] == 3.0 and type(got["price"]) is float
    assert got["picked"] is Color.GREEN


# -------------------------------------------------------------------------- run_tool


def test_unknown_tool() -> None:
    assert _run(None, {}, name="nope") == ("unknown tool 'nope'", True)


def test_exception_becomes_an_error_result_logged_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @tool
    def boom(x: int) -> None:
        raise ValueError(f"bad value {x}")

    with caplog.at_level(logging.INFO, logger="lousho_sync.tools"):
        assert _run(boom, {"x": 4}) == ("boom failed: ValueError: bad value 4", True)
    [record] = [r for r in caplog.records if r.name == "lousho_sync.tools"]
    assert record.levelno == logging.INFO
    assert not record.exc_info  # no traceback at INFO
    assert "boom" in record.getMessage() and "bad value 4" in record.getMessage()


def test_propagating_tool_error_propagates() -> None:
    @tool
    def stop() -> None:
        raise PropagatingToolError("stop the turn")

    with pytest.raises(PropagatingToolError, match="stop the turn"):
        _run(stop, {})


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_base_exceptions_propagate(exc: type[BaseException]) -> None:
    @tool
    def interrupted() -> None:
        raise exc()

    with pytest.raises(exc):
        _run(interrupted, {})


@dataclasses.dataclass
class _Opaque:
    def __str__(self) -> str:
        return "opaque!"


class _Plain:
    def __str__(self) -> str:
        return "plain object"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("as is", "as is"),
        (None, ""),
        (42, "42"),
        (1.5, "1.5"),
        (True, "true"),
        ({"a": 1, "b": [1, 2]}, '{"a": 1, "b": [1, 2]}'),
        ([1, "x", None], '[1, "x", null]'),
        ((1, 2), "[1, 2]"),
        (Person("Ann", 3), '{"name": "Ann", "age": 3}'),
        (Team(Person("A")), '{"lead": {"name": "A", "age": 0}, "members": []}'),
        (Point(1, 2), '{"x": 1, "y": 2}'),
        (Color.RED, "red"),
        (Level.HIGH, "2"),
        ({"c": Color.GREEN, Color.RED: Level.LOW, 1: "int key"},
         '{"c": "green", "red": 1, "1": "int key"}'),
        ({"text": "héllo"}, '{"text": "héllo"}'),
        (_Plain(), "plain object"),
        ([_Plain()], '["plain object"]'),
        (_Opaque(), "{}"),
    ],
)
def test_return_value_conversion(value: object, text: str) -> None:
    @tool
    def give() -> object:
        return value

    assert _run(give, {}) == (text, False)


def test_unconvertible_result_is_an_error_result() -> None:
    loop: list[object] = []
    loop.append(loop)

    @tool
    def cyclic() -> object:
        return loop

    text, is_error = _run(cyclic, {})
    assert is_error
    assert text.startswith("cyclic failed: cannot turn its result into text: RecursionError")


def test_tool_context_is_injected_and_not_in_the_schema() -> None:
    seen: list[ToolContext] = []

    @tool
    def remember(note: str, ctx: ToolContext) -> str:
        seen.append(ctx)
        return f"{note} @ {ctx.call.id}"

    @tool
    def optional_ctx(ctx: ToolContext | None = None) -> str:
        return "none" if ctx is None else ctx.session_id or "?"

    assert remember.parameters["properties"] == {"note": {"type": "string"}}
    assert remember.parameters["required"] == ["note"]
    call = ToolCall("call-77", "remember", {"note": "hi"})
    context = _ctx(call, session_id="sess")
    assert run_tool(remember, call, context=context) == ("hi @ call-77", False)
    assert seen == [context]
    assert seen[0].signal.aborted is False
    assert optional_ctx.parameters["properties"] == {}
    assert _run(optional_ctx, {}) == ("s1", False)
    # the model cannot supply the context itself
    assert remember.validate({"note": "x", "ctx": {}}) == (
        "unexpected argument 'ctx' (expected one of: note)"
    )


# ------------------------------------------------------------------- config errors


def _complex_param(z: complex) -> None: ...
def _nested_complex(items: list[complex]) -> None: ...
def _int_keys(m: dict[int, str]) -> None: ...
def _memoryview_set(s: set[memoryview]) -> None: ...
def _recursive(n: Node) -> None: ...
def _untyped(x, y: int) -> None: ...  # type: ignore[no-untyped-def]
def _star_args(*xs: int) -> None: ...
def _star_kwargs(**kw: int) -> None: ...
def _positional_only(x: int, /) -> None: ...
def _unresolvable(x: NotDefinedAnywhere) -> None: ...  # type: ignore[name-defined]  # noqa: F821


@pytest.mark.parametrize(
    ("fn", "fragment"),
    [
        (_complex_param, "parameter 'z' has unsupported type complex"),
        (_nested_complex, "parameter 'items' has unsupported type complex in list[complex]"),
        (_int_keys, "parameter 'm' has unsupported type dict[int, str]: object keys must be str"),
        (_memoryview_set, "parameter 's' has unsupported type memoryview in set[memoryview]"),
        (_recursive, "recursive classes are not supported"),
        (_untyped, "parameter 'x' has no type hint"),
        (_star_args, "parameter 'xs': *args, **kwargs and positional-only are not supported"),
        (_star_kwargs, "parameter 'kw': *args"),
        (_positional_only, "parameter 'x': *args"),
        (_unresolvable, "cannot read its type hints"),
    ],
)
def test_unsupported_hints_raise_config_error(fn: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        tool(fn)
    message = str(info.value)
    assert fn.__name__ in message
    assert fragment in message
    assert info.value.code == "LOUSHO_CONFIG"


def test_bad_tool_options_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="tool 'has space': the name must be 1-64"):
        tool(name="has space")(transfer)
    with pytest.raises(ConfigError, match="on_interrupted must be 'rerun' or 'report'"):
        tool(on_interrupted="later")(transfer)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="needs_approval must be a bool or a callable"):
        tool(needs_approval="yes")(transfer)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="timeout_s must be a number of seconds > 0"):
        tool(timeout_s=0)(transfer)
    with pytest.raises(ConfigError, match="timeout_s must be a number of seconds > 0"):
        tool(timeout_s=float("inf"))(transfer)


# ------------------------------------------------------------------ hand-made tools


def test_hand_made_tool_validates_against_its_own_schema() -> None:
    decorated = tool(transfer)
    t = Tool("send", "Send money.", decorated.parameters, transfer, needs_approval=True)
    assert t.spec() == ToolSpec("send", "Send money.", decorated.parameters)
    for args in (
        {"amount": 5, "to": "bob"},
        {"amount": "ten", "to": "bob"},
        {"to": "bob"},
        {"amount": 1, "to": "bob", "fee": 1},
        {"amount": 1, "to": "bob", "memo": None},
        {"amount": 1, "to": "bob", "memo": 3},
    ):
        assert t.validate(args) == decorated.validate(args), args
    assert _run(t, {"amount": 5, "to": "bob"}) == ("sent 5 to bob", False)  # no float conversion
    assert t.requires_approval({}) is True


def test_hand_made_tool_with_loose_schema_and_context() -> None:
    def echo(ctx: ToolContext, **kwargs: Any) -> dict[str, Any]:
        return {"call": ctx.call.id, **kwargs}

    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", [1]]}},
            "v": {"anyOf": [{"type": "string"}, {"const": 3}]},
        },
        "required": ["n"],
    }
    t = Tool("echo", "Echo.", schema, echo)
    assert _run(t, {"n": 1, "extra": "kept"}) == ('{"call": "call-1", "n": 1, "extra": "kept"}',
                                                   False)
    assert t.validate({"n": 1, "tags": ["a", [1]], "v": 3}) is None
    assert t.validate({"n": 1, "tags": ["c"]}) == (
        "argument 'tags[0]': expected one of 'a', 'b', [1], got 'c'"
    )
    assert t.validate({"n": 1, "v": 4}) == "argument 'v': expected string or one of 3, got 4"
    assert t.validate({}) == "missing required argument 'n'"
