"""Session: a multi-turn conversation — the public object, the five turn policies, and the
session's maintenance (pending turns, clear, compact, undo, fork, metadata).

All ``Session`` objects for the same (session store, id) in one process share one
:class:`~lousho_sync._session_state.SessionState` (turn queue, lease, transcript cache), so
concurrent calls from any number of threads run one after another in call order. How a
turn runs and what becomes of its checkpoint is :mod:`lousho_sync.turns`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Literal

from . import _idempotency as idem
from . import _session_ops as ops
from ._detached import AttachedRun, StartedRun, take_over
from ._eventlog import (
    DEFAULT_INTERVAL_S,
    DEFAULT_LIVE_INTERVAL_S,
    DEFAULT_TTL_S,
    EventLog,
    committed_turn,
)
from ._mailbox import post_abort
from ._session_parts import AgentBase, SessionParts
from ._session_state import Ticket, Turn, state_for
from .compaction import check_keep_last
from .control import TurnControl
from .errors import (
    ApprovalAlreadyResolvedError,
    ConfigError,
    InvalidInputError,
    SessionBusyError,
    SessionExistsError,
    TurnNotFoundError,
)
from .events import ContextCleared, ListenerEvent, RunEvent, RunStart
from .ids import new_session_id, validate_session_id
from .inputs import InputLike, to_messages
from .limits import Limits
from .messages import Message, Usage
from .records import session_prefix
from .results import ExecutionResult, PendingTurn, TurnInfo
from .run import AgentRun, DriverFactory
from .signal import Signal
from .stores._events import TurnHead, event_ops_of, now
from .stores._lease import make_owner, owner_is_dead
from .stores._mail import mail_ops_of
from .stores.base import ApprovalStore, CheckpointStore, SessionStore, TurnCommitter
from .turn_state import ApproveCallback
from .turns import SessionTurn, drive, keyed_turn, note_keyed

__all__ = ["Session", "TurnPolicy", "check_attach_args", "new_session_id", "validate_session_id"]

_log = logging.getLogger(__name__)

TurnPolicy = Literal["wait", "queue", "steer", "reject", "rollback"]
_POLICIES = ("wait", "queue", "steer", "reject", "rollback")
LEASE_TTL_S = 30.0



def _messages_of(input: object) -> tuple[Message, ...]:
    """``to_messages(input)``; an ASCII str (the common input: it holds no surrogate code
    point) made at once."""
    if type(input) is str and input.isascii():
        return (Message("user", input),)
    return to_messages(input)


def check_attach_args(turn_id: object, after: object) -> None:
    """InvalidInputError unless ``turn_id`` is a str or None and ``after`` an int >= -1
    (``Session.attach``'s arguments)."""
    if turn_id is not None and not isinstance(turn_id, str):
        raise InvalidInputError(f"turn_id must be a str or None; got {type(turn_id).__name__}")
    if isinstance(after, bool) or not isinstance(after, int) or after < -1:
        raise InvalidInputError(f"after must be an int >= -1 (a seq); got {after!r}")

class Session:
    """A multi-turn conversation. Create it with ``agent.session()``.

    Thread-safe: any number of threads may call ``send``/``stream`` at once; turns run one
    after another in call order, as ``turn_policy`` decides.
    """

    def __init__(
        self,
        base: AgentBase,
        id: str,
        *,
        sessions: SessionStore,
        checkpoints: CheckpointStore | None,
        approvals: ApprovalStore | None,
        committer: TurnCommitter | None = None,
        turn_policy: TurnPolicy = "wait",
        limits: Limits | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
        opener: Callable[[str], Session] | None = None,
        idempotency_ttl_s: float = idem.DEFAULT_TTL_S,
    ) -> None:
        if turn_policy not in _POLICIES:
            raise ConfigError(
                f"turn_policy must be one of {', '.join(_POLICIES)}; got {turn_policy!r}"
            )
        self._id = id
        self._state = state_for(sessions, id)
        self._p = SessionParts(
            base=base, id=id, sessions=sessions, checkpoints=checkpoints, approvals=approvals,
            committer=committer, state=self._state, lease_ttl_s=lease_ttl_s,
        )
        self.turn_policy: TurnPolicy = turn_policy
        self.limits = limits
        self.event_ttl_s: float = DEFAULT_TTL_S
        """How long a detached turn's events are kept after its end (seconds)."""
        self.event_interval_s: float = DEFAULT_INTERVAL_S
        """At most one event-log write of text deltas per this many seconds of a turn."""
        self.event_live_interval_s: float = DEFAULT_LIVE_INTERVAL_S
        """On Redis and PostgreSQL, while a reader in another process watches the turn: at
        most one live send per this many seconds of the events that wait for their write."""
        self._opener = opener
        self.idempotency_ttl_s = idempotency_ttl_s
        """How long a used ``idempotency_key`` starts no second turn (seconds)."""

    # --- plain members ---------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The session id."""
        return self._id

    @property
    def store(self) -> SessionStore:
        """The session store holding the transcript."""
        return self._p.sessions

    @property
    def checkpoint_store(self) -> CheckpointStore | None:
        """Where this session's turns are checkpointed (None: not durable)."""
        return self._p.checkpoints

    @property
    def approval_store(self) -> ApprovalStore | None:
        """Where this session's approvals are kept."""
        return self._p.approvals

    @property
    def messages(self) -> tuple[Message, ...]:
        """A read-only snapshot of the transcript (loaded on first access)."""
        st = self._state
        if not st.loaded:
            self.load()
        with st.lock:
            return tuple(st.messages)

    def on(self, listener: Callable[[ListenerEvent], object]) -> Callable[[], None]:
        """Listen for ``compaction.start``, ``compaction.done`` and ``context.cleared`` of
        this session id (through any ``Session`` object for it in this process); returns a
        function that removes the listener."""
        listeners = self._state.listeners
        listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                listeners.remove(listener)

        return remove

    # --- turns -------------------------------------------------------------------------------
    def send(
        self,
        input: InputLike,
        *,
        signal: Signal | None = None,
        approve: ApproveCallback | None = None,
        idempotency_key: str | None = None,
    ) -> ExecutionResult:
        """One turn with the whole transcript; returns its result.

        With ``idempotency_key`` (a non-empty str of at most 200 characters), a second call
        with the same key within ``idempotency_ttl_s`` (any process sharing the store) runs
        no second turn: while the turn that used the key runs, it attaches to it (its events
        and its result, read from the event log); once that turn is committed it returns its
        result from the store (``result.replayed`` either way). A turn that failed without
        progress frees its key. A keyed call waits for another key's running turn under
        every policy but ``"reject"``.
        """
        key = None if idempotency_key is None else idem.check_key(idempotency_key)
        driver, _, _ = self._start(_messages_of(input), signal, approve, driven=True, key=key)
        result: ExecutionResult = drive(driver(False))  # the run of stream(), drained here
        return result

    def stream(
        self, input: InputLike, *, signal: Signal | None = None,
        idempotency_key: str | None = None,
    ) -> AgentRun:
        """The same turn as an :class:`AgentRun`; it joins the queue now
        (``idempotency_key``: as for :meth:`send`; a run attached to its key's running turn
        yields that turn's events, with its ``turn_id`` and seqs; a replayed one only
        ``run.done``)."""
        key = None if idempotency_key is None else idem.check_key(idempotency_key)
        driver, control, discard = self._start(_messages_of(input), signal, None, key=key)
        return AgentRun(driver, control, on_discard=discard)

    def start(
        self, input: InputLike, *, signal: Signal | None = None,
        idempotency_key: str | None = None,
    ) -> AgentRun:
        """Start the turn detached: under the turn policy it runs to its end in a background
        thread whether or not anyone reads it; its events go to the store's event log.
        Iterating the run reads them live (leaving the loop does not abort the turn);
        ``run.turn_id`` names it for :meth:`attach`; ``run.abort()`` aborts it.
        ``idempotency_key``: as for :meth:`send` (while the key's turn runs, the handle is
        attached to it and ``run.turn_id`` is that turn's; a replayed run ends at once)."""
        key = None if idempotency_key is None else idem.check_key(idempotency_key)
        log = self._event_log()
        running = None if key is None else keyed_turn(log, self._id, key)
        if running is not None:  # a retry while the key's turn runs: attach to it
            return self._attached(log, running.turn_id, -1, takeover=True, replay=True)
        driver, control, discard = self._start(_messages_of(input), signal, None, driven=True,
                                               key=key, detached=True)
        control.logged = True  # its commit records its id (see _committed)
        inner = AgentRun(driver, control, on_discard=discard)
        publisher = log.begin(inner.run_id, self._id, self._state.owner,
                              announce=key is not None)
        if key is not None:
            note_keyed(self._id, key, control)
        return StartedRun(inner, log, publisher)

    def attach(
        self, turn_id: str | None = None, *, after: int = -1, takeover: bool = True
    ) -> AgentRun:
        """A read-only run of a detached turn's events with ``seq > after``, in order, live
        until the turn ends (``run.done``) or pauses (``approval.requested``), from any
        process that shares the store. ``turn_id`` None: the session's latest turn.
        TurnNotFoundError when the turn's events are gone (``event_ttl_s`` after its end)
        or never existed. ``takeover``: when the turn's driving process dies, or no longer
        holds the session's lease (stopped past it, or on another host and gone), this
        process resumes the turn from its checkpoint and drives it (its events go on, after
        a ``step.reset``). ``run.abort()`` aborts the turn whichever process drives it."""
        check_attach_args(turn_id, after)
        log = self._event_log()
        head = log.latest(self._id) if turn_id is None else log.head(turn_id)
        if head is None or head.session_id != self._id:
            what = "has no turn" if turn_id is None else f"has no turn {turn_id!r}"
            raise TurnNotFoundError(
                f"session {self._id!r} {what} in the event log (it never existed, or it "
                f"ended more than event_ttl_s={self.event_ttl_s:g} s ago)",
                turn_id=turn_id, session_id=self._id,
            )
        return self._attached(log, head.turn_id, after, takeover=takeover)

    def _attached(self, log: EventLog, turn_id: str, after: int, *, takeover: bool,
                  replay: bool = False) -> AttachedRun:
        return AttachedRun(log, turn_id, after,
                           idle=self._take_over_watch() if takeover else None,
                           abort_turn=lambda reason, tid: self.abort_turn(reason, turn_id=tid),
                           replay=replay)

    def _take_over_watch(self) -> Callable[[TurnHead], bool]:
        """A reader's check, each time its turn was quiet for a while: when the turn's driver
        died (its process is gone from this host) or no longer holds the session's lease
        (it expired: the driver was stopped past it, or ran on another host and stopped
        renewing it — seen at two checks in a row, so a turn between its lease's release
        and its last event is left alone), take the turn over."""
        lapsed: set[str] = set()

        def check(head: TurnHead) -> bool:
            if head.status != "running":
                return False
            if owner_is_dead(head.owner) or self._lease_lapsed(head.owner, lapsed):
                take_over(head, self._event_log(), self._state.owner, self._resume_driver,
                          self._committed)
            return False  # the reader reads on: the events come through the log

        return check

    def _lease_lapsed(self, owner: str, lapsed: set[str]) -> bool:
        leasable = self._state.leasable
        if owner == self._state.owner or leasable is None:
            return False
        if self._lease_held():
            lapsed.discard(owner)
            return False
        if owner in lapsed:
            return True
        lapsed.add(owner)
        return False

    def _resume_driver(self) -> Generator[RunEvent, None, ExecutionResult | None]:
        control = TurnControl()
        control.logged = True
        control.close()
        ticket = self._state.enqueue(control)
        run: Generator[RunEvent, None, ExecutionResult | None] = SessionTurn(
            self._p, ticket, None, limits=self.limits, emit_pending=True).run(True)
        return run

    def _committed(self, head: TurnHead) -> ExecutionResult | None:
        """The result of the turn of ``head`` if it was committed (its driver died after the
        commit, before its last events were written), else None: found by the turn id its
        commit recorded; a turn logged by an older release, whose commit recorded none, by
        its input at the transcript's tail."""
        log = self._event_log()
        messages = self.load()
        found = committed_turn(messages, head.turn_id)
        if found is not None or log.seals_commit(head.turn_id):
            return found
        first = next(iter(log.follow(head.turn_id, -1, idle=lambda h: True, live=False)),
                     None)
        if not isinstance(first, RunStart) or not first.input:
            return None
        n = len(first.input)
        starts = [i for i in range(len(messages) - n, -1, -1)
                  if tuple(m.content for m in messages[i:i + n])
                  == tuple(m.content for m in first.input)]
        if not starts:
            return None
        tail = messages[starts[0]:]
        if any(m.role == "user" for m in tail[n:]):
            return None
        text = tail[-1].text if tail and tail[-1].role == "assistant" else ""
        return ExecutionResult(text=text, finish_reason="stop", messages=tuple(tail),
                               usage=Usage(), steps=sum(1 for m in tail if m.role == "assistant"),
                               run_id=head.turn_id)

    def current_turn(self) -> TurnInfo | None:
        """The session's detached turn that has not finished (running, paused on an
        approval, or interrupted: its driver died, or no longer holds the session's lease —
        stopped past it, or on another host and gone), from the event log; None when there
        is none."""
        head = self._event_log().latest(self._id)
        if head is None or head.status == "done":
            return None
        if head.status == "paused":
            pending = self.pending()
            if pending is None or pending.status != "awaiting-approval":
                return None
            status: Literal["running", "paused", "interrupted"] = "paused"
        else:
            status = "interrupted" if self._interrupted(head) else "running"
        return TurnInfo(turn_id=head.turn_id, status=status, started_at=head.started_at,
                        last_seq=head.last_seq, owner=head.owner)

    def _interrupted(self, head: TurnHead) -> bool:
        """Whether the running turn of ``head`` lost its driver: its process is gone from
        this host, or the session's lease lapsed under it. A turn that wrote no event yet
        may be about to take the lease (it does before ``run.start``): it counts once it
        started a lease's TTL ago; one whose lease was released is committed (the
        transcript says so) and only its last events are still to come."""
        if owner_is_dead(head.owner):
            return True
        if (head.owner == self._state.owner or self._state.leasable is None
                or (head.last_seq < 0 and now() - head.started_at < self._p.lease_ttl_s)
                or self._lease_held()):
            return False
        return committed_turn(self.load(), head.turn_id) is None

    def abort_turn(self, reason: object = None, *, turn_id: str | None = None) -> bool:
        """Abort the session's running turn (or the turn ``turn_id``), whichever process
        runs it; True when there was one to ask. In this process it aborts at once; in
        another one, through the session's mailbox within one wake-up of its owner (on a
        store without a mailbox only a turn of this process can be aborted)."""
        if turn_id is not None and not isinstance(turn_id, str):
            raise InvalidInputError(f"turn_id must be a str or None; got {type(turn_id).__name__}")
        st = self._state
        with st.lock:
            current = st.current
            if current is not None and current.control is not None:
                if turn_id not in (None, current.control.run_id):
                    return False
                current.control.abort("aborted" if reason is None else reason)
                return True
        mail = mail_ops_of(self._p.sessions)
        leasable = st.leasable
        if mail is None or leasable is None:
            return False
        if not self._lease_held():
            return False
        post_abort(mail, self._id, reason, turn_id)
        return True

    def _lease_held(self) -> bool:
        """Whether a live owner holds the session's lease now (a leased store)."""
        st = self._state
        if st.lease_query is not None:  # a read: the lease and its token stay as they are
            return st.lease_query.lease_held(self._id)
        leasable = st.leasable  # a store of its own without the query: a throwaway owner
        assert leasable is not None
        probe = make_owner()
        if leasable.acquire_lease(self._id, owner=probe, ttl_s=5.0, wait_s=0.0):
            leasable.release_lease(self._id, owner=probe)
            return False
        return True

    def _event_log(self) -> EventLog:
        return EventLog(event_ops_of(self._p.sessions), interval_s=self.event_interval_s,
                        live_interval_s=self.event_live_interval_s,
                        ttl_s=self.event_ttl_s)

    def resume(self, *, signal: Signal | None = None) -> ExecutionResult | None:
        """Finish the interrupted turn; None when nothing pends."""
        control = TurnControl()
        control.close()
        ticket = self._state.enqueue(control)
        result: ExecutionResult | None = drive(
            SessionTurn(self._p, ticket, None, signal=signal, limits=self.limits,
                        wait_for_lease=self.turn_policy != "reject").run(False)
        )
        return result

    def _start(
        self,
        msgs: tuple[Message, ...],
        signal: Signal | None,
        approve: ApproveCallback | None,
        *,
        driven: bool = False,
        key: str | None = None,
        detached: bool = False,
    ) -> tuple[DriverFactory, TurnControl, Callable[[], None] | None]:
        """The turn policy's decision on ``msgs``: a driver that joins the running turn,
        or a new :class:`SessionTurn` queued now (``driven``: by this caller, at once)."""
        st = self._state
        control = TurnControl()
        if key is not None:
            msgs = idem.claim(msgs, key)
        with st.lock:
            st.raise_if_awaiting_locked(self._p.approvals)
            policy = self.turn_policy
            current = st.current
            if key is not None and policy != "reject" and (
                    idem.find(st.messages, key, self.idempotency_ttl_s) is not None
                    or (policy == "rollback" and current is not None
                        and current.control is not None and key in current.control.keys)):
                policy = "wait"  # a used key replays; a rollback never drops its key's turn
            if policy == "reject" and (current is not None or st.waiting):
                raise SessionBusyError(
                    f"session {self._id!r} is running a turn (turn_policy='reject')",
                    session_id=self._id,
                )
            if policy in ("queue", "steer") and current is not None and current.control:
                token = object()
                if current.control.offer(msgs, steer=policy == "steer", token=token,
                                         keys=() if key is None else (key,)):
                    seq = next(st.seq)
                    return (
                        lambda emit: self._join_driver(current, token, seq, msgs, signal,
                                                       approve, control, emit),
                        control, None,
                    )
            if policy == "rollback" and current is not None and current.control:
                current.control.abort("rollback")
            # a ticket driven at once is never an unread stream ahead of its caller
            ticket = (Ticket(next(st.seq), Turn(control), caller=None, started=True) if driven
                      else Ticket(next(st.seq), Turn(control)))
            st.waiting.append(ticket)
        # a keyed turn writes its events to the event log (a retry of its key attaches to
        # it); a detached one does so already
        log = self._event_log() if key is not None and not detached else None
        if log is not None:
            control.logged = True  # its commit records its id (see _committed)
        return (self._turn(ticket, msgs, signal, approve, log).run, control,
                lambda: st.cancel(ticket))

    def _turn(
        self, ticket: Ticket, msgs: tuple[Message, ...], signal: Signal | None,
        approve: ApproveCallback | None, log: EventLog | None = None,
    ) -> SessionTurn:
        return SessionTurn(self._p, ticket, msgs, signal=signal, approve=approve,
                           limits=self.limits, wait_for_lease=self.turn_policy != "reject",
                           idempotency_ttl_s=self.idempotency_ttl_s, policy=self.turn_policy,
                           log=log, events=self._event_log)

    def _join_driver(
        self,
        turn: Turn,
        token: object,
        seq: int,
        msgs: tuple[Message, ...],
        signal: Signal | None,
        approve: ApproveCallback | None,
        control: TurnControl,
        emit: bool,
    ) -> Generator[RunEvent, None, ExecutionResult]:
        turn.done.wait()
        assert turn.control is not None
        if token in turn.control.taken:
            if turn.error is not None:
                raise turn.error
            assert turn.result is not None
            return turn.result
        ticket = self._state.enqueue(control, seq=seq)
        result: ExecutionResult = yield from self._turn(ticket, msgs, signal, approve).run(emit)
        return result

    # --- transcript -----------------------------------------------------------------------------
    def load(self) -> tuple[Message, ...]:
        """Read the stored transcript (``send()`` does it itself); returns it."""
        st = self._state
        if not st.busy:
            st.reload()
        with st.lock:
            return tuple(st.messages)

    # --- pending turns -----------------------------------------------------------------------
    def pending(self) -> PendingTurn | None:
        """The unfinished turn (``"interrupted"`` or ``"awaiting-approval"``), or None."""
        st = self._state
        if st.busy:
            return None
        st.sync()
        cp = self._p.pending_checkpoint()
        if cp is None:
            return None
        pending = self._p.still_pending(cp) if cp.status == "awaiting-approval" else []
        return PendingTurn("awaiting-approval", pending[0]) if pending else PendingTurn(
            "interrupted")

    def discard_pending(self) -> None:
        """Drop the unfinished turn (and deny its open approvals) without running it."""
        with self._p.exclusive("discard_pending()") as hold:
            cp = self._p.pending_checkpoint(drop_unreadable=True, hold=hold)
            if cp is None:
                return
            for approval_id in self._p.still_pending(cp):
                assert self._p.approvals is not None
                with contextlib.suppress(ApprovalAlreadyResolvedError):
                    self._p.approvals.resolve(approval_id, approved=False, reason="discarded")
            self._p.writer(hold).delete(cp.key)
            with self._state.lock:
                self._state.awaiting = None

    def clear(self, *, keep_metadata: bool = True) -> None:
        """Empty the transcript (and the history compaction kept) and save it empty;
        deletes an interrupted turn. The metadata stays unless ``keep_metadata=False``.

        Raises SessionBusyError while a turn runs and SessionAwaitingApprovalError while a
        turn waits on an approval. Session budgets count again from zero.
        """
        with self._p.exclusive("clear()") as hold:
            cp = self._p.pending_checkpoint(drop_unreadable=True, hold=hold)
            self._p.refuse_if_awaiting(cp, "clear()")
            self._p.save_transcript([], hold)
            if not keep_metadata and ops.metadata(self._p):
                ops.set_metadata(self._p, {})
        self._state.emit(ContextCleared)

    def delete(self) -> None:
        """Delete the session from its store under the session's lease: its pending turn
        (open approvals are denied), every turn checkpoint, the transcript, the history and
        the metadata. Refused with SessionBusyError while a turn runs (here or in another
        process); the object stays usable (an empty session)."""
        ops.delete(self._p)

    # --- whole-transcript operations ------------------------------------------------------------
    def undo(self, turns: int = 1) -> tuple[Message, ...]:
        """Remove the last ``turns`` turns and return the removed messages.

        A turn starts at a user message, so no tool call loses its result. Atomic, under
        the session's lease; refused with SessionBusyError while a turn runs, waits to start
        or pends, with SessionAwaitingApprovalError while a turn waits on an approval, and
        with ConfigError when the session holds fewer turns. Session budgets follow.
        """
        return ops.undo(self._p, turns)

    def fork(self, new_id: str | None = None, *, at_turn: int | None = None) -> Session:
        """A new session (a new UUID id unless given) holding a copy of this transcript up
        to turn ``at_turn`` (None: all; 0: none), its compaction history, and its metadata
        plus ``forked_from``. Never copies a pending turn; SessionExistsError when
        ``new_id`` has messages, metadata, a pending turn or a running turn (it is written
        under ``new_id``'s lease)."""
        nid = new_session_id() if new_id is None else validate_session_id(new_id)
        if nid == self._id:
            raise SessionExistsError(f"fork() needs a new id: {nid!r} is this session's own")
        if self._opener is not None:
            fork = self._opener(nid)
        else:
            p = self._p
            fork = Session(p.base, nid, sessions=p.sessions, checkpoints=p.checkpoints,
                           approvals=p.approvals, committer=p.committer,
                           lease_ttl_s=p.lease_ttl_s)
        fork.turn_policy, fork.limits = self.turn_policy, self.limits
        target = ops.catalog_of(fork._p, "fork()")
        try:  # the target's slot and lease: no turn of it starts while it is written
            with fork._p.exclusive("fork()"):
                checkpoints = fork._p.checkpoints or fork._p.base.scratch
                if checkpoints.keys(session_prefix(nid)):
                    raise SessionExistsError(
                        f"fork() onto {nid!r} refused: session {nid!r} holds a pending turn "
                        "(resume or discard it there, or fork to another id)",
                        session_id=nid,
                    )
                ops.fork_copy(self._p, target, nid, at_turn)
        except SessionBusyError:
            raise SessionExistsError(
                f"fork() onto {nid!r} refused: session {nid!r} is running a turn",
                session_id=nid,
            ) from None
        fork.load()
        return fork

    @property
    def metadata(self) -> dict[str, Any]:
        """A copy of the session's metadata: a small JSON object (title, owner, tags),
        stored with the session and never counted as a message; ``{}`` when none."""
        return ops.metadata(self._p)

    def set_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Replace the metadata atomically (``{}`` removes it); InvalidMetadataError when
        it is not a JSON object of at most 16 KiB. Allowed while a turn runs."""
        ops.set_metadata(self._p, metadata)

    def history(self, *, include_compacted: bool = True) -> tuple[Message, ...]:
        """Every message committed to the session, oldest first: what compaction replaced,
        then the transcript with the summary that replaced them (``include_compacted=False``:
        the transcript only, as ``messages``)."""
        current = self.load()
        return ops.history(self._p, current) if include_compacted else current

    # --- compaction ---------------------------------------------------------------------------
    def compact(
        self, *, keep_last: int = 8, instructions: str | None = None,
        signal: Signal | None = None,
    ) -> bool:
        """Replace older messages with one summary message written by the model; True when
        the transcript changed.

        Refused with SessionBusyError while a turn runs, waits to start or pends (resume or
        discard it first), and with SessionAwaitingApprovalError while a turn waits on an
        approval. Atomic: a failure raises and leaves the transcript as it was (listeners
        then saw ``compaction.start`` and no ``compaction.done``). Nothing to compact: no
        model call, no event, False.
        """
        check_keep_last(keep_last)
        with self._p.exclusive("compact()") as hold:
            self._p.refuse_if_pending("compact()")
            return self._p.compact_held(keep_last, instructions, signal, hold, self.limits,
                                        self.idempotency_ttl_s)

    def estimate_input_tokens(self, new_input: Sequence[Message] = ()) -> int:
        """Estimated input tokens of the next model call: system prompt, tool specs,
        transcript and ``new_input`` (see :mod:`lousho_sync.compaction`)."""
        return self._p.estimate_input_tokens(new_input)

    def __repr__(self) -> str:
        return f"<Session {self._id!r} policy={self.turn_policy}>"

