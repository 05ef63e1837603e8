"""Type hints to schema nodes: the hints a tool parameter may have (see
:mod:`lousho_sync._schema` for the list), ``Annotated`` descriptions and constraints, and
parameter defaults in their JSON form."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import math
import types
import uuid
from collections.abc import Callable, Mapping, MutableSequence, Sequence, Set
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

from ._schema import (
    JSON_KIND,
    NO_DEFAULT,
    AnyOf,
    Array,
    EnumNode,
    Model,
    Node,
    Obj,
    Scalar,
    Unsupported,
)

__all__ = ["dump_default", "from_hint"]

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
            if type(value) not in JSON_KIND:
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
        bad = [e for e, _ in entries if type(e) not in JSON_KIND]
        if bad:
            raise Unsupported(cls, f"Enum value {bad[0]!r} is not a JSON scalar")
        return EnumNode(entries, cls)
    if cls in (bool, int, float, str):
        return Scalar(JSON_KIND[cls], to_float=cls is float)
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
            default = NO_DEFAULT  # made per call: nothing to write in the schema
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
            default = NO_DEFAULT
        else:
            default = None
        out.append((field.name, field.name, default))
    return out


def _from_fields(cls: type, stack: tuple[type, ...], fields: list[tuple[str, str, Any]]) -> Node:
    """An object node from ``(attribute, key, default)`` triples; ``default`` is None when
    required, a 1-tuple holding the default, or NO_DEFAULT for a factory."""
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
        elif default is not NO_DEFAULT:
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
    """A default as JSON (``NO_DEFAULT`` when it has no JSON form)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else NO_DEFAULT
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
        return NO_DEFAULT if any(i is NO_DEFAULT for i in items) else items
    return NO_DEFAULT


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


