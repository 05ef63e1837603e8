"""The schema compiler's nodes: each writes its JSON Schema and checks (and converts) the
JSON value the model sends; :mod:`lousho_sync._hints` makes them from type hints.

Hints: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``, unions and ``Optional``,
``list``/``Sequence``/``tuple``/``set``/``frozenset`` of X, fixed ``tuple[X, Y]``,
``dict[str, X]``/``Mapping[str, X]``, ``Literal[...]``, ``Enum`` subclasses; objects from
attrs classes, dataclasses, ``TypedDict`` and pydantic models (duck-typed: pydantic is not a
dependency); strings with a ``format`` for ``date``, ``datetime``, ``time``, ``UUID``,
``Path`` and ``Decimal``, base64 for ``bytes``; ``Annotated`` descriptions
(``Annotated[T, "text"]``, ``typing_extensions.Doc``) and the constraints of
``annotated_types`` and pydantic ``Field`` (bounds, lengths, ``multiple_of``, ``pattern``).
A constraint it cannot express is refused (:class:`Unsupported`), never dropped.
"""

from __future__ import annotations

import binascii
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import (
    Any,
    get_args,
)

__all__ = [
    "AnyOf",
    "Array",
    "EnumNode",
    "Invalid",
    "JSON_KIND",
    "Model",
    "NO_DEFAULT",
    "Node",
    "Obj",
    "Scalar",
    "Unsupported",
    "from_schema",
    "type_name",
]


class Invalid(Exception):
    """An argument breaks the schema; ``path`` names it (empty for the arguments object)."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"argument '{path}': {rule}" if path else rule)


class Unsupported(Exception):
    """A hint (or a constraint on it) that has no JSON Schema here; ``why`` says why."""

    def __init__(self, hint: object, why: str = "") -> None:
        super().__init__(hint, why)
        self.hint, self.why = hint, why


def show(value: object) -> str:
    """A short repr for messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def type_name(hint: object) -> str:
    """A hint's name as a user wrote it."""
    if isinstance(hint, type) and not get_args(hint):
        return hint.__qualname__
    return repr(hint).replace("typing.", "")


class Node:
    """One compiled schema: ``check`` validates a JSON value and converts it for the tool.

    ``limits`` are JSON Schema constraint keywords (``minimum``, ``maxLength``, …), written
    into the schema and checked after the type.
    """

    __slots__ = ("default", "description", "limits")
    word = "any value"

    def __init__(self) -> None:
        self.description: str | None = None
        self.limits: dict[str, Any] = {}
        self.default: Any = NO_DEFAULT

    def expected(self) -> str:
        """What the node accepts, for messages."""
        return self.word

    def shallow(self, value: Any) -> bool:
        """Whether ``value`` has the right JSON type (used to pick a union option)."""
        return True

    def check(self, value: Any, path: str) -> Any:
        """``value`` converted for the tool, or :class:`Invalid`."""
        return value

    def schema(self) -> dict[str, Any]:
        """The JSON Schema."""
        out = self._schema()
        out.update(self.limits)
        if self.description:
            out["description"] = self.description
        if self.default is not NO_DEFAULT:
            out["default"] = self.default
        return out

    def _schema(self) -> dict[str, Any]:
        return {}

    def mismatch(self, value: Any, path: str) -> Invalid:
        """The error for a value of the wrong type."""
        return Invalid(path, f"expected {self.expected()}, got {show(value)}")

    def bounded(self, value: Any, path: str) -> None:
        """Check ``limits`` on the (JSON) ``value``."""
        for key, bound in self.limits.items():
            if not _LIMIT_TEST[key](value, bound):
                raise Invalid(path, f"{_LIMIT_WORDS[key]} {show(bound)}, got {show(value)}")


NO_DEFAULT: Any = object()

