"""The records stores keep besides messages: :class:`Checkpoint`, :class:`ApprovalRecord`,
and the :class:`Fence` a turn's writes carry; and the checkpoint keys, built and parsed here
only. Below both the codec and the stores.

Checkpoint keys: ``"<session id>.turn-<n>"`` for session turns (``n`` = transcript length
when the turn started), ``"<session id>"`` for a durable one-shot run, ``"run-<run id>"`` for
a one-shot run nobody can resume (kept only while it waits on an approval).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

from .errors import ApprovalAlreadyResolvedError, ApprovalNotFoundError
from .ids import check_storable_id
from .messages import Message, ToolCall, Usage

__all__ = [
    "CHECKPOINT_VERSION",
    "ApprovalRecord",
    "Checkpoint",
    "Fence",
    "TurnKey",
    "is_expired",
    "now",
    "one_shot_key",
    "parse_key",
    "resolved",
    "session_key",
    "session_of",
    "session_prefix",
]

CHECKPOINT_VERSION = 1


def now() -> float:
    """Wall-clock seconds since the epoch (what stores record)."""
    return time.time()


def _map(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return {} if value is None else dict(value)


def _messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return value if type(value) is tuple else tuple(value)


def _strs(value: Iterable[str]) -> tuple[str, ...]:
    return value if type(value) is tuple else tuple(value)


def _key(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A record's id fields become store keys: no NUL, no surrogate code point."""
    if type(value) is str and value.isascii() and "\0" not in value:  # the common case
        return  # (a record is made per step: no message built for a good key)
    if value is not None or attribute.name not in ("session_id",):
        check_storable_id(value, f"{type(inst).__name__}.{attribute.name}")


@attrs.frozen(slots=True, kw_only=True)
class Checkpoint:
    """The state of an unfinished turn, written after every model response and tool result
    and before every tool starts.

    ``turn_index`` is the transcript length when the turn started; ``input`` the turn's user
    messages; ``recorded`` its messages so far (assistant responses, tool results, applied
    queued input) in order; ``started_call_ids`` tool calls started and not yet recorded;
    ``queued_inputs`` input queued into the turn and not yet applied; ``extra`` fields this
    release does not know, kept.
    """

    version: int = CHECKPOINT_VERSION
    key: str = attrs.field(validator=_key)
    session_id: str | None = attrs.field(validator=_key)
    run_id: str
    turn_index: int = 0
    input: tuple[Message, ...] = attrs.field(default=(), converter=_messages)
    recorded: tuple[Message, ...] = attrs.field(default=(), converter=_messages)
    started_call_ids: tuple[str, ...] = attrs.field(default=(), converter=_strs)
    queued_inputs: tuple[Message, ...] = attrs.field(default=(), converter=_messages)
    pending_approval_ids: tuple[str, ...] = attrs.field(default=(), converter=_strs)
    usage: Usage = Usage()
    status: Literal["running", "interrupted", "awaiting-approval"] = "running"
    created_at: float = attrs.field(factory=now)
    updated_at: float = attrs.field(factory=now)
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_map, hash=False)


@attrs.frozen(slots=True, kw_only=True)
class ApprovalRecord:
    """One ``needs_approval`` tool call waiting for (or given) a human decision.

    ``expires_at`` (seconds since the epoch; None: never) is when an undecided request is
    denied with the reason ``"expired"``; ``resolved_by`` is who decided (the free text
    given to ``resolve(..., by=...)``; None when not said, and for an expired request).
    """

    id: str = attrs.field(validator=_key)
    session_id: str | None = attrs.field(validator=_key)
    checkpoint_key: str = attrs.field(validator=_key)
    call: ToolCall
    status: Literal["pending", "approved", "denied"] = "pending"
    reason: str | None = None
    created_at: float = attrs.field(factory=now)
    resolved_at: float | None = None
    expires_at: float | None = None
    resolved_by: str | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_map, hash=False)


def is_expired(record: ApprovalRecord, at: float | None = None) -> bool:
    """Whether ``record`` is pending past its ``expires_at`` (at ``at``, default now)."""
    return (
        record.status == "pending"
        and record.expires_at is not None
        and record.expires_at <= (now() if at is None else at)
    )


def resolved(
    record: ApprovalRecord | None,
    id: str,
    *,
    approved: bool,
    reason: str | None,
    by: str | None = None,
) -> ApprovalRecord:
    """``record`` (the stored approval ``id``, or None) resolved now as approved or denied
    with ``reason`` by ``by``, for a store that resolves under its own lock and writes the
    result.

    Raises ApprovalNotFoundError when ``record`` is None and ApprovalAlreadyResolvedError
    when it is no longer pending.
    """
    if record is None:
        raise ApprovalNotFoundError(f"no approval has id {id!r}", approval_id=id)
    if record.status != "pending":
        raise ApprovalAlreadyResolvedError(
            f"approval {id!r} was already {record.status}", approval_id=id
        )
    return attrs.evolve(
        record,
        status="approved" if approved else "denied",
        reason=reason,
        resolved_at=now(),
        resolved_by=by,
    )


@attrs.frozen(slots=True)
class Fence:
    """The lease a write is made under: session ``session_id``, acquisition ``token``.

    Every acquisition of a session's lease yields a strictly greater token. A store that
    supports fencing refuses, atomically with the write, any write whose token is older
    than the newest one handed out for the session (``LeaseLostError``).
    """

    session_id: str
    token: int


# --- checkpoint keys ---------------------------------------------------------------------------
_TURN = ".turn-"
_SCRATCH = "run-"


def session_key(session_id: str, turn_index: int) -> str:
    """The checkpoint key of the session turn that starts at ``turn_index``."""
    return f"{session_id}{_TURN}{turn_index}"


def session_prefix(session_id: str) -> str:
    """The prefix of every session-turn checkpoint key of ``session_id``."""
    return f"{session_id}{_TURN}"


def one_shot_key(session_id: str | None, run_id: str) -> str:
    """The key of a one-shot run: its session id (durable), else ``run-<run id>``."""
    return session_id if session_id is not None else f"{_SCRATCH}{run_id}"


def session_of(key: str) -> str | None:
    """The session id of a session-turn checkpoint key (None for any other key)."""
    sid, sep, n = key.rpartition(_TURN)
    return sid if sep and sid and n.isdigit() else None


@attrs.frozen(slots=True)
class TurnKey:
    """What a checkpoint key names: a session turn, a durable one-shot run, or a scratch
    one-shot run."""

    kind: Literal["session", "one-shot", "scratch"]
    session_id: str | None = None
    turn_index: int | None = None


def parse_key(key: str, session_id: str | None) -> TurnKey:
    """What ``key`` (recorded with ``session_id``, e.g. on an approval record) names."""
    if session_id is not None and key.startswith(session_prefix(session_id)):
        rest = key[len(session_prefix(session_id)):]
        if rest.isdigit():
            return TurnKey("session", session_id, int(rest))
    if key.startswith(_SCRATCH):
        return TurnKey("scratch", session_id)
    return TurnKey("one-shot", session_id)
