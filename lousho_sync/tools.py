"""Tools: :class:`Tool`, the :func:`tool` decorator, JSON Schema from type hints, argument
validation and :func:`run_tool`.

Everything a call needs (the schema, a compiled validator/converter, the name of the
:class:`ToolContext` parameter) is computed once when the tool is built, so validating and
running a call costs O(size of its arguments).

Supported hints: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``, unions and
``Optional``, ``list[X]``, ``tuple[X, ...]``, ``Sequence[X]``, fixed ``tuple[X, Y]``,
``dict[str, X]``/``Mapping[str, X]``, ``Literal[...]``, ``Enum`` subclasses, attrs classes,
and ``Annotated[T, "description"]``. Anything else raises :class:`ConfigError`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import re
import types
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints, overload

import attrs

from .errors import ConfigError, PropagatingToolError
from .messages import ToolCall
from .providers.base import ToolSpec
from .signal import Signal

__all__ = ["Tool", "ToolContext", "run_tool", "tool"]

_log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@attrs.frozen(slots=True)
class ToolContext:
    """Given to a tool parameter annotated ``ToolContext`` (never part of the schema).

    ``call.id`` is stable across a crash and resume, so a tool can use it to be idempotent.
    """

    call: ToolCall
    session_id: str | None
    signal: Signal


class _Invalid(Exception):
    """An argument breaks the schema; ``path`` names it (empty for the arguments object)."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"argument '{path}': {rule}" if path else rule)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Node:
    """One compiled schema: ``check`` validates a JSON value and converts it for the tool."""

    __slots__ = ("description",)
    word = "any value"

    def __init__(self) -> None:
        self.description: str | None = None

    def expected(self) -> str:
        """What the node accepts, for messages."""
        return self.word

    def shallow(self, value: Any) -> bool:
        """Whether ``value`` has the right JSON type (used to pick a union option)."""
        return True

    def check(self, value: Any, path: str) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        out = self._schema()
        if self.description:
            out["description"] = self.description
        return out

    def _schema(self) -> dict[str, Any]:
        return {}

    def mismatch(self, value: Any, path: str) -> _Invalid:
        return _Invalid(path, f"expected {self.expected()}, got {_show(value)}")


class _Scalar(_Node):
    __slots__ = ("kind", "to_float")

    def __init__(self, kind: str, *, to_float: bool = False) -> None:
        super().__init__()
        self.kind = kind
        self.to_float = to_float

    def expected(self) -> str:
        return self.kind

    def shallow(self, value: Any) -> bool:
        return _KIND_TEST[self.kind](value)

    def check(self, value: Any, path: str) -> Any:
        if not self.shallow(value):
            raise self.mismatch(value, path)
        if self.kind == "integer":
            return int(value)
        if self.to_float:
            return float(value)
        return value

    def _schema(self) -> dict[str, Any]:
        return {"type": self.kind}


_KIND_TEST: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: not isinstance(v, bool)
    and (isinstance(v, int) or (isinstance(v, float) and v.is_integer())),
    "number": lambda v: not isinstance(v, bool) and isinstance(v, (int, float)),
}


def _tag(value: object) -> str:
    if isinstance(value, bool):
        return "b"
    if isinstance(value, (int, float)):
        return "n"
    return type(value).__name__


class _Enum(_Node):
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
        return "one of " + ", ".join(_show(v) for v in self.values)

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


_JSON_KIND: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


