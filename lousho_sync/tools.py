"""Tools: :class:`Tool`, the :func:`tool` decorator and :func:`run_tool`.

Everything a call needs (the schema, a compiled validator/converter, the name of the
:class:`ToolContext` parameter) is computed once when the tool is built, so validating and
running a call costs O(size of its arguments). The hints a parameter may have are listed in
:mod:`lousho_sync._schema` (the compiler); descriptions come from :mod:`._docstring`.

A call runs on a worker thread (:mod:`._tool_run`), so an abort or the tool's
``timeout_s`` returns at once; an ``async def`` tool runs on lousho_aio's event loop.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import inspect
import json
import logging
import math
import re
import sys
import types
import uuid
import warnings
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import PurePath
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, overload

import attrs

from ._docstring import parse_doc
from ._hints import dump_default, from_hint
from ._schema import Invalid, Node, Obj, Unsupported, from_schema, type_name
from ._tool_run import call_async, call_sync, tool_loop
from .errors import ConfigError, LoushoWarning, PropagatingToolError
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


@attrs.frozen(slots=True)
class _Compiled:
    node: Obj
    context_param: str | None


@attrs.frozen(eq=False)
class Tool:
    """A function the model can call: ``name``, ``description``, JSON Schema ``parameters``.

    ``needs_approval`` is a bool or a predicate called with the (validated) arguments as
    keywords. ``on_interrupted`` says what happens to a call cut off by a crash:
    ``"rerun"`` runs it again on resume, ``"report"`` gives the model an error result.
    ``timeout_s`` bounds one call: past it the model gets an error result saying the call
    timed out and may or may not have taken effect (the function may still be running).
    ``approval_ttl_s``: how long a request for approval of a call waits before it is denied
    with the reason ``"expired"`` (None: the agent's ``approval_ttl_s``, else forever).
    ``fn`` may be an ``async def`` function (``is_async``): such a tool runs only through
    :mod:`lousho_aio`, on its event loop. Build one with :func:`tool`; a ``Tool`` made by
    hand validates against its own ``parameters`` (without Enum/attrs conversion). Calling
    the tool calls ``fn``. Immutable, so safe to share between threads.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Any]
    needs_approval: bool | Callable[..., bool] = False
    on_interrupted: Literal["rerun", "report"] = "rerun"
    timeout_s: float | None = None
    approval_ttl_s: float | None = None
    _compiled: _Compiled | None = attrs.field(
        default=None, kw_only=True, repr=False, alias="_compiled"
    )
    _spec: ToolSpec = attrs.field(init=False, repr=False)
    is_async: bool = attrs.field(init=False, repr=False)

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
        limit = self.timeout_s
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, (int, float))
            or not math.isfinite(limit) or limit <= 0
        ):
            raise ConfigError(f"{where}: timeout_s must be a number of seconds > 0, got {limit!r}")
        ttl = self.approval_ttl_s
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, (int, float))
            or not math.isfinite(ttl) or ttl <= 0
        ):
            raise ConfigError(
                f"{where}: approval_ttl_s must be a number of seconds > 0 or None, got {ttl!r}"
            )
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))
        if self._compiled is None:
            node = from_schema(self.parameters)
            if not isinstance(node, Obj):
                node = Obj({}, closed=False)
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
        except Invalid as exc:
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
        except Invalid:
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


def _build(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    needs_approval: bool | Callable[..., bool],
    on_interrupted: Literal["rerun", "report"],
    timeout_s: float | None,
    approval_ttl_s: float | None = None,
) -> Tool:
    label = getattr(fn, "__qualname__", None) or repr(fn)
    if not callable(fn):
        raise ConfigError(f"@tool needs a function, got {type(fn).__name__}")
    tool_name = name or getattr(fn, "__name__", None)
    if not tool_name:
        raise ConfigError(f"tool function {label} has no __name__: pass name=")
    try:
        hints = get_type_hints(fn, include_extras=True)
        signature = inspect.signature(fn)
    except Exception as exc:
        raise ConfigError(f"tool function {label}: cannot read its type hints ({exc})") from exc
    summary, arg_docs = parse_doc(getattr(fn, "__doc__", None))
    props: dict[str, Node] = {}
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
            node = from_hint(hint)
        except Unsupported as exc:
            inner = "" if exc.hint == hint else f" in {type_name(hint)}"
            why = f": {exc.why}" if exc.why else ""
            bad = type_name(exc.hint)
            raise ConfigError(f"{where} has unsupported type {bad}{inner}{why}") from None
        if node.description is None and param.name in arg_docs:
            node.description = arg_docs[param.name]
        props[param.name] = node
        if param.default is param.empty:
            required.append(param.name)
        else:
            node.default = dump_default(param.default)
    node = Obj(props, required, top=True)
    text = summary if description is None else description
    if not text:
        _warn_undescribed(tool_name, label)
    return Tool(
        tool_name,
        text,
        node.schema(),
        fn,
        needs_approval,
        on_interrupted,
        timeout_s,
        approval_ttl_s,
        _compiled=_Compiled(node, context_param),
    )


_warned: set[str] = set()


