"""Results of a turn: :class:`ExecutionResult`, :class:`PendingTurn`, :class:`PruneResult`,
:class:`TurnInfo`."""

from __future__ import annotations

from typing import Literal

import attrs

from .messages import Message, Usage

__all__ = ["ExecutionResult", "FinishReason", "PendingTurn", "PruneResult", "TurnInfo"]

FinishReason = Literal["stop", "length", "aborted", "awaiting-approval", "limit", "error"]


@attrs.frozen(slots=True, kw_only=True)
class ExecutionResult:
    """What one turn produced.

    ``messages`` are the messages this turn added (user message first); ``usage`` is summed
    over the turn; ``steps`` counts model calls; ``approval_id``/``approval_ids`` name the
    pending approvals when ``finish_reason == "awaiting-approval"``; ``exceeded`` names the
    limit when ``finish_reason == "limit"``; ``resumed`` is the result of a pending turn
    that this call finished first (its events were not streamed), else None. ``replayed``
    is True when this call's ``idempotency_key`` had been used: no turn ran, and this is
    the committed result of the turn that used it, read from the store. ``joined`` is True
    when this call's input joined a turn that another call (in another process) was running
    (``"queue"``/``"steer"``): this is that turn's result, read from the store.
    """

    text: str
    finish_reason: str
    messages: tuple[Message, ...]
    usage: Usage
    steps: int
    run_id: str
    approval_id: str | None = None
    approval_ids: tuple[str, ...] = ()
    exceeded: str | None = None
    resumed: ExecutionResult | None = None
    replayed: bool = False
    joined: bool = False


@attrs.frozen(slots=True)
class PendingTurn:
    """An unfinished turn of a session: ``"interrupted"`` or ``"awaiting-approval"``."""

    status: Literal["interrupted", "awaiting-approval"]
    approval_id: str | None = None


@attrs.frozen(slots=True)
class PruneResult:
    """How many sessions, checkpoints and approvals ``prune()`` deleted, how many mails it
    dropped from the session mailbox and how many transcripts it rewrote without their
    expired idempotency keys."""

    sessions: int = 0
    checkpoints: int = 0
    approvals: int = 0
    mails: int = 0
    keys: int = 0


@attrs.frozen(slots=True, kw_only=True)
class TurnInfo:
    """A session's unfinished turn as its event log tells (``Session.current_turn()``):
    ``status`` is ``"running"`` (its driver lives), ``"paused"`` (on an approval) or
    ``"interrupted"`` (its driver died: an attached reader or the next ``send()`` finishes
    it); ``started_at`` is a Unix time; ``last_seq`` the seq of its last event written (-1:
    none yet); ``owner`` the driving process (``"<host>:<pid>:<uuid>"``)."""

    turn_id: str
    status: Literal["running", "paused", "interrupted"]
    started_at: float
    last_seq: int
    owner: str