_LIMIT_TEST: dict[str, Callable[[Any, Any], bool]] = {
    "minimum": lambda v, b: v >= b,
    "maximum": lambda v, b: v <= b,
    "exclusiveMinimum": lambda v, b: v > b,
    "exclusiveMaximum": lambda v, b: v < b,
    "multipleOf": lambda v, b: math.isclose(v / b, round(v / b), abs_tol=1e-9),
    "minLength": lambda v, b: len(v) >= b,
    "maxLength": lambda v, b: len(v) <= b,
    "minItems": lambda v, b: len(v) >= b,
    "maxItems": lambda v, b: len(v) <= b,
    "minProperties": lambda v, b: len(v) >= b,
    "maxProperties": lambda v, b: len(v) <= b,
    "pattern": lambda v, b: re.search(b, v) is not None,
}
_LIMIT_WORDS = {
    "minimum": "must be >=",
    "maximum": "must be <=",
    "exclusiveMinimum": "must be >",
    "exclusiveMaximum": "must be <",
    "multipleOf": "must be a multiple of",
    "minLength": "must have at least this many characters:",
    "maxLength": "must have at most this many characters:",
    "minItems": "must have at least this many items:",
    "maxItems": "must have at most this many items:",
    "minProperties": "must have at least this many properties:",
    "maxProperties": "must have at most this many properties:",
    "pattern": "must match the pattern",
}

_KIND_TEST: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: not isinstance(v, bool)
    and (isinstance(v, int) or (isinstance(v, float) and v.is_integer())),
    "number": lambda v: not isinstance(v, bool) and isinstance(v, (int, float)),
}
JSON_KIND: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


class Scalar(Node):
    """A JSON string, number, integer, boolean or null (``convert`` turns a string into a
    ``date``, ``UUID``, … for the tool)."""

    __slots__ = ("convert", "format", "kind", "to_float")

    def __init__(
        self,
        kind: str,
        *,
        to_float: bool = False,
        format: str | None = None,
        convert: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__()
        self.kind = kind
        self.to_float = to_float
        self.format = format
        self.convert = convert

    def expected(self) -> str:
        return f"{self.kind} ({self.format})" if self.format else self.kind

    def shallow(self, value: Any) -> bool:
        return _KIND_TEST[self.kind](value)

    def check(self, value: Any, path: str) -> Any:
        if not self.shallow(value):
            raise self.mismatch(value, path)
        if self.limits:
            self.bounded(value, path)
        if self.convert is not None:
            try:
                return self.convert(value)
            except (ValueError, TypeError, ArithmeticError, binascii.Error) as exc:
                raise Invalid(path, f"expected {self.expected()}, got {show(value)}") from exc
        if self.kind == "integer":
            return int(value)
        if self.to_float:
            return float(value)
        return value

    def _schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind}
        if self.format == "base64":
            out["contentEncoding"] = "base64"
        elif self.format:
            out["format"] = self.format
        return out


def _tag(value: object) -> str:
    if isinstance(value, bool):
        return "b"
    if isinstance(value, (int, float)):
        return "n"
    return type(value).__name__


class EnumNode(Node):
    """A fixed set of JSON values; each maps to what the tool receives (value or member)."""

    __slots__ = ("lookup", "members", "others", "values")

    def __init__(self, entries: Sequence[tuple[Any, Any]], members: type[Enum] | None) -> None:
        super().__init__()
        self.values = [v for v, _ in entries]
        self.members = members
        self.lookup: dict[tuple[str, Any], Any] = {}
        self.others: list[tuple[Any, Any]] = []
        for value, out in entries:
            try:
                self.lookup.setdefault((_tag(value), value), out)
            except TypeError:  # unhashable (only from a hand-written schema)
                self.others.append((value, out))

    def expected(self) -> str:
        return "one of " + ", ".join(show(v) for v in self.values)

    def _find(self, value: Any) -> tuple[bool, Any]:
        if self.members is not None and isinstance(value, self.members):
            return True, value
        try:
            key = (_tag(value), value)
            if key in self.lookup:
                return True, self.lookup[key]
        except TypeError:
            pass
        for candidate, out in self.others:
            if candidate == value:
                return True, out
        return False, None

    def shallow(self, value: Any) -> bool:
        return self._find(value)[0]

    def check(self, value: Any, path: str) -> Any:
        found, out = self._find(value)
        if not found:
            raise self.mismatch(value, path)
        return out

    def _schema(self) -> dict[str, Any]:
        kinds = {JSON_KIND.get(type(v)) for v in self.values}
        out: dict[str, Any] = {}
        if len(kinds) == 1 and None not in kinds:
            out["type"] = kinds.pop()
        out["enum"] = list(self.values)
        return out