def _warn_undescribed(name: str, label: str) -> None:
    """Warn once per function: a model picks tools by their descriptions."""
    if label in _warned:
        return
    _warned.add(label)
    frame, level = sys._getframe(0), 1  # point at the user's decorator line
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"tool {name!r} ({label}) has no description: the model sees only its name. Give the "
        "function a docstring or pass description=",
        LoushoWarning,
        stacklevel=level,
    )


@overload
def tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool | Callable[..., bool] = False,
    on_interrupted: Literal["rerun", "report"] = "rerun",
    timeout_s: float | None = None,
    approval_ttl_s: float | None = None,
) -> Tool: ...


@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool | Callable[..., bool] = False,
    on_interrupted: Literal["rerun", "report"] = "rerun",
    timeout_s: float | None = None,
    approval_ttl_s: float | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool | Callable[..., bool] = False,
    on_interrupted: Literal["rerun", "report"] = "rerun",
    timeout_s: float | None = None,
    approval_ttl_s: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` of a function, bare (``@tool``) or with options (``@tool(...)``).

    The schema comes from the type hints, the description from the docstring's first
    paragraph (``description=`` overrides it), per-parameter descriptions from
    ``Annotated[T, "..."]`` or the docstring's ``Args:``/``:param x:`` lines; defaults are
    written into the schema. Unsupported hints, and constraints that cannot be kept, raise
    :class:`ConfigError` here, not at call time; a function without a description warns
    (:class:`~lousho_sync.errors.LoushoWarning`) once. ``timeout_s`` bounds each call (see
    :class:`Tool`); ``approval_ttl_s`` how long an approval request of a call waits before
    it is denied as expired; ``async def`` functions make tools that run through lousho_aio.
    """

    def decorate(f: Callable[..., Any]) -> Tool:
        return _build(f, name, description, needs_approval, on_interrupted, timeout_s,
                      approval_ttl_s)

    return decorate if fn is None else decorate(fn)


def run_tool(
    tool: Tool | None, call: ToolCall, *, context: ToolContext, here: bool = False
) -> tuple[str, bool]:
    """Run ``call`` with ``tool``; returns ``(result_text, is_error)``.

    The function runs on a worker thread (an ``async def`` one on lousho_aio's loop), so an
    abort of ``context.signal`` or the tool's ``timeout_s`` returns at once, with an error
    result; with ``here`` (nobody can abort the turn while it runs) a plain function without
    ``timeout_s`` runs on this thread. An unknown tool, invalid arguments or an ordinary
    exception become an error result; :class:`PropagatingToolError` and non-``Exception``
    base exceptions propagate.
    """
    if tool is None:
        return f"unknown tool {call.name!r}", True
    try:
        kwargs = tool._bind(call.arguments)
    except Invalid as exc:
        return f"invalid arguments for tool {tool.name!r}: {exc}", True
    compiled = tool._compiled
    if compiled is not None and compiled.context_param is not None:
        kwargs[compiled.context_param] = context
    signal, limit = context.signal, tool.timeout_s
    if tool.is_async:
        loop = tool_loop()
        if loop is None:
            raise ConfigError(async_refusal(tool.name))
        status, result, error = call_async(tool.fn, kwargs, loop, signal=signal, timeout_s=limit)
    else:
        status, result, error = call_sync(tool.fn, kwargs, signal=signal, timeout_s=limit,
                                          here=here)
    if status == "aborted":
        return f"{tool.name}: the turn was aborted while the call ran", True
    if status == "timeout":
        _log.info("tool %s (call %s) timed out after %g s", tool.name, call.id, limit)
        return _TIMED_OUT.format(call=call, limit=limit), True
    if error is not None:
        if isinstance(error, PropagatingToolError) or not isinstance(error, Exception):
            raise error
        _log.info("tool %s (call %s) failed: %s: %s", tool.name, call.id, type(error).__name__,
                  error, exc_info=error if _log.isEnabledFor(logging.DEBUG) else None)
        return f"{tool.name} failed: {type(error).__name__}: {error}", True
    try:
        return _to_text(result), False
    except Exception as exc:
        _log.info("tool %s (call %s): result not convertible: %r", tool.name, call.id, exc)
        return f"{tool.name} failed: cannot turn its result into text: {exc!r}", True


_TIMED_OUT = (
    "error: the call {call.id} to {call.name} timed out after {limit:g} s; it may or may not "
    "have taken effect (it may still be running). Check before retrying."
)


def async_refusal(name: str) -> str:
    """Why the sync core cannot run the ``async def`` tool ``name``."""
    return (
        f"tool {name!r} is an async def function, which runs only on an event loop: use this "
        "agent through lousho_aio (lousho_aio.create_agent), or make the tool a plain def"
    )


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
    if isinstance(value, (dt.date, dt.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal, PurePath)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    dump = getattr(value, "model_dump", None)  # a pydantic model
    if callable(dump):
        return dump(mode="json")
    return str(value)


def _key(key: object) -> object:
    if isinstance(key, Enum):
        key = key.value
    return key if key is None or isinstance(key, (str, int, float, bool)) else str(key)
