"""SessionParts: what one ``Session`` object works with (its agent's base, its stores,
the shared per-id state) and the operations on them that its turns and its maintenance
calls (pending, discard, clear, compact) share."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import attrs

from . import _idempotency as idem
from . import _otel
from ._lease_hold import LeaseHold
from ._session_state import SessionState, awaiting_error
from .approvals import current
from .compaction import (
    Compaction,
    TokenTally,
    estimate_tokens,
    fixed_tokens,
    is_summary,
    split_point,
    summarise,
)
from .errors import SessionBusyError, StoreCorruptError
from .events import CompactionDone, CompactionStart
from .executor import TurnWriter
from .limits import Limits, exceeded_before_model_call
from .messages import Message
from .records import Checkpoint, session_key, session_prefix
from .signal import Signal
from .stores._mail import MailOps, mail_ops_of
from .stores.base import (
    ApprovalStore,
    CheckpointStore,
    LeaseSaving,
    SessionStore,
    TurnCommitter,
    capabilities_of,
    supports_fencing,
)
from .turn_state import TurnConfig

__all__ = ["AgentBase", "SessionParts"]

_log = logging.getLogger(__name__)


@attrs.frozen(slots=True, kw_only=True)
class AgentBase:
    """What an agent hands each of its sessions, built once: the turn config, the
    automatic compaction policy, and where turns that are not durable keep a paused turn."""

    config: TurnConfig
    compaction: Compaction | None = None
    scratch: CheckpointStore


@attrs.frozen(slots=True, kw_only=True)
class SessionParts:
    """A session's agent base, stores and shared state (see the module docstring)."""

    base: AgentBase
    id: str
    sessions: SessionStore
    checkpoints: CheckpointStore | None
    approvals: ApprovalStore | None
    committer: TurnCommitter | None
    state: SessionState
    lease_ttl_s: float
    turn_store: CheckpointStore = attrs.field(
        default=attrs.Factory(lambda self: self.checkpoints or self.base.scratch,
                              takes_self=True),
        init=False,
    )
    """Where this session's turns are checkpointed (the agent's scratch store when the
    session is not durable: a paused turn is kept there)."""
    fences: tuple[bool, bool, bool] = attrs.field(
        default=attrs.Factory(
            lambda self: (supports_fencing(self.turn_store), supports_fencing(self.approvals),
                          supports_fencing(self.sessions)),
            takes_self=True,
        ),
        init=False,
    )
    """Whether the checkpoint, approval and session store take ``fence=`` (checked once)."""
    saving: LeaseSaving | None = attrs.field(
        default=attrs.Factory(
            lambda self: self.state.saving if self.checkpoints is not None
            and self.state.saving is not None
            and self.state.saving.first_checkpoints is self.checkpoints else None,
            takes_self=True,
        ),
        init=False,
    )
    """The session store's lease taken with a turn's first checkpoint, when that checkpoint
    goes to this session's checkpoint store (checked once)."""
    mail: MailOps | None = attrs.field(
        default=attrs.Factory(lambda self: mail_ops_of(self.sessions), takes_self=True),
        init=False,
    )
    """The session store's mailbox (turn policies across processes), or None."""

    def writer(self, hold: LeaseHold | None) -> TurnWriter:
        """The writer of this session's turns under the lease ``hold``."""
        return TurnWriter(self.turn_store, self.approvals, hold, fences=self.fences)

    def unreadable(self, exc: StoreCorruptError, key: str) -> StoreCorruptError:
        """The error for the pending turn ``key`` that cannot be read, saying how to
        remove it."""
        return StoreCorruptError(
            f"{exc} [session {self.id!r}: its pending turn {key!r} cannot be read; "
            "session.discard_pending() or session.clear() removes it]",
            path=exc.path, address=exc.address, session_id=self.id,
        )

    def refuse_if_pending(self, what: str) -> None:
        """Refuse ``what`` (compact, undo, fork) while a turn pends: SessionAwaitingApprovalError
        when it waits on an approval, else SessionBusyError."""
        cp = self.pending_checkpoint()
        if cp is None:
            return
        self.refuse_if_awaiting(cp, what)
        raise SessionBusyError(
            f"session {self.id!r} has an unfinished turn; resume() or discard_pending() it "
            f"before {what}",
            session_id=self.id,
        )

    def refuse_if_awaiting(self, cp: Checkpoint | None, what: str = "") -> None:
        """SessionAwaitingApprovalError when ``cp`` waits on an approval still pending
        (remembered for the next call's quick check); ``what`` names the refused call."""
        if cp is None or cp.status != "awaiting-approval":
            return
        pending = self.still_pending(cp)
        if pending:
            with self.state.lock:
                self.state.awaiting = pending[0]
            raise awaiting_error(self.id, pending[0], what)

    def pending_checkpoint(
        self, *, drop_unreadable: bool = False, hold: LeaseHold | None = None
    ) -> Checkpoint | None:
        """The checkpoint of the turn that would start now, if one pends.

        An unreadable one raises StoreCorruptError saying how to remove it; with
        ``drop_unreadable`` it is deleted instead (under the caller's lease ``hold``; logged)
        and None returned — what discard_pending() and clear() do.
        """
        key = session_key(self.id, len(self.state.messages))
        try:
            return self.turn_store.load(key)
        except StoreCorruptError as exc:
            if not drop_unreadable:
                raise self.unreadable(exc, key) from exc
            _log.warning("session %s: deleting its unreadable pending turn %s", self.id, key)
            self.writer(hold).delete(key)
            return None

    def still_pending(self, cp: Checkpoint) -> list[str]:
        """The approvals of ``cp`` still waiting for a decision."""
        if self.approvals is None:
            return []
        out = []
        for approval_id in cp.pending_approval_ids:
            record = current(self.approvals, approval_id)  # expired: denied now
            if record is not None and record.status == "pending":
                out.append(approval_id)
        return out

    def save_transcript(
        self, messages: list[Message], hold: LeaseHold | None,
        replaced: Sequence[Message] | None = None,
    ) -> None:
        """Replace the stored transcript (clear, undo, compact) and drop every turn
        checkpoint of the session: none pends (checked by the caller), and a shorter
        transcript would otherwise take a leftover ``<id>.turn-<n>`` for its own.
        ``replaced``: what a compaction replaced, kept in the store's history (when the
        store keeps one) in the same write."""
        st = self.state
        fence = hold.fence() if hold is not None else None
        kw = {"fence": fence} if fence is not None and supports_fencing(self.sessions) else {}
        if replaced is not None and capabilities_of(self.sessions).catalog:
            self.sessions.compact(  # type: ignore[attr-defined]
                self.id, messages, replaced=replaced, **kw)
        else:
            self.sessions.save(self.id, messages, **kw)
        for store in {id(s): s for s in (self.checkpoints, self.base.scratch) if s}.values():
            for key in store.keys(session_prefix(self.id)):
                TurnWriter(store, None, hold).delete(key)
        revision = st.revisioned.revision(self.id) if st.revisioned is not None else None
        st.replace(messages, revision)

    @contextlib.contextmanager
    def exclusive(self, what: str) -> Iterator[LeaseHold | None]:
        """Hold the slot and the lease (refused at once when busy) with a current cache."""
        st = self.state
        turn = st.claim(what)
        try:
            hold = st.hold(self.lease_ttl_s)
            if hold is None:
                st.sync()
                yield None
                return
            hold.acquire(wait=False)
            with hold:
                st.sync()
                yield hold
        finally:
            st.release_slot(turn)

    def compact_held(
        self, keep_last: int, instructions: str | None, signal: Signal | None,
        hold: LeaseHold | None, limits: Limits | None,
        idempotency_ttl_s: float = idem.DEFAULT_TTL_S,
    ) -> bool:
        """Compact now, holding the slot and the lease with a current cache; True when
        the transcript changed. ``limits``: the session budget (does it price calls?)."""
        st = self.state
        messages = st.messages
        before = len(messages)
        cut = split_point(messages, keep_last)
        if cut == 0 or (cut == 1 and is_summary(messages[0])):
            return False
        st.emit(CompactionStart, messages_before=before)
        cfg = self.base.config
        with _otel.compaction(self.id, before):  # tracing (issue 18)
            summary = summarise(
                cfg.provider, messages[:cut], settings=cfg.settings, prices=cfg.prices,
                cost_required=_cost_limited(cfg.limits) or _cost_limited(limits),
                instructions=instructions, signal=signal, session_id=self.id,
            )
        # the idempotency keys of the summarised turns stay used (see _idempotency.carry)
        summary = idem.carry(summary, messages[:cut], idempotency_ttl_s)
        new = [summary, *messages[cut:]]
        self.save_transcript(new, hold, replaced=messages[:cut])
        _log.info("session %s: compacted %d messages into a summary (%d -> %d)", self.id,
                  cut, before, len(new))
        st.emit(CompactionDone, messages_before=before, messages_after=len(new))
        return True

    def estimate_input_tokens(self, new_input: Sequence[Message] = ()) -> int:
        """Estimated input tokens of the next model call: system prompt, tool specs,
        transcript and ``new_input`` (see :mod:`lousho_sync.compaction`)."""
        st = self.state
        with st.lock:
            if not isinstance(st.token_tally, TokenTally):
                st.token_tally = TokenTally()
            tally = st.token_tally
        cfg = self.base.config
        return (fixed_tokens(cfg.system, cfg.tool_specs) + tally.tokens(st.messages)
                + sum(estimate_tokens(m) for m in new_input))

    def maybe_compact(
        self, new_input: Sequence[Message], signal: Signal, hold: LeaseHold | None,
        limits: Limits | None, idempotency_ttl_s: float = idem.DEFAULT_TTL_S,
    ) -> bool:
        """The automatic policy, at the start of a turn holding the slot and the lease:
        compact when the estimated input exceeds the agent's ``Compaction`` limit.

        Skipped when a turn pends and when the session budget is already spent (the turn
        will be refused anyway). An abort during the summary call is swallowed (the turn
        then sees the abort); any other failure raises, transcript unchanged.
        """
        policy = self.base.compaction
        if policy is None:
            return False
        estimate = self.estimate_input_tokens(new_input)
        if estimate <= policy.max_input_tokens:
            return False
        if self.pending_checkpoint() is not None:
            return False
        if exceeded_before_model_call(limits, self.state.used) is not None:
            return False
        _log.info("session %s: estimated input %d tokens > %d; compacting", self.id,
                  estimate, policy.max_input_tokens)
        try:
            return self.compact_held(policy.keep_last, policy.instructions, signal, hold,
                                     limits, idempotency_ttl_s)
        except Exception:
            if signal.aborted:
                _log.info("session %s: compaction aborted with its turn", self.id)
                return False
            raise


def _cost_limited(limits: Limits | None) -> bool:
    return limits is not None and limits.max_cost_usd is not None
