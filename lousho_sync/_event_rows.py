"""The event log's rows: the JSON of a run event, and of a write of several (one row,
split again by seq when read); what the log's bound merges (:func:`merge_deltas`).

A lone event is its own JSON object without its seq and turn id, which the row holds
(:func:`encode`, :func:`decode`; a text delta is written and read without a dict, as the
commonest row). A write of several events with consecutive seqs is one row under the seq
of the last, ``{"type":"events","first":<seq>,"items":[...]}``, a text delta being its text
and any other event its object (:func:`encode_rows`); :func:`events_of` gives the events
of any row after a seq. The memory log keeps the events themselves (a write: a tuple of
them). A row this release cannot read is a StoreCorruptError naming ``turn:seq``.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from . import errors as _errors
from ._message_form import dump_tool_call, dump_usage, load_tool_call, load_usage
from .codec import message_from_dict, message_to_dict, result_from_dict, result_to_dict
from .errors import LoushoError, StoreCorruptError
from .events import (
    ApprovalRequested,
    Event,
    InputApplied,
    InputQueued,
    RunDone,
    RunEvent,
    RunFailed,
    RunStart,
    StepReset,
    StepStart,
    TextDelta,
    ToolCallStart,
    ToolResultEvent,
    UsageEvent,
)

__all__ = ["decode", "encode", "encode_rows", "events_of", "merge_deltas"]


# --- the JSON of an event, and of a write of several ---------------------------------------------
def _error_dict(exc: BaseException) -> dict[str, Any]:
    fields = {k: v for k, v in getattr(exc, "__dict__", {}).items()
              if isinstance(v, str | int | float | bool | type(None))}
    return {"class": type(exc).__name__, "message": str(exc), "fields": fields}


def _error_of(d: dict[str, Any]) -> BaseException:
    name, message = str(d.get("class", "")), str(d.get("message", ""))
    fields = d.get("fields") or {}
    cls = getattr(_errors, name, None)
    if isinstance(cls, type) and issubclass(cls, LoushoError):
        error: BaseException = cls.__new__(cls)
        error.args = (message,)
        error.__dict__.update(fields)
        return error
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        try:
            return builtin(message)
        except Exception:
            pass
    return LoushoError(f"{name}: {message}")


_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_DELTA = '{"type":"text.delta","text":'
"""How the row of a text delta starts (the commonest row: encoded and read without a dict)."""


def _dict_of(event: RunEvent) -> dict[str, Any]:
    """The JSON object of a run event (without its seq and turn id)."""
    d: dict[str, Any] = {"type": event.type}
    if isinstance(event, TextDelta):
        d["text"] = event.text
    elif isinstance(event, StepStart | StepReset):
        d["step"] = event.step
    elif isinstance(event, RunStart):
        d["session_id"] = event.session_id
        d["input"] = [message_to_dict(m) for m in event.input]
        d["sealed"] = True  # this release seals the turn's commit (see seal_turn)
    elif isinstance(event, ToolCallStart):
        d["call"] = dump_tool_call(event.call)
    elif isinstance(event, ToolResultEvent):
        d.update(call_id=event.call_id, result=event.result, is_error=event.is_error)
    elif isinstance(event, ApprovalRequested):
        d.update(approval_id=event.approval_id, call=dump_tool_call(event.call))
    elif isinstance(event, InputQueued | InputApplied):
        d["input"] = [message_to_dict(m) for m in event.input]
    elif isinstance(event, UsageEvent):
        d.update(usage=dump_usage(event.usage), total=dump_usage(event.total))
    elif isinstance(event, RunFailed):
        d["error"] = _error_dict(event.error)
    elif isinstance(event, RunDone):
        d["finish_reason"] = event.finish_reason
        d["result"] = None if event.result is None else result_to_dict(event.result)
    return d


def encode(event: RunEvent) -> str:
    """The JSON row of a run event (without its seq and turn id, which the row holds)."""
    if type(event) is TextDelta:  # what json.dumps makes of {"type": ..., "text": ...}
        return _DELTA + encode_basestring_ascii(event.text) + "}"
    return json.dumps(_dict_of(event), ensure_ascii=True, separators=(",", ":"))


_BATCH = '{"type":"events","first":'
"""How the row of a write of several events starts (see :func:`encode_rows`)."""


def encode_rows(events: Sequence[RunEvent]) -> list[tuple[int, str]]:
    """The rows ``(seq, JSON)`` of one write of ``events`` (their seqs growing, as a turn's
    always do). Several events with consecutive seqs (a turn's always are) make one row
    under the last seq,
    ``{"type":"events","first":<seq>,"items":[...]}``, where a text delta is its text and
    any other event its object: a write of 1,000 deltas is one list of strings encoded in
    C, where 1,000 rows of their own cost a millisecond to encode, store and read back."""
    n = len(events)
    if n == 1:
        return [(events[0].seq, encode(events[0]))]
    first = events[0].seq if n else 0
    if n == 0 or events[-1].seq - first != n - 1:  # (growing seqs: consecutive)
        return [(e.seq, encode(e)) for e in events]
    items = [e.text if type(e) is TextDelta else _dict_of(e)
             for e in events]
    text = json.dumps(items, ensure_ascii=True, separators=(",", ":"))
    return [(events[-1].seq, f'{_BATCH}{first},"items":{text}}}')]


def events_of(row: Any, turn_id: str, seq: int, after: int) -> list[Event]:
    """The events with seq > ``after`` of the row stored under ``seq``: one event, the
    events of a write (:func:`encode_rows`; the memory log's: a tuple of the events);
    StoreCorruptError for a row this release cannot read."""
    if type(row) is tuple:
        return [e for e in row if e.seq > after]
    if type(row) is str and row.startswith(_BATCH):
        try:
            d = json.loads(row)
            first, items = d["first"], d["items"]
            ok = (type(first) is int and type(items) is list and len(items) > 0
                  and first + len(items) - 1 == seq)
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise StoreCorruptError(
                f"event {turn_id}:{seq} in the event log cannot be read: a write's row that "
                "is not a list of events ending at its seq")
        out: list[Event] = []
        for k in range(max(0, after + 1 - first), len(items)):
            item = items[k]
            if type(item) is str:
                out.append(TextDelta(run_id=turn_id, seq=first + k, text=item))
            elif type(item) is dict:
                out.append(_from_dict(item, turn_id, first + k))
            else:
                raise StoreCorruptError(
                    f"event {turn_id}:{first + k} in the event log cannot be read: a "
                    f"{type(item).__name__} where an event is")
        return out
    if seq <= after:
        return []
    return [_event_of(row, turn_id, seq)]


def decode(text: str | bytes | RunEvent, turn_id: str, seq: int) -> Event:
    """The event of a row that holds one (its JSON, or the event itself where the memory
    log keeps it); StoreCorruptError for a row this release cannot read."""
    if isinstance(text, RunEvent):
        return text  # type: ignore[return-value]  # every RunEvent published is an Event
    if type(text) is str and text.startswith(_DELTA) and text.endswith('"}'):
        try:
            delta, end = _scanstring(text, len(_DELTA) + 1)
        except ValueError:
            pass  # read below, which says what is wrong
        else:
            if end == len(text) - 1:
                return TextDelta(run_id=turn_id, seq=seq, text=delta)
    try:
        d = json.loads(text)
    except ValueError as exc:
        raise StoreCorruptError(
            f"event {turn_id}:{seq} in the event log cannot be read: {exc}") from exc
    if not isinstance(d, dict):
        raise StoreCorruptError(
            f"event {turn_id}:{seq} in the event log cannot be read: not a JSON object")
    return _from_dict(d, turn_id, seq)


def _from_dict(d: dict[str, Any], turn_id: str, seq: int) -> Event:
    """The event of its JSON object (:func:`_dict_of`)."""
    try:
        kind = d["type"]
        base: dict[str, Any] = {"run_id": turn_id, "seq": seq}
        if kind == "text.delta":
            return TextDelta(text=d["text"], **base)
        if kind == "step.start":
            return StepStart(step=d["step"], **base)
        if kind == "step.reset":
            return StepReset(step=d["step"], **base)
        if kind == "run.start":
            return RunStart(session_id=d["session_id"],
                            input=tuple(message_from_dict(m) for m in d["input"]), **base)
        if kind == "tool.call":
            return ToolCallStart(call=load_tool_call(d["call"]), **base)
        if kind == "tool.result":
            return ToolResultEvent(call_id=d["call_id"], result=d["result"],
                                   is_error=d["is_error"], **base)
        if kind == "approval.requested":
            return ApprovalRequested(approval_id=d["approval_id"],
                                     call=load_tool_call(d["call"]), **base)
        if kind in ("input.queued", "input.applied"):
            cls = InputQueued if kind == "input.queued" else InputApplied
            return cls(input=tuple(message_from_dict(m) for m in d["input"]), **base)
        if kind == "usage":
            return UsageEvent(usage=load_usage(d["usage"]), total=load_usage(d["total"]),
                              **base)
        if kind == "error":
            return RunFailed(error=_error_of(d["error"]), **base)
        if kind == "run.done":
            result = d["result"]
            return RunDone(finish_reason=d["finish_reason"],
                           result=None if result is None else result_from_dict(result), **base)
    except StoreCorruptError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreCorruptError(
            f"event {turn_id}:{seq} in the event log cannot be read: {exc}") from exc
    raise StoreCorruptError(
        f"event {turn_id}:{seq} in the event log has an unknown type {kind!r} (written by a "
        "newer release?)")


# --- the log's bound -----------------------------------------------------------------------------
def _event_of(row: Any, turn_id: str, seq: int) -> Event:
    """The event of a row: kept as an object (the memory log) or its JSON."""
    if isinstance(row, str | bytes):
        return decode(row, turn_id, seq)
    if isinstance(row, RunEvent):
        return row  # type: ignore[return-value]  # every RunEvent published is an Event
    raise StoreCorruptError(f"event {turn_id}:{seq} in the event log is a {type(row).__name__}")


def merge_deltas(rows: Sequence[tuple[int, Any]], turn_id: str, *,
                 objects: bool = False) -> list[tuple[int, Any]]:
    """``rows`` with each run of consecutive text deltas made one row (the seq of its last
    delta, their text joined); ``objects``: the rows are events, not JSON."""
    out: list[tuple[int, Any]] = []
    texts: list[str] = []
    last = -1

    def row(event: Event) -> Any:
        return event if objects else encode(event)

    seen = -1  # (a retried write may have stored some events again in a later row)
    for seq, text in rows:
        for event in events_of(text, turn_id, seq, seen):
            seen = event.seq
            if isinstance(event, TextDelta):
                texts.append(event.text)
                last = event.seq
                continue
            if texts:
                out.append((last, row(TextDelta(run_id=turn_id, seq=last,
                                                text="".join(texts)))))
                texts = []
            out.append((event.seq, row(event)))
    if texts:
        out.append((last, row(TextDelta(run_id=turn_id, seq=last, text="".join(texts)))))
    return out
