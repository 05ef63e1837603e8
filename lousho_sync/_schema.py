"""The schema compiler: a tool parameter's type hint becomes a :class:`Node` that writes its
JSON Schema and checks (and converts) the JSON value the model sends.

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

import base64
import binascii
import dataclasses
import datetime as dt
import decimal
import math
import re
import types
import uuid
from collections.abc import Callable, Iterable, Mapping, MutableSequence, Sequence, Set
from enum import Enum
from pathlib import Path, PurePath
from typing import (
    Annotated,
    Any,
    Literal,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import attrs

__all__ = [
    "AnyOf",
    "Array",
    "EnumNode",
    "Invalid",
    "Node",
    "Obj",
    "Scalar",
    "Unsupported",
    "dump_default",
    "from_hint",
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
        self.default: Any = _NO_DEFAULT

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
        if self.default is not _NO_DEFAULT:
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


_NO_DEFAULT: Any = object()

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
_JSON_KIND: dict[type, str] = {
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
        kinds = {_JSON_KIND.get(type(v)) for v in self.values}
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


# --- hints -> nodes -------------------------------------------------------------------------


def from_hint(hint: Any, stack: tuple[type, ...] = ()) -> Node:
    """The node for ``hint``; :class:`Unsupported` when it has none."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        node = from_hint(args[0], stack)
        _annotate(node, args[0], args[1:])
        return node
    if hint is Any:
        return Node()
    if hint is None or hint is type(None):
        return Scalar("null")
    if isinstance(hint, type) and origin is None:
        return _from_class(hint, stack)
    if origin is Literal:
        entries = []
        for value in args:
            out = value
            if isinstance(value, Enum):
                value = value.value
            if type(value) not in _JSON_KIND:
                raise Unsupported(hint, f"Literal value {value!r} is not a JSON scalar")
            entries.append((value, out))
        return EnumNode(entries, None)
    if origin in (Union, types.UnionType):
        options = [from_hint(a, stack) for a in args]
        if any(type(o) is Node for o in options):
            return Node()
        return AnyOf(options)
    if origin in (list, Sequence, MutableSequence) and len(args) == 1:
        return Array(from_hint(args[0], stack))
    if origin in (set, frozenset, Set) and len(args) == 1:
        return Array(from_hint(args[0], stack), container=frozenset if origin is frozenset
                     else set)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return Array(from_hint(args[0], stack), container=tuple)
        return Array(None, prefix=[from_hint(a, stack) for a in args], container=tuple)
    if origin in (dict, Mapping) and len(args) == 2:
        if args[0] is not str:
            raise Unsupported(hint, "object keys must be str")
        return Obj({}, closed=False, extra=from_hint(args[1], stack))
    raise Unsupported(hint)


def _from_class(cls: type, stack: tuple[type, ...]) -> Node:
    if issubclass(cls, Enum):
        entries = [(m.value, m) for m in cls]
        bad = [e for e, _ in entries if type(e) not in _JSON_KIND]
        if bad:
            raise Unsupported(cls, f"Enum value {bad[0]!r} is not a JSON scalar")
        return EnumNode(entries, cls)
    if cls in (bool, int, float, str):
        return Scalar(_JSON_KIND[cls], to_float=cls is float)
    special = _STRINGS.get(cls)
    if special is not None:
        fmt, convert = special
        return Scalar("string", format=fmt, convert=convert)
    if cls in (list, Sequence):
        return Array(None)
    if cls is tuple:
        return Array(None, container=tuple)
    if cls in (set, frozenset):
        return Array(None, container=cls)
    if cls in (dict, Mapping):
        return Obj({}, closed=False)
    if cls in stack:
        raise Unsupported(cls, "recursive classes are not supported")
    if attrs.has(cls):
        return _from_fields(cls, stack, _attrs_fields(cls))
    if dataclasses.is_dataclass(cls):
        return _from_fields(cls, stack, _dataclass_fields(cls))
    if is_typeddict(cls):
        return _from_typeddict(cls, stack)
    if callable(getattr(cls, "model_validate", None)) and callable(
        getattr(cls, "model_json_schema", None)
    ):
        return Model(cls)
    raise Unsupported(cls)


def _decimal(value: str) -> decimal.Decimal:
    out = decimal.Decimal(value)
    if not out.is_finite():
        raise ValueError("not a finite number")
    return out


def _bytes(value: str) -> bytes:
    return base64.b64decode(value.encode("ascii"), validate=True)


def _time(value: str) -> dt.time:
    return dt.time.fromisoformat(value)


_STRINGS: dict[type, tuple[str | None, Callable[[str], Any]]] = {
    dt.datetime: ("date-time", dt.datetime.fromisoformat),
    dt.date: ("date", dt.date.fromisoformat),
    dt.time: ("time", _time),
    uuid.UUID: ("uuid", uuid.UUID),
    Path: (None, Path),
    PurePath: (None, PurePath),
    decimal.Decimal: ("decimal", _decimal),
    bytes: ("base64", _bytes),
}
"""Types sent as JSON strings: the ``format`` written in the schema, and the conversion."""


def _attrs_fields(cls: type) -> list[tuple[str, str, Any]]:
    out = []
    for field in attrs.fields(cls):
        if not field.init:
            continue
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = _NO_DEFAULT  # made per call: nothing to write in the schema
        elif default is attrs.NOTHING:
            default = None
        else:
            default = (default,)
        out.append((field.name, field.alias or field.name, default))
    return out