class Array(Node):
    """A JSON array, given to the tool as a list, tuple, set or frozenset."""

    __slots__ = ("container", "items", "prefix")
    word = "array"

    def __init__(
        self,
        items: Node | None,
        *,
        prefix: Sequence[Node] | None = None,
        container: Callable[[Iterable[Any]], Any] = list,
    ) -> None:
        super().__init__()
        self.items = items
        self.prefix = tuple(prefix) if prefix is not None else None
        self.container = container

    def shallow(self, value: Any) -> bool:
        return isinstance(value, (list, tuple))

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, (list, tuple)):
            raise self.mismatch(value, path)
        if self.limits:
            self.bounded(value, path)
        if self.prefix is not None:
            if len(value) != len(self.prefix):
                raise Invalid(path, f"expected {len(self.prefix)} items, got {len(value)}")
            pairs = enumerate(zip(self.prefix, value, strict=True))
            out = [n.check(v, f"{path}[{i}]") for i, (n, v) in pairs]
        elif self.items is not None:
            items = self.items
            out = [items.check(v, f"{path}[{i}]") for i, v in enumerate(value)]
        else:
            out = list(value)
        if self.container is list:
            return out
        try:
            return self.container(out)
        except TypeError as exc:  # a set of unhashable values
            raise Invalid(path, f"items must be hashable for a set: {exc}") from exc

    def _schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array"}
        if self.prefix is not None:
            n = len(self.prefix)
            out.update(prefixItems=[p.schema() for p in self.prefix], minItems=n, maxItems=n)
        elif self.items is not None:
            out["items"] = self.items.schema()
        if self.container in (set, frozenset):
            out["uniqueItems"] = True
        return out


class Obj(Node):
    """An object: named ``props`` (``closed`` rejects others) or a map of ``extra`` values;
    ``factory`` builds the tool's object from the checked properties."""

    __slots__ = ("closed", "extra", "factory", "props", "required", "top")
    word = "object"

    def __init__(
        self,
        props: Mapping[str, Node],
        required: Sequence[str] = (),
        *,
        closed: bool = True,
        extra: Node | None = None,
        factory: Callable[..., Any] | None = None,
        top: bool = False,
    ) -> None:
        super().__init__()
        self.props = dict(props)
        self.required = tuple(required)
        self.closed = closed
        self.extra = extra
        self.factory = factory
        self.top = top

    def shallow(self, value: Any) -> bool:
        return isinstance(value, Mapping)

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            if self.top:
                raise Invalid("", f"arguments must be a JSON object, got {show(value)}")
            raise self.mismatch(value, path)
        if self.limits:
            self.bounded(value, path)
        noun = "argument" if self.top else "property"
        out: dict[str, Any] = {}
        for key, item in value.items():
            node = self.props.get(key)
            if node is None:
                if self.closed:
                    raise Invalid(path, self._unexpected(key, noun))
                node = self.extra
            where = f"{path}.{key}" if path else str(key)
            out[key] = item if node is None else node.check(item, where)
        for key in self.required:
            if key not in value:
                raise Invalid(path, f"missing required {noun} '{key}'")
        if self.factory is None:
            return out
        try:
            return self.factory(**out)
        except Exception as exc:  # the class's own validators refused the values
            raise Invalid(path, f"{type(exc).__name__}: {exc}") from exc

    def _unexpected(self, key: object, word: str) -> str:
        names = ", ".join(self.props)
        known = f"expected one of: {names}" if names else f"no {word} is expected"
        return f"unexpected {word} {show(key)} ({known})"

    def _schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        if self.props or self.closed:
            out["properties"] = {k: n.schema() for k, n in self.props.items()}
            out["required"] = list(self.required)
        if self.closed:
            out["additionalProperties"] = False
        elif self.extra is not None and type(self.extra) is not Node:
            out["additionalProperties"] = self.extra.schema()
        return out