class _Array(_Node):
    __slots__ = ("container", "items", "prefix")
    word = "array"

    def __init__(
        self,
        items: _Node | None,
        *,
        prefix: Sequence[_Node] | None = None,
        container: type[list[Any]] | type[tuple[Any, ...]] = list,
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
        if self.prefix is not None:
            if len(value) != len(self.prefix):
                raise _Invalid(path, f"expected {len(self.prefix)} items, got {len(value)}")
            pairs = enumerate(zip(self.prefix, value, strict=True))
            out = [n.check(v, f"{path}[{i}]") for i, (n, v) in pairs]
        elif self.items is not None:
            items = self.items
            out = [items.check(v, f"{path}[{i}]") for i, v in enumerate(value)]
        else:
            out = list(value)
        return tuple(out) if self.container is tuple else out

    def _schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array"}
        if self.prefix is not None:
            n = len(self.prefix)
            out.update(prefixItems=[p.schema() for p in self.prefix], minItems=n, maxItems=n)
        elif self.items is not None:
            out["items"] = self.items.schema()
        return out


class _Object(_Node):
    """An object: named ``props`` (``closed`` rejects others) or a map of ``extra`` values."""

    __slots__ = ("closed", "extra", "factory", "props", "required", "top")
    word = "object"

    def __init__(
        self,
        props: Mapping[str, _Node],
        required: Sequence[str] = (),
        *,
        closed: bool = True,
        extra: _Node | None = None,
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
                raise _Invalid("", f"arguments must be a JSON object, got {_show(value)}")
            raise self.mismatch(value, path)
        noun = "argument" if self.top else "property"
        out: dict[str, Any] = {}
        for key, item in value.items():
            node = self.props.get(key)
            if node is None:
                if self.closed:
                    raise _Invalid(path, self._unexpected(key, noun))
                node = self.extra
            where = f"{path}.{key}" if path else str(key)
            out[key] = item if node is None else node.check(item, where)
        for key in self.required:
            if key not in value:
                raise _Invalid(path, f"missing required {noun} '{key}'")
        if self.factory is None:
            return out
        try:
            return self.factory(**out)
        except Exception as exc:  # the class's own validators refused the values
            raise _Invalid(path, f"{type(exc).__name__}: {exc}") from exc

    def _unexpected(self, key: object, word: str) -> str:
        names = ", ".join(self.props)
        known = f"expected one of: {names}" if names else f"no {word} is expected"
        return f"unexpected {word} {_show(key)} ({known})"

    def _schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        if self.props or self.closed:
            out["properties"] = {k: n.schema() for k, n in self.props.items()}
            out["required"] = list(self.required)
        if self.closed:
            out["additionalProperties"] = False
        elif self.extra is not None and type(self.extra) is not _Node:
            out["additionalProperties"] = self.extra.schema()
        return out


class _AnyOf(_Node):
    __slots__ = ("options",)

    def __init__(self, options: Sequence[_Node]) -> None:
        super().__init__()
        self.options = tuple(options)

    def expected(self) -> str:
        return " or ".join(o.expected() for o in self.options)

    def shallow(self, value: Any) -> bool:
        return any(o.shallow(value) for o in self.options)

    def check(self, value: Any, path: str) -> Any:
        first: _Invalid | None = None
        for option in self.options:
            if option.shallow(value):
                try:
                    return option.check(value, path)
                except _Invalid as exc:
                    first = first or exc
        raise first or self.mismatch(value, path)

    def _schema(self) -> dict[str, Any]:
        opts = self.options
        if all(type(o) is _Scalar and not o.description for o in opts):
            return {"type": list(dict.fromkeys(o.kind for o in opts if isinstance(o, _Scalar)))}
        return {"anyOf": [o.schema() for o in opts]}


class _Unsupported(Exception):
    def __init__(self, hint: object, why: str = "") -> None:
        super().__init__(hint, why)
        self.hint, self.why = hint, why


def _type_name(hint: object) -> str:
    if isinstance(hint, type) and not get_args(hint):
        return hint.__qualname__
    return repr(hint).replace("typing.", "")


def _from_hint(hint: Any, stack: tuple[type, ...] = ()) -> _Node:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        node = _from_hint(args[0], stack)
        texts = [m for m in args[1:] if isinstance(m, str)]
        if texts:
            node.description = texts[0]
        return node
    if hint is Any:
        return _Node()
    if hint is None or hint is type(None):
        return _Scalar("null")
    if isinstance(hint, type) and origin is None:
        return _from_class(hint, stack)
    if origin is Literal:
        entries = []
        for value in args:
            out = value
            if isinstance(value, Enum):
                value = value.value
            if type(value) not in _JSON_KIND:
                raise _Unsupported(hint, f"Literal value {value!r} is not a JSON scalar")
            entries.append((value, out))
        return _Enum(entries, None)
    if origin in (Union, types.UnionType):
        options = [_from_hint(a, stack) for a in args]
        if any(type(o) is _Node for o in options):
            return _Node()
        return _AnyOf(options)
    if origin in (list, Sequence, MutableSequence) and len(args) == 1:
        return _Array(_from_hint(args[0], stack))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _Array(_from_hint(args[0], stack), container=tuple)
        return _Array(None, prefix=[_from_hint(a, stack) for a in args], container=tuple)
    if origin in (dict, Mapping) and len(args) == 2:
        if args[0] is not str:
            raise _Unsupported(hint, "object keys must be str")
        return _Object({}, closed=False, extra=_from_hint(args[1], stack))
    raise _Unsupported(hint)


def _from_class(cls: type, stack: tuple[type, ...]) -> _Node:
    if issubclass(cls, Enum):
        entries = [(m.value, m) for m in cls]
        bad = [e for e, _ in entries if type(e) not in _JSON_KIND]
        if bad:
            raise _Unsupported(cls, f"Enum value {bad[0]!r} is not a JSON scalar")
        return _Enum(entries, cls)
    if cls in (bool, int, float, str):
        return _Scalar(_JSON_KIND[cls], to_float=cls is float)
    if cls in (list, Sequence):
        return _Array(None)
    if cls is tuple:
        return _Array(None, container=tuple)
    if cls in (dict, Mapping):
        return _Object({}, closed=False)
    if attrs.has(cls):
        return _from_attrs(cls, stack)
    raise _Unsupported(cls)


def _from_attrs(cls: type, stack: tuple[type, ...]) -> _Node:
    if cls in stack:
        raise _Unsupported(cls, "recursive attrs classes are not supported")
    try:
        hints = get_type_hints(cls, include_extras=True)
    except Exception as exc:
        raise _Unsupported(cls, f"cannot resolve its type hints ({exc})") from exc
    props: dict[str, _Node] = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        if not field.init:
            continue
        if field.name not in hints:
            raise _Unsupported(cls, f"field {field.name!r} has no type hint")
        key = field.alias or field.name
        props[key] = _from_hint(hints[field.name], (*stack, cls))
        if field.default is attrs.NOTHING:
            required.append(key)
    return _Object(props, required, factory=cls)


_SECTION = re.compile(
    r"^(args|arguments|parameters|params|keyword args|keyword arguments|other parameters|"
    r"returns?|yields?|raises|examples?|notes?|attributes|see also|warnings?|todo)\s*:\s*$",
    re.IGNORECASE,
)
_ARG_SECTIONS = {"args", "arguments", "parameters", "params", "keyword args",
                 "keyword arguments", "other parameters"}
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?\*{0,2}(\w+)\s*:\s*(.*)$")
_GOOGLE_ARG = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_doc(doc: str | None) -> tuple[str, dict[str, str]]:
    """The first paragraph and per-parameter descriptions (Google ``Args:`` and ``:param``)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    for line in lines:
        text = line.strip()
        if not text or _SECTION.match(text) or text.startswith(":"):
            break
        summary.append(text)
    params: dict[str, str] = {}
    section_indent: int | None = None  # inside a Google args section when not None
    entry_indent: int | None = None
    current: str | None = None
    for line in lines:
        text = line.strip()
        indent = len(line) - len(line.lstrip())
        header = _SECTION.match(text)
        if header:
            arg_section = header.group(1).lower() in _ARG_SECTIONS
            section_indent, entry_indent, current = (indent if arg_section else None), None, None
            continue
        sphinx = _SPHINX_PARAM.match(text)
        if sphinx:
            section_indent, current = None, sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            entry_indent = indent
            continue
        if not text or text.startswith(":"):
            current = None if text else current
            continue
        if section_indent is not None:
            if indent <= section_indent:
                section_indent = current = None
                continue
            entry_indent = indent if entry_indent is None else entry_indent
            entry = _GOOGLE_ARG.match(text) if indent == entry_indent else None
            if entry:
                current = entry.group(1)
                params[current] = entry.group(2).strip()
                continue
        if current is not None and entry_indent is not None and indent > entry_indent:
            params[current] = f"{params[current]} {text}".strip()
    return " ".join(summary), params


@attrs.frozen(slots=True)
class _Compiled:
    node: _Object
    context_param: str | None


@attrs.frozen(eq=False)
class Tool:
    """A function the model can call: ``name``, ``description``, JSON Schema ``parameters``.

    ``needs_approval`` is a bool or a predicate called with the (validated) arguments as
    keywords. ``on_interrupted`` says what happens to a call cut off by a crash:
    ``"rerun"`` runs it again on resume, ``"report"`` gives the model an error result.
    Build one with :func:`tool`; a ``Tool`` made by hand validates against its own
    ``parameters`` (without Enum/attrs conversion). Calling the tool calls ``fn``.
    Immutable, so safe to share between threads.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Any]
    needs_approval: bool | Callable[..., bool] = False
    on_interrupted: Literal["rerun", "report"] = "rerun"
    _compiled: _Compiled | None = attrs.field(
        default=None, kw_only=True, repr=False, alias="_compiled"
    )
    _spec: ToolSpec = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        where, approval = f"tool {self.name!r}", self.needs_approval
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(f"{where}: the name must be 1-64 letters, digits, '_' or '-'")
        if self.on_interrupted not in ("rerun", "report"):
            got = self.on_interrupted
            raise ConfigError(f"{where}: on_interrupted must be 'rerun' or 'report', got {got!r}")
        if not isinstance(approval, bool) and not callable(approval):
            got = type(approval).__name__
            raise ConfigError(f"{where}: needs_approval must be a bool or a callable, got {got}")
        if not isinstance(self.parameters, Mapping):
            raise ConfigError(f"{where}: parameters must be a JSON Schema object")
        if self._compiled is None:
            node = _from_schema(self.parameters)
            if not isinstance(node, _Object):
                node = _Object({}, closed=False)
            node.top = True
            object.__setattr__(self, "_compiled", _Compiled(node, _context_param(self.fn)))
        spec = ToolSpec(self.name, self.description, self.parameters)
        object.__setattr__(self, "_spec", spec)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly (no validation)."""
        return self.fn(*args, **kwargs)

    def spec(self) -> ToolSpec:
        """The tool as the model sees it (built once)."""
        return self._spec

    def validate(self, arguments: Mapping[str, Any]) -> str | None:
        """None when ``arguments`` are valid, else a message naming the argument and rule."""
        try:
            self._bind(arguments)
        except _Invalid as exc:
            return str(exc)
        return None

    def requires_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Whether this call needs a human's approval.

        A predicate sees the converted arguments; invalid arguments need no approval (the
        call will not run), and a predicate that raises asks for approval.
        """
        if isinstance(self.needs_approval, bool):
            return self.needs_approval
        try:
            kwargs = self._bind(arguments)
        except _Invalid:
            return False
        try:
            return bool(self.needs_approval(**kwargs))
        except Exception:
            _log.warning("needs_approval of tool %r raised; asking for approval", self.name,
                         exc_info=True)
            return True

    def _bind(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        assert self._compiled is not None
        return self._compiled.node.check(arguments, "")  # type: ignore[no-any-return]


def _is_context(hint: object) -> bool:
    """``ToolContext`` or ``ToolContext | None``."""
    if get_origin(hint) in (Union, types.UnionType):
        return ToolContext in get_args(hint) and set(get_args(hint)) <= {ToolContext, type(None)}
    return hint is ToolContext


def _context_param(fn: Callable[..., Any]) -> str | None:
    try:
        hints = get_type_hints(fn)
    except Exception:
        return None
    names = [k for k, v in hints.items() if _is_context(v) and k != "return"]
    return names[0] if names else None


def _from_schema(schema: Any) -> _Node:
    """A permissive validator for a hand-written schema (the subset :func:`tool` writes)."""
    if not isinstance(schema, Mapping):
        return _Node()
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        return _Enum([(v, v) for v in values], None)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return _AnyOf([_from_schema(s) for s in schema[key]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return _AnyOf([_from_schema({**schema, "type": k}) for k in kind])
    if kind in ("string", "integer", "number", "boolean", "null"):
        return _Scalar(kind)
    if kind == "array":
        prefix, items = schema.get("prefixItems"), schema.get("items")
        return _Array(
            _from_schema(items) if isinstance(items, Mapping) else None,
            prefix=[_from_schema(p) for p in prefix] if isinstance(prefix, list) else None,
        )
    if kind == "object" or "properties" in schema:
        extra = schema.get("additionalProperties", True)
        props = schema.get("properties") or {}
        return _Object(
            {k: _from_schema(v) for k, v in props.items()},
            [r for r in schema.get("required", ()) if isinstance(r, str)],
            closed=extra is False,
            extra=_from_schema(extra) if isinstance(extra, Mapping) else None,
        )
    return _Node()


def _build(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    needs_approval: bool | Callable[..., bool],
    on_interrupted: Literal["rerun", "report"],
) -> Tool:
    label = getattr(fn, "__qualname__", None) or repr(fn)
    if not callable(fn):
        raise ConfigError(f"@tool needs a function, got {type(fn).__name__}")
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(f"tool function {label}: async functions are not supported here")
    tool_name = name or getattr(fn, "__name__", None)
    if not tool_name:
        raise ConfigError(f"tool function {label} has no __name__: pass name=")
    try:
        hints = get_type_hints(fn, include_extras=True)
        signature = inspect.signature(fn)
    except Exception as exc:
        raise ConfigError(f"tool function {label}: cannot read its type hints ({exc})") from exc
    summary, arg_docs = _parse_doc(getattr(fn, "__doc__", None))
    props: dict[str, _Node] = {}
    required: list[str] = []
    context_param: str | None = None
    for param in signature.parameters.values():
        where = f"tool function {label}: parameter {param.name!r}"
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ConfigError(f"{where}: *args, **kwargs and positional-only are not supported")
        if param.name not in hints:
            raise ConfigError(f"{where} has no type hint")
        hint = hints[param.name]
        if _is_context(hint):
            context_param = param.name
            continue
        try:
            node = _from_hint(hint)
        except _Unsupported as exc:
            inner = "" if exc.hint == hint else f" in {_type_name(hint)}"
            why = f": {exc.why}" if exc.why else ""
            bad = _type_name(exc.hint)
            raise ConfigError(f"{where} has unsupported type {bad}{inner}{why}") from None
        if node.description is None and param.name in arg_docs:
            node.description = arg_docs[param.name]
        props[param.name] = node
        if param.default is param.empty:
            required.append(param.name)
    node = _Object(props, required, top=True)
    return Tool(
        tool_name,
        summary if description is None else description,
        node.schema(),
        fn,
        needs_approval,
        on_interrupted,
        _compiled=_Compiled(node, context_param),
    )


@overload
def tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool | Callable[..., bool] = False,
    on_interrupted: Literal["rerun", "report"] = "rerun",
) -> Tool: ...


@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool | Callable[..., bool] = False,
    on_interrupted: Literal["rerun", "report"] = "rerun",
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool | Callable[..., bool] = False,
    on_interrupted: Literal["rerun", "report"] = "rerun",
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` of a function, bare (``@tool``) or with options (``@tool(...)``).

    The schema comes from the type hints, the description from the docstring's first
    paragraph (``description=`` overrides it), per-parameter descriptions from
    ``Annotated[T, "..."]`` or the docstring's ``Args:``/``:param x:`` lines. Unsupported
    hints raise :class:`ConfigError` here, not at call time.
    """

    def decorate(f: Callable[..., Any]) -> Tool:
        return _build(f, name, description, needs_approval, on_interrupted)

    return decorate if fn is None else decorate(fn)


def run_tool(tool: Tool | None, call: ToolCall, *, context: ToolContext) -> tuple[str, bool]:
    """Run ``call`` with ``tool``; returns ``(result_text, is_error)``.

    An unknown tool, invalid arguments or an ordinary exception become an error result;
    :class:`PropagatingToolError` and non-``Exception`` base exceptions propagate.
    """
    if tool is None:
        return f"unknown tool {call.name!r}", True
    try:
        kwargs = tool._bind(call.arguments)
    except _Invalid as exc:
        return f"invalid arguments for tool {tool.name!r}: {exc}", True
    compiled = tool._compiled
    if compiled is not None and compiled.context_param is not None:
        kwargs[compiled.context_param] = context
    try:
        result = tool.fn(**kwargs)
    except PropagatingToolError:
        raise
    except Exception as exc:
        _log.info("tool %s (call %s) failed: %s: %s", tool.name, call.id, type(exc).__name__,
                  exc, exc_info=_log.isEnabledFor(logging.DEBUG))
        return f"{tool.name} failed: {type(exc).__name__}: {exc}", True
    try:
        return _to_text(result), False
    except Exception as exc:
        _log.info("tool %s (call %s): result not convertible: %r", tool.name, call.id, exc)
        return f"{tool.name} failed: cannot turn its result into text: {exc!r}", True


def _to_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    data = _jsonable(value)
    if isinstance(data, str):  # a str-valued Enum or the str() fallback: send as is
        return data
    return json.dumps(data, ensure_ascii=False)


def _jsonable(value: object) -> Any:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Enum):
        return _jsonable(value.value)
    cls = type(value)
    if attrs.has(cls):
        return {f.name: _jsonable(getattr(value, f.name)) for f in attrs.fields(cls)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {_key(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return str(value)


def _key(key: object) -> object:
    if isinstance(key, Enum):
        key = key.value
    return key if key is None or isinstance(key, (str, int, float, bool)) else str(key)
