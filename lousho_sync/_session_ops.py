"""The session operations on a whole transcript that are not turns: undo the last turns,
fork a copy, read and replace the metadata, and read the history compaction kept.

Turn boundaries: a turn starts at a user message (not a compaction summary) that follows
no other user message and leaves no tool call open before it; cutting there never splits
a tool call from its result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from ._session_parts import SessionParts
from .compaction import is_summary
from .errors import (
    ApprovalAlreadyResolvedError,
    ConfigError,
    SessionBusyError,
    UnsupportedCapabilityError,
)
from .executor import TurnWriter
from .messages import Message
from .records import session_prefix
from .stores.base import Catalogued, capabilities_of

__all__ = ["catalog_of", "fork_copy", "history", "metadata", "set_metadata", "turn_starts",
           "undo"]

_FORK_ATTEMPTS = 8


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """The indexes where the turns of ``messages`` start (see the module docstring)."""
    starts: list[int] = []
    open_calls: set[str] = set()
    previous_user = False
    for i, m in enumerate(messages):
        is_user = m.role == "user" and not is_summary(m)
        if is_user and not previous_user and not open_calls:
            starts.append(i)
        previous_user = is_user
        for call in m.tool_calls:
            open_calls.add(call.id)
        if m.role == "tool" and m.tool_call_id is not None:
            open_calls.discard(m.tool_call_id)
    return starts


def catalog_of(p: SessionParts, what: str) -> Catalogued:
    """The session store as a catalog; ConfigError naming ``what`` when it keeps none."""
    store = p.sessions
    if not capabilities_of(store).catalog:
        raise UnsupportedCapabilityError(
            f"{what} needs a session store with a catalog (metadata, history, create); "
            f"{type(store).__name__} has none: every built-in store has one",
            capability="catalog",
        )
    return store  # type: ignore[return-value]


def _check_count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}; got {value!r}")
    return value


def undo(p: SessionParts, turns: int) -> tuple[Message, ...]:
    """Remove the last ``turns`` turns under the session's lease; the removed messages."""
    _check_count("turns", turns, 1)
    with p.exclusive("undo()") as hold:
        p.refuse_if_pending("undo()")
        messages = list(p.state.messages)
        starts = turn_starts(messages)
        if turns > len(starts):
            raise ConfigError(
                f"session {p.id!r} holds {len(starts)} turn(s); undo(turns={turns}) would "
                "remove more than it has"
            )
        cut = starts[-turns]
        removed = tuple(messages[cut:])
        p.save_transcript(messages[:cut], hold)
        return removed


def delete(p: SessionParts) -> None:
    """Delete the session under its lease (refused with SessionBusyError while a turn runs
    or waits to start elsewhere): its pending turn (open approvals denied), every turn
    checkpoint (fenced writes), then its transcript, history and metadata."""
    with p.exclusive("delete()") as hold:
        cp = p.pending_checkpoint(drop_unreadable=True, hold=hold)
        if cp is not None and p.approvals is not None:
            for approval_id in p.still_pending(cp):
                with contextlib.suppress(ApprovalAlreadyResolvedError):
                    p.approvals.resolve(approval_id, approved=False, reason="discarded")
        prefix = session_prefix(p.id)
        for store in {id(s): s for s in (p.checkpoints, p.base.scratch) if s}.values():
            for key in store.keys(prefix):
                TurnWriter(store, None, hold).delete(key)
        p.sessions.delete(p.id)
        with p.state.lock:
            p.state.awaiting = None
        p.state.replace([], None)


def _snapshot(p: SessionParts, store: Catalogued) -> tuple[list[Message], list[Message],
                                                           dict[str, Any]]:
    """The committed transcript, history and metadata of the session, read consistently
    (read again while another writer changed the transcript in between)."""
    sessions = p.sessions
    revisioned = p.state.revisioned
    revision = revisioned.revision if revisioned is not None else None
    for _ in range(_FORK_ATTEMPTS):
        before = revision(p.id) if revision is not None else None
        messages = sessions.load(p.id) or []
        kept = store.history(p.id)
        info = store.info(p.id)
        if revision is None or revision(p.id) == before:
            return messages, kept, dict(info.metadata) if info is not None else {}
    raise SessionBusyError(
        f"session {p.id!r} changed {_FORK_ATTEMPTS} times while fork() read it; try again",
        session_id=p.id,
    )


def fork_copy(p: SessionParts, target: Catalogued, new_id: str, at_turn: int | None) -> None:
    """Store session ``new_id`` in ``target`` as a copy of this one up to turn ``at_turn``
    (None: all), with its metadata plus ``forked_from`` and its compaction history."""
    if at_turn is not None:
        _check_count("at_turn", at_turn, 0)
    messages, kept, meta = _snapshot(p, catalog_of(p, "fork()"))
    if at_turn is not None:
        starts = turn_starts(messages)
        if at_turn > len(starts):
            raise ConfigError(
                f"session {p.id!r} holds {len(starts)} turn(s); fork(at_turn={at_turn}) "
                "asks for more"
            )
        messages = messages[: starts[at_turn]] if at_turn < len(starts) else messages
    meta["forked_from"] = p.id
    target.create(new_id, messages, metadata=meta, history=kept if messages else ())


def metadata(p: SessionParts) -> dict[str, Any]:
    """The session's metadata ({} when none)."""
    info = catalog_of(p, "session.metadata").info(p.id)
    return dict(info.metadata) if info is not None else {}


def set_metadata(p: SessionParts, value: Mapping[str, Any]) -> None:
    """Replace the session's metadata atomically."""
    catalog_of(p, "set_metadata()").set_metadata(p.id, value)


def history(p: SessionParts, current: Sequence[Message]) -> tuple[Message, ...]:
    """What compaction replaced, then ``current`` (the transcript with its summary)."""
    store = p.sessions
    kept = (store.history(p.id)  # type: ignore[attr-defined]
            if capabilities_of(store).catalog else [])
    return (*kept, *current)
