"""Session: a multi-turn conversation — transcript, turn queue and the five turn policies.

All ``Session`` objects for the same (session store, id) in one process share one
:class:`_SessionState` (transcript cache + FIFO turn queue, one lock and one condition), so
concurrent calls from any number of threads run one after another in call order.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, Literal

import attrs

from . import _loop
from ._heartbeat import HEARTBEAT
from .compaction import maybe_compact
from .errors import (
    ApprovalAlreadyResolvedError,
    SessionAwaitingApprovalError,
    SessionBusyError,
    StoreConflictError,
)
from .events import ContextCleared, ListenerEvent, RunEvent
from .executor import ApproveCallback, TurnConfig, TurnControl, TurnState, run_turn
from .ids import new_session_id, validate_session_id
from .inputs import InputLike, to_messages
from .limits import Counters, Limits
from .messages import Message, Usage
from .results import ExecutionResult, PendingTurn
from .run import AgentRun
from .signal import Latch, Signal
from .stores._lease import make_owner
from .stores.base import ApprovalStore, Checkpoint, CheckpointStore, SessionStore

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["Session", "TurnPolicy", "new_session_id", "validate_session_id"]

_log = logging.getLogger(__name__)

TurnPolicy = Literal["wait", "queue", "steer", "reject", "rollback"]
_POLICIES = ("wait", "queue", "steer", "reject", "rollback")
LEASE_TTL_S = 30.0
_LEASE_POLL_S = 0.25


def _counters(messages: Any) -> Counters:
    steps = tools = 0
    usage = Usage()
    for m in messages:
        if m.role == "assistant":
            steps += 1
            if m.usage is not None:
                usage = usage + m.usage
        elif m.role == "tool":
            tools += 1
        elif m.usage is not None:  # a compaction summary carries what it replaced
            usage = usage + m.usage
            if m.metadata.get("lousho") == "summary":
                steps += _meta_int(m.metadata.get("steps"))
                tools += _meta_int(m.metadata.get("tool_calls"))
    return Counters(steps, tools, usage)


def _meta_int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@attrs.define(eq=False)
class _Turn:
    """A turn in the queue (``control`` is None for clear/compact/discard)."""

    control: TurnControl | None
    done: Latch = attrs.field(factory=Latch)
    result: ExecutionResult | None = None
    error: BaseException | None = None


@attrs.define(eq=False)
class _Ticket:
    seq: int
    turn: _Turn
    thread: int = attrs.field(factory=threading.get_ident)
    """The thread that queued it; ``started`` once its run is being driven."""
    started: bool = False


class _SessionState:
    """Shared by every Session of one (store, id) in this process.

    ``lock``/``cond`` guard ``waiting``, ``current``, ``messages``, ``used``, ``awaiting``.
    ``messages`` is append-only while it is current (clear/compact replace the list), so
    views of it never change.
    """

    def __init__(self, store: SessionStore, id: str) -> None:
        self.store = store
        self.id = id
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.waiting: list[_Ticket] = []
        self.current: _Turn | None = None
        self.messages: list[Message] = []
        self.loaded = False
        self.revision: object = None
        self.used = Counters()
        self.awaiting: str | None = None
        self.owner = make_owner()
        self.seq = itertools.count()
        self.shared_lease = hasattr(store, "acquire_lease")
        self.lease_held = False
        self.commit_turn = getattr(store, "commit_turn", None)
        self.has_revision = hasattr(store, "revision")


_REGISTRY: weakref.WeakValueDictionary[tuple[int, str], _SessionState] = (
    weakref.WeakValueDictionary()
)
_REGISTRY_LOCK = threading.Lock()


def _state_for(store: SessionStore, session_id: str) -> _SessionState:
    key = (id(store), session_id)  # the state keeps the store alive, so id() stays unique
    with _REGISTRY_LOCK:
        state = _REGISTRY.get(key)
        if state is None or state.store is not store:
            state = _SessionState(store, session_id)
            _REGISTRY[key] = state
        return state



class Session:
    """A multi-turn conversation. Create it with ``agent.session()``.

    Thread-safe: any number of threads may call ``send``/``stream`` at once; turns run one
    after another in call order, as ``turn_policy`` decides.
    """

    def __init__(
        self,
        agent: Agent,
        id: str,
        *,
        sessions: SessionStore,
        checkpoints: CheckpointStore | None,
        approvals: ApprovalStore | None,
        turn_policy: TurnPolicy = "wait",
        limits: Limits | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
    ) -> None:
        if turn_policy not in _POLICIES:
            from .errors import ConfigError

            raise ConfigError(
                f"turn_policy must be one of {', '.join(_POLICIES)}; got {turn_policy!r}"
            )
        self._agent = agent
        self._id = id
        self._sessions = sessions
        self._checkpoints = checkpoints
        self._approvals = approvals
        self.turn_policy: TurnPolicy = turn_policy
        self.limits = limits
        self._lease_ttl_s = lease_ttl_s
        self._state = _state_for(sessions, id)
        self._listeners: list[Callable[[ListenerEvent], object]] = []
        self._event_seq = itertools.count()

    # --- plain members ---------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The session id."""
        return self._id

    @property
    def store(self) -> SessionStore:
        """The session store holding the transcript."""
        return self._sessions

    @property
    def checkpoint_store(self) -> CheckpointStore | None:
        """Where this session's turns are checkpointed."""
        return self._checkpoints

    @property
    def approval_store(self) -> ApprovalStore | None:
        """Where this session's approvals are kept."""
        return self._approvals

    @property
    def messages(self) -> tuple[Message, ...]:
        """A read-only snapshot of the transcript (loaded on first access)."""
        st = self._state
        if not st.loaded:
            self.load()
        with st.lock:
            return tuple(st.messages)

    def on(self, listener: Callable[[ListenerEvent], object]) -> Callable[[], None]:
        """Listen for ``compaction.start``, ``compaction.done`` and ``context.cleared``;
        returns a function that removes the listener."""
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def _emit(self, cls: Callable[..., ListenerEvent], **fields: Any) -> None:
        event = cls(session_id=self._id, seq=next(self._event_seq), **fields)
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                _log.warning("session %s: listener %r raised on %s", self._id, listener,
                             event.type, exc_info=True)

    # --- turns -------------------------------------------------------------------------------
    def send(
        self,
        input: InputLike,
        *,
        signal: Signal | None = None,
        approve: ApproveCallback | None = None,
    ) -> ExecutionResult:
        """One turn with the whole transcript; returns its result."""
        return self._start(to_messages(input), signal, approve).result()

    def stream(self, input: InputLike, *, signal: Signal | None = None) -> AgentRun:
        """The same turn as an :class:`AgentRun`; it joins the queue now."""
        return self._start(to_messages(input), signal, None)

    def resume(self, *, signal: Signal | None = None) -> ExecutionResult | None:
        """Finish the interrupted turn; None when nothing pends."""
        control = TurnControl()
        control.close()
        ticket = self._enqueue(control)
        result: ExecutionResult | None = _drive(self._turn_driver(ticket, None, signal, None))
        return result

    def _start(
        self, msgs: tuple[Message, ...], signal: Signal | None, approve: ApproveCallback | None
    ) -> AgentRun:
        st = self._state
        control = TurnControl()
        with st.lock:
            self._raise_if_awaiting_locked()
            policy = self.turn_policy
            current = st.current
            if policy == "reject" and (current is not None or st.waiting):
                raise SessionBusyError(
                    f"session {self._id!r} is running a turn (turn_policy='reject')",
                    session_id=self._id,
                )
            if policy in ("queue", "steer") and current is not None and current.control:
                token = object()
                if current.control.offer(msgs, steer=policy == "steer", token=token):
                    seq = next(st.seq)
                    return AgentRun(
                        self._join_driver(current, token, seq, msgs, signal, approve, control),
                        control,
                    )
            if policy == "rollback" and current is not None and current.control:
                current.control.abort("rollback")
            ticket = _Ticket(next(st.seq), _Turn(control))
            st.waiting.append(ticket)
        return AgentRun(
            self._turn_driver(ticket, msgs, signal, approve),
            control,
            on_discard=lambda: self._cancel(ticket),
        )

    def _enqueue(self, control: TurnControl) -> _Ticket:
        st = self._state
        with st.lock:
            ticket = _Ticket(next(st.seq), _Turn(control))
            st.waiting.append(ticket)
        return ticket

    def _cancel(self, ticket: _Ticket) -> None:
        st = self._state
        with st.cond:
            if ticket in st.waiting:
                st.waiting.remove(ticket)
                st.cond.notify_all()
        ticket.turn.done.set()

    def _join_driver(
        self,
        turn: _Turn,
        token: object,
        seq: int,
        msgs: tuple[Message, ...],
        signal: Signal | None,
        approve: ApproveCallback | None,
        control: TurnControl,
    ) -> Generator[RunEvent, None, ExecutionResult]:
        turn.done.wait()
        assert turn.control is not None
        if token in turn.control.taken:
            if turn.error is not None:
                raise turn.error
            assert turn.result is not None
            return turn.result
        st = self._state
        ticket = _Ticket(seq, _Turn(control))
        with st.cond:
            at = next((i for i, t in enumerate(st.waiting) if t.seq > seq), len(st.waiting))
            st.waiting.insert(at, ticket)
            st.cond.notify_all()
        result: ExecutionResult = yield from self._turn_driver(ticket, msgs, signal, approve)
        return result

    def _turn_driver(
        self,
        ticket: _Ticket,
        msgs: tuple[Message, ...] | None,
        signal: Signal | None,
        approve: ApproveCallback | None,
    ) -> Generator[RunEvent, None, Any]:
        turn = ticket.turn
        control = turn.control
        assert control is not None
        unlink = (
            signal.add_callback(lambda: control.abort(signal.reason))
            if signal is not None
            else None
        )
        try:
            if not self._wait_for_slot(ticket):
                result: ExecutionResult | None = _aborted(control)
            else:
                try:
                    with self._lease(control, reject=self.turn_policy == "reject"):
                        self._sync()
                        resumed = self._resume_pending(control)
                        if msgs is None:
                            result = resumed
                        else:
                            maybe_compact(self, msgs, signal=control.signal)
                            result = yield from self._new_turn(control, msgs, approve)
                except _WaitAborted:
                    result = _aborted(control)
            turn.result = result
            return result
        except BaseException as exc:
            turn.error = exc
            raise
        finally:
            if unlink is not None:
                unlink()
            control.close()
            self._release_slot(turn)

    def _wait_for_slot(self, ticket: _Ticket) -> bool:
        st = self._state
        control = ticket.turn.control
        assert control is not None

        ticket.started = True
        with st.cond:  # fast path: the session is idle and this ticket is next
            if (not control.signal.aborted and st.current is None and st.waiting
                    and st.waiting[0] is ticket):
                st.waiting.pop(0)
                st.current = ticket.turn
                return True

        def wake() -> None:
            with st.cond:
                st.cond.notify_all()

        remove = control.signal.add_callback(wake)
        try:
            with st.cond:
                while True:
                    if control.signal.aborted:
                        if ticket in st.waiting:
                            st.waiting.remove(ticket)
                        st.cond.notify_all()
                        return False
                    if st.current is None and st.waiting and st.waiting[0] is ticket:
                        st.waiting.pop(0)
                        st.current = ticket.turn
                        return True
                    self._refuse_self_deadlock_locked(ticket)
                    st.cond.wait()
        finally:
            remove()

    def _refuse_self_deadlock_locked(self, ticket: _Ticket) -> None:
        """A turn queued ahead by this very thread whose run nobody reads would block this
        thread forever: refuse instead, with a message saying what to do."""
        st = self._state
        me = threading.get_ident()
        for ahead in st.waiting:
            if ahead is ticket:
                return
            if not ahead.started and ahead.thread == me:
                st.waiting.remove(ticket)
                st.cond.notify_all()
                raise SessionBusyError(
                    f"session {self._id!r}: this thread started a stream() that has not been "
                    "read yet, and this call would wait for it forever; iterate that run (or "
                    "call its result()) first",
                    session_id=self._id,
                )

    def _release_slot(self, turn: _Turn) -> None:
        st = self._state
        with st.cond:
            if st.current is turn:
                st.current = None
            st.cond.notify_all()
        turn.done.set()

    @contextlib.contextmanager
    def _lease(self, control: TurnControl | None, *, reject: bool) -> Iterator[None]:
        st = self._state
        store: Any = self._sessions
        if not st.shared_lease:
            yield
            return
        ttl = self._lease_ttl_s
        if reject:
            if not store.acquire_lease(self._id, owner=st.owner, ttl_s=ttl, wait_s=0.0):
                raise SessionBusyError(
                    f"session {self._id!r} is running a turn in another process",
                    session_id=self._id,
                )
        else:
            while not store.acquire_lease(
                self._id, owner=st.owner, ttl_s=ttl, wait_s=_LEASE_POLL_S
            ):
                if control is not None and control.signal.aborted:
                    raise _WaitAborted
        st.lease_held = True
        cancel = HEARTBEAT.add(
            lambda: store.renew_lease(self._id, owner=st.owner, ttl_s=ttl), ttl / 3
        )
        try:
            yield
        finally:
            cancel()
            if st.lease_held:  # commit_turn may have released it already
                st.lease_held = False
                try:
                    store.release_lease(self._id, owner=st.owner)
                except Exception:
                    _log.warning("session %s: could not release its lease", self._id,
                                 exc_info=True)

    # --- transcript -----------------------------------------------------------------------------
    def load(self) -> tuple[Message, ...]:
        """Read the stored transcript (``send()`` does it itself); returns it."""
        st = self._state
        with st.lock:
            busy = st.current is not None
        if not busy:
            self._reload()
        with st.lock:
            return tuple(st.messages)

    def _reload(self) -> None:
        st = self._state
        revision = self._sessions.revision(self._id) if st.has_revision else None  # type: ignore[attr-defined]
        stored = self._sessions.load(self._id) or []
        messages = _loop.repair_orphans(list(stored), session_id=self._id)
        with st.lock:
            st.messages = messages
            st.used = _counters(messages)
            st.revision = revision
            st.loaded = True

    def _sync(self) -> None:
        """Make the cached transcript current (called holding the turn slot)."""
        st = self._state
        if not st.loaded or (
            st.shared_lease
            and st.has_revision
            and self._sessions.revision(self._id) != st.revision  # type: ignore[attr-defined]
        ):
            self._reload()

    def _key(self) -> str:
        return f"{self._id}.turn-{len(self._state.messages)}"

    def _pending_checkpoint(self) -> Checkpoint | None:
        if self._checkpoints is None:
            return None
        return self._checkpoints.load(self._key())

    def _still_pending(self, cp: Checkpoint) -> list[str]:
        if self._approvals is None:
            return []
        out = []
        for approval_id in cp.pending_approval_ids:
            record = self._approvals.get(approval_id)
            if record is not None and record.status == "pending":
                out.append(approval_id)
        return out

    def _raise_if_awaiting_locked(self) -> None:
        st = self._state
        if st.awaiting is None:
            return
        record = self._approvals.get(st.awaiting) if self._approvals is not None else None
        if record is not None and record.status == "pending":
            raise SessionAwaitingApprovalError(
                f"session {self._id!r} has a turn waiting on approval {st.awaiting!r}: resolve "
                "it with agent.approvals.resolve(), or discard_pending()",
                approval_id=st.awaiting,
                session_id=self._id,
            )
        st.awaiting = None

    def _resume_pending(self, control: TurnControl) -> ExecutionResult | None:
        cp = self._pending_checkpoint()
        if cp is None:
            return None
        if cp.status == "awaiting-approval":
            pending = self._still_pending(cp)
            if pending:
                with self._state.lock:
                    self._state.awaiting = pending[0]
                raise SessionAwaitingApprovalError(
                    f"session {self._id!r} has a turn waiting on approval {pending[0]!r}: "
                    "resolve it with agent.approvals.resolve(), or discard_pending()",
                    approval_id=pending[0],
                    session_id=self._id,
                )
        inner = TurnControl(cp.run_id)
        if cp.queued_inputs:
            inner.offer(cp.queued_inputs, steer=False)
        unlink = control.signal.add_callback(lambda: inner.abort(control.signal.reason))
        try:
            state = TurnState.from_checkpoint(cp)
            result: ExecutionResult = _drive(self._run(inner, state, None, resumed=True))
            return result
        finally:
            unlink()

    def _new_turn(
        self, control: TurnControl, msgs: tuple[Message, ...], approve: ApproveCallback | None
    ) -> Generator[RunEvent, None, ExecutionResult]:
        n = len(self._state.messages)
        state = TurnState(
            run_id=control.run_id,
            key=f"{self._id}.turn-{n}" if self._checkpoints is not None else None,
            session_id=self._id,
            turn_index=n,
            input=msgs,
        )
        result: ExecutionResult = yield from self._run(control, state, approve)
        return result

    def _config(self, approve: ApproveCallback | None) -> TurnConfig:
        return self._agent._turn_config(
            checkpoints=self._checkpoints,
            approvals=self._approvals,
            session_limits=self.limits,
            session_used=self._state.used,
            approve=approve,
        )

    def _run(
        self,
        control: TurnControl,
        state: TurnState,
        approve: ApproveCallback | None,
        *,
        resumed: bool = False,
    ) -> Generator[RunEvent, None, ExecutionResult]:
        st = self._state
        history = st.messages
        result = yield from run_turn(self._config(approve), control, state, history,
                                     resumed=resumed)
        finish = result.finish_reason
        if finish in ("stop", "length") or (finish == "limit" and state.recorded):
            self._commit(state, control, result.messages)
        elif finish == "limit":
            self._drop_checkpoint(state.key)
        elif finish == "awaiting-approval":
            with st.lock:
                st.awaiting = result.approval_id
        return result

    def _commit(self, state: TurnState, control: TurnControl, new: tuple[Message, ...]) -> None:
        st = self._state
        store: Any = self._sessions
        history = st.messages
        committed: object = None  # the new revision when commit_turn did it all
        try:
            if st.commit_turn is not None:
                with contextlib.suppress(StoreConflictError):  # then the slow path
                    committed = st.commit_turn(
                        self._id, new, expected_length=len(history),
                        checkpoints=self._checkpoints, checkpoint_key=state.key,
                        release_owner=st.owner if st.lease_held else None,
                    )
            if committed is not None:
                st.lease_held = False
            elif hasattr(store, "append"):
                try:
                    store.append(self._id, new, expected_length=len(history))
                except StoreConflictError as exc:
                    _log.warning(
                        "session %s: another writer stored %s messages where %s were expected; "
                        "appending this turn after them",
                        self._id, exc.actual_length, len(history),
                    )
                    history = self._append_after_conflict(store, new)
            else:
                store.save(self._id, [*history, *new])
        except BaseException:
            if self._checkpoints is not None and state.key is not None:
                with contextlib.suppress(Exception):
                    self._checkpoints.save(state.key, state.checkpoint("interrupted", ()))
            raise
        if committed is not None:
            revision = committed
        else:
            self._drop_checkpoint(state.key)
            revision = store.revision(self._id) if st.has_revision and st.shared_lease else None
        with st.lock:
            if history is st.messages:
                st.messages.extend(new)
            else:
                st.messages = [*history, *new]
            st.used = st.used + _counters(new)
            st.revision = revision

    def _append_after_conflict(self, store: Any, new: tuple[Message, ...]) -> list[Message]:
        for _ in range(100):
            fresh = list(store.load(self._id) or [])
            try:
                store.append(self._id, new, expected_length=len(fresh))
            except StoreConflictError:
                continue
            return fresh
        raise StoreConflictError(
            f"session {self._id!r}: could not append the turn after 100 conflicts",
            session_id=self._id,
        )

    def _drop_checkpoint(self, key: str | None) -> None:
        if self._checkpoints is not None and key is not None:
            self._checkpoints.delete(key)

    # --- pending turns -----------------------------------------------------------------------
    def pending(self) -> PendingTurn | None:
        """The unfinished turn (``"interrupted"`` or ``"awaiting-approval"``), or None."""
        st = self._state
        with st.lock:
            if st.current is not None:
                return None
        self._sync()
        cp = self._pending_checkpoint()
        if cp is None:
            return None
        if cp.status == "awaiting-approval":
            pending = self._still_pending(cp)
            if pending:
                return PendingTurn("awaiting-approval", pending[0])
        return PendingTurn("interrupted")

    def discard_pending(self) -> None:
        """Drop the unfinished turn (and deny its open approvals) without running it."""
        with self._exclusive("discard_pending()"):
            self._sync()
            cp = self._pending_checkpoint()
            if cp is None:
                return
            for approval_id in self._still_pending(cp):
                assert self._approvals is not None
                with contextlib.suppress(ApprovalAlreadyResolvedError):
                    self._approvals.resolve(approval_id, approved=False, reason="discarded")
            self._drop_checkpoint(cp.key)
            with self._state.lock:
                self._state.awaiting = None

    def clear(self) -> None:
        """Empty the transcript and save it empty; deletes an interrupted turn.

        Raises SessionBusyError while a turn runs and SessionAwaitingApprovalError while a
        turn waits on an approval. Session budgets count again from zero.
        """
        with self._exclusive("clear()"):
            self._sync()
            cp = self._pending_checkpoint()
            if cp is not None and cp.status == "awaiting-approval":
                pending = self._still_pending(cp)
                if pending:
                    raise SessionAwaitingApprovalError(
                        f"session {self._id!r} has a turn waiting on approval {pending[0]!r}; "
                        "resolve it or discard_pending() before clear()",
                        approval_id=pending[0],
                        session_id=self._id,
                    )
            self._sessions.save(self._id, [])
            if self._checkpoints is not None:  # the pending turn, and any stale ones
                for key in self._checkpoints.keys(f"{self._id}.turn-"):
                    self._checkpoints.delete(key)
            st = self._state
            revision = self._sessions.revision(self._id) if st.has_revision else None  # type: ignore[attr-defined]
            with st.lock:
                st.messages = []
                st.used = Counters()
                st.revision = revision
                st.loaded = True
                st.awaiting = None
        self._emit(ContextCleared)

    @contextlib.contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        st = self._state
        turn = _Turn(None)
        with st.lock:
            if st.current is not None or st.waiting:
                raise SessionBusyError(
                    f"session {self._id!r} is running a turn; {what} is refused until it ends",
                    session_id=self._id,
                )
            st.current = turn
        try:
            with self._lease(None, reject=True):
                yield
        finally:
            self._release_slot(turn)

    def compact(self, *, keep_last: int = 8, instructions: str | None = None) -> None:
        """Replace older messages with one summary message written by the model."""
        from .compaction import compact_session

        compact_session(self, keep_last=keep_last, instructions=instructions)

    def __repr__(self) -> str:
        return f"<Session {self._id!r} policy={self.turn_policy}>"


class _WaitAborted(Exception):
    pass


def _aborted(control: TurnControl) -> ExecutionResult:
    return ExecutionResult(
        text="", finish_reason="aborted", messages=(), usage=Usage(), steps=0,
        run_id=control.run_id,
    )


def _drive(gen: Generator[Any, None, Any]) -> Any:
    """Run a generator to its end, discarding what it yields; return its value."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value