class AnyOf(Node):
    """One of several options, the first whose JSON type fits and whose check passes."""

    __slots__ = ("options",)

    def __init__(self, options: Sequence[Node]) -> None:
        super().__init__()
        self.options = tuple(options)

    def expected(self) -> str:
        return " or ".join(o.expected() for o in self.options)

    def shallow(self, value: Any) -> bool:
        return any(o.shallow(value) for o in self.options)

    def check(self, value: Any, path: str) -> Any:
        first: Invalid | None = None
        for option in self.options:
            if option.shallow(value):
                try:
                    return option.check(value, path)
                except Invalid as exc:
                    first = first or exc
        raise first or self.mismatch(value, path)

    def _schema(self) -> dict[str, Any]:
        opts = self.options
        plain = all(type(o) is Scalar and not (o.description or o.format or o.limits)
                    for o in opts)
        if plain:
            return {"type": list(dict.fromkeys(o.kind for o in opts if isinstance(o, Scalar)))}
        return {"anyOf": [o.schema() for o in opts]}


class Model(Node):
    """A pydantic model: its own JSON Schema (``$ref``s inlined), its own validation."""

    __slots__ = ("cls", "json_schema")
    word = "object"

    def __init__(self, cls: Any) -> None:
        super().__init__()
        self.cls = cls
        try:
            raw = cls.model_json_schema()
        except Exception as exc:
            raise Unsupported(cls, f"its model_json_schema() failed ({exc})") from exc
        self.json_schema = _inline_refs(raw, raw.get("$defs", {}), cls, ())

    def shallow(self, value: Any) -> bool:
        return isinstance(value, Mapping)

    def check(self, value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            raise self.mismatch(value, path)
        try:
            return self.cls.model_validate(dict(value))
        except Exception as exc:  # pydantic.ValidationError: every bad field, with its loc
            raise Invalid(path, _pydantic_errors(exc)) from None

    def _schema(self) -> dict[str, Any]:
        return dict(self.json_schema)


def _pydantic_errors(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return f"{type(exc).__name__}: {exc}"
    parts = []
    for err in errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(parts)


def _inline_refs(schema: Any, defs: Mapping[str, Any], cls: object, seen: tuple[str, ...]) -> Any:
    """``schema`` with every ``#/$defs/X`` reference replaced by its definition (a tool's
    parameter schema is nested in another document, where such references would dangle)."""
    if isinstance(schema, list):
        return [_inline_refs(s, defs, cls, seen) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name in seen:
            raise Unsupported(cls, f"recursive models are not supported ({name})")
        if name not in defs:
            raise Unsupported(cls, f"its schema refers to an unknown definition {name!r}")
        return _inline_refs(defs[name], defs, cls, (*seen, name))
    return {k: _inline_refs(v, defs, cls, seen) for k, v in schema.items() if k != "$defs"}


def from_schema(schema: Any) -> Node:
    """A permissive validator for a hand-written schema (the subset :func:`tool` writes)."""
    if not isinstance(schema, Mapping):
        return Node()
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        return EnumNode([(v, v) for v in values], None)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return AnyOf([from_schema(s) for s in schema[key]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return AnyOf([from_schema({**schema, "type": k}) for k in kind])
    if kind in ("string", "integer", "number", "boolean", "null"):
        return Scalar(kind)
    if kind == "array":
        prefix, items = schema.get("prefixItems"), schema.get("items")
        return Array(
            from_schema(items) if isinstance(items, Mapping) else None,
            prefix=[from_schema(p) for p in prefix] if isinstance(prefix, list) else None,
        )
    if kind == "object" or "properties" in schema:
        extra = schema.get("additionalProperties", True)
        props = schema.get("properties") or {}
        return Obj(
            {k: from_schema(v) for k, v in props.items()},
            [r for r in schema.get("required", ()) if isinstance(r, str)],
            closed=extra is False,
            extra=from_schema(extra) if isinstance(extra, Mapping) else None,
        )
    return Node()