def _dataclass_fields(cls: type) -> list[tuple[str, str, Any]]:
    out = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            default: Any = (field.default,)
        elif field.default_factory is not dataclasses.MISSING:
            default = _NO_DEFAULT
        else:
            default = None
        out.append((field.name, field.name, default))
    return out


def _from_fields(cls: type, stack: tuple[type, ...], fields: list[tuple[str, str, Any]]) -> Node:
    """An object node from ``(attribute, key, default)`` triples; ``default`` is None when
    required, a 1-tuple holding the default, or _NO_DEFAULT for a factory."""
    hints = _hints(cls)
    props: dict[str, Node] = {}
    required: list[str] = []
    for name, key, default in fields:
        if name not in hints:
            raise Unsupported(cls, f"field {name!r} has no type hint")
        node = from_hint(hints[name], (*stack, cls))
        props[key] = node
        if default is None:
            required.append(key)
        elif default is not _NO_DEFAULT:
            node.default = dump_default(default[0])
    return Obj(props, required, factory=cls)


def _from_typeddict(cls: type, stack: tuple[type, ...]) -> Node:
    hints = _hints(cls)
    required = getattr(cls, "__required_keys__", frozenset(hints))
    props = {k: from_hint(v, (*stack, cls)) for k, v in hints.items()}
    return Obj(props, [k for k in hints if k in required])


def _hints(cls: type) -> dict[str, Any]:
    try:
        return get_type_hints(cls, include_extras=True)
    except Exception as exc:
        raise Unsupported(cls, f"cannot resolve its type hints ({exc})") from exc


def dump_default(value: Any) -> Any:
    """A default as JSON (``_NO_DEFAULT`` when it has no JSON form)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _NO_DEFAULT
    if isinstance(value, Enum):
        return dump_default(value.value)
    if isinstance(value, (dt.date, dt.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, (uuid.UUID, PurePath, decimal.Decimal)):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [dump_default(v) for v in value]
        return _NO_DEFAULT if any(i is _NO_DEFAULT for i in items) else items
    return _NO_DEFAULT


# --- Annotated metadata ------------------------------------------------------------------

_NUMBER_BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum",
                  "le": "maximum", "multiple_of": "multipleOf"}
_LENGTH_KEYS = {"string": ("minLength", "maxLength"), "array": ("minItems", "maxItems"),
                "object": ("minProperties", "maxProperties")}
_CONSTRAINT_MODULES = ("annotated_types", "pydantic")


def _annotate(node: Node, base: Any, metadata: Sequence[Any]) -> None:
    """Apply ``Annotated`` metadata: the first string is the description; constraints from
    annotated_types / pydantic become schema keywords; unknown constraints are refused."""
    texts = [m for m in metadata if isinstance(m, str)]
    if texts:
        node.description = texts[0]
    for item in metadata:
        if isinstance(item, str):
            continue
        doc = getattr(item, "documentation", None)  # typing_extensions.Doc
        if isinstance(doc, str) and type(item).__name__ == "Doc":
            node.description = node.description or doc
            continue
        if type(item).__module__.split(".")[0] not in _CONSTRAINT_MODULES:
            continue  # other libraries' markers: not constraints of ours
        for constraint in _flatten(item, base):
            _constrain(node, constraint, base)


def _flatten(item: Any, base: Any) -> list[Any]:
    """Single constraints from a pydantic ``FieldInfo`` or an annotated_types group."""
    if type(item).__name__ == "FieldInfo":  # pydantic.Field(...)
        out: list[Any] = []
        for meta in getattr(item, "metadata", ()):
            out.extend(_flatten(meta, base))
        return out
    if type(item).__name__ in ("Interval", "Len") or (
        hasattr(item, "__iter__") and type(item).__module__.startswith("annotated_types")
    ):
        return [c for c in item if c is not None]
    return [item]


def _constrain(node: Node, item: Any, base: Any) -> None:
    kind = _kind_of(node)
    fields = _constraint_fields(item)
    if not fields:
        raise Unsupported(base, f"the constraint {item!r} cannot be written in JSON Schema")
    for name, value in fields.items():
        if name in _NUMBER_BOUNDS and kind in ("integer", "number"):
            node.limits[_NUMBER_BOUNDS[name]] = value
        elif name in ("min_length", "max_length") and kind in _LENGTH_KEYS:
            low, high = _LENGTH_KEYS[kind]
            node.limits[low if name == "min_length" else high] = value
        elif name == "pattern" and kind == "string":
            node.limits["pattern"] = value if isinstance(value, str) else value.pattern
        else:
            raise Unsupported(base, f"the constraint {item!r} does not apply to a {kind}")


def _constraint_fields(item: Any) -> dict[str, Any]:
    known = ("gt", "ge", "lt", "le", "multiple_of", "min_length", "max_length", "pattern")
    if dataclasses.is_dataclass(item):
        values = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    else:
        values = {k: getattr(item, k) for k in known if hasattr(item, k)}
        values.update({k: v for k, v in getattr(item, "__dict__", {}).items()})
    values = {k: v for k, v in values.items() if v is not None}
    if not values or set(values) - set(known):
        return {}
    return values


def _kind_of(node: Node) -> str:
    if isinstance(node, Scalar):
        return node.kind
    if isinstance(node, Array):
        return "array"
    if isinstance(node, (Obj, Model)):
        return "object"
    return "value"


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
