"""SessionState: what every ``Session`` object of one (session store, id) shares in this
process — the FIFO turn queue and its slot, the lease, the transcript cache and its
counters, and whether a turn waits on an approval.

Thread-safe: ``lock`` (and ``cond`` over it) guards ``waiting``, ``current``, ``messages``,
``used``, ``revision``, ``loaded`` and ``awaiting``. ``messages`` is append-only while it is
current (clear/compact replace the list), so views of it never change.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from . import _loop
from ._lease_hold import LeaseHold
from .approvals import current
from .callers import current_caller
from .control import TurnControl
from .errors import SessionAwaitingApprovalError, SessionBusyError
from .events import ListenerEvent
from .limits import Counters
from .messages import Message, Usage
from .results import ExecutionResult
from .signal import Latch, Signal
from .stores._lease import make_owner
from .stores.base import (
    Appendable,
    ApprovalStore,
    Leased,
    LeaseQuery,
    LeaseSaving,
    Revisioned,
    SessionStore,
    capabilities_of,
)

__all__ = [
    "SessionState",
    "Ticket",
    "Turn",
    "awaiting_error",
    "counters",
    "state_for",
]

_log = logging.getLogger(__name__)


def counters(messages: Iterable[Message]) -> Counters:
    """Steps, tool calls and usage recorded in ``messages`` (a compaction summary carries
    what it replaced)."""
    steps = tools = 0
    usage = Usage()
    for m in messages:
        if m.role == "assistant":
            steps += 1
            if m.usage is not None:
                usage = usage + m.usage
        elif m.role == "tool":
            tools += 1
        elif m.usage is not None:
            usage = usage + m.usage
            if m.metadata.get("lousho") == "summary":
                steps += _meta_int(m.metadata.get("steps"))
                tools += _meta_int(m.metadata.get("tool_calls"))
    return Counters(steps, tools, usage)


def _meta_int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@attrs.define(eq=False)
class Turn:
    """A turn holding (or waiting for) the slot; ``control`` is None for clear/compact."""

    control: TurnControl | None
    done: Latch = attrs.field(factory=Latch)
    result: ExecutionResult | None = None
    error: BaseException | None = None


@attrs.define(eq=False)
class Ticket:
    """A turn's place in the queue, with who queued it (a thread, or an asyncio task);
    ``started`` once its run is being driven."""

    seq: int
    turn: Turn
    caller: object = attrs.field(factory=current_caller)
    started: bool = False


class SessionState:
    """Shared by every Session of one (store, id) in this process (see the module)."""

    def __init__(self, store: SessionStore, id: str) -> None:
        self.store = store
        self.id = id
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.waiting: list[Ticket] = []
        self.current: Turn | None = None
        self.messages: list[Message] = []
        self.loaded = False
        self.revision: object = None
        self._used = Counters()
        self._counted = 0  # ``_used`` counts messages[:_counted] (see ``used``)
        self.awaiting: str | None = None
        self.owner = make_owner()
        self.seq = itertools.count()
        # what the store declares it offers, read once
        caps = capabilities_of(store)
        self.leasable: Leased | None = store if caps.lease else None  # type: ignore[assignment]
        self.leased = self.leasable is not None
        self.lease_query: LeaseQuery | None = (
            store if caps.lease_query else None)  # type: ignore[assignment]
        self.saving: LeaseSaving | None = (  # the lease and a turn's first checkpoint at once
            store if self.leased and isinstance(store, LeaseSaving) else None
        )
        self.appendable: Appendable | None = (
            store if caps.append else None)  # type: ignore[assignment]
        self.revisioned: Revisioned | None = (
            store if caps.revision else None)  # type: ignore[assignment]
        self.has_revision = self.revisioned is not None
        self.listeners: list[Callable[[ListenerEvent], object]] = []
        self.event_seq = itertools.count()
        self.token_tally: object = None  # compaction's estimate, kept with the transcript
        self.repaired = False  # the cache holds a repair the store has not (committed next)

    # --- the queue -------------------------------------------------------------------------
    def enqueue(self, control: TurnControl, *, seq: int | None = None) -> Ticket:
        """Queue a turn (at its call-order place ``seq`` when it joins late)."""
        with self.cond:
            ticket = Ticket(next(self.seq) if seq is None else seq, Turn(control))
            if seq is None:
                self.waiting.append(ticket)
            else:
                at = next((i for i, t in enumerate(self.waiting) if t.seq > seq),
                          len(self.waiting))
                self.waiting.insert(at, ticket)
                self.cond.notify_all()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Take a ticket that will never run out of the queue."""
        with self.cond:
            if ticket in self.waiting:
                self.waiting.remove(ticket)
                self.cond.notify_all()
        ticket.turn.done.set()

    def wait_for_slot(self, ticket: Ticket, signal: Signal) -> bool:
        """Block until ``ticket`` holds the slot (True) or ``signal`` aborts (False).

        A ticket queued behind an unread run of the same thread raises SessionBusyError
        instead of waiting forever.
        """
        ticket.started = True
        with self.cond:  # fast path: the session is idle and this ticket is next
            if (not signal.aborted and self.current is None and self.waiting
                    and self.waiting[0] is ticket):
                self.waiting.pop(0)
                self.current = ticket.turn
                return True

        def wake() -> None:
            with self.cond:
                self.cond.notify_all()

        remove = signal.add_callback(wake)
        try:
            with self.cond:
                while True:
                    if signal.aborted:
                        if ticket in self.waiting:
                            self.waiting.remove(ticket)
                        self.cond.notify_all()
                        return False
                    if self.current is None and self.waiting and self.waiting[0] is ticket:
                        self.waiting.pop(0)
                        self.current = ticket.turn
                        return True
                    self._refuse_self_deadlock_locked(ticket)
                    self.cond.wait()
        finally:
            remove()

    def _refuse_self_deadlock_locked(self, ticket: Ticket) -> None:
        me = current_caller()
        for ahead in self.waiting:
            if ahead is ticket:
                return
            if not ahead.started and ahead.caller == me:
                self.waiting.remove(ticket)
                self.cond.notify_all()
                raise SessionBusyError(
                    f"session {self.id!r}: this thread (or task) started a stream() that has "
                    "not been read yet, and this call would wait for it forever; iterate that "
                    "run (or call its result()) first",
                    session_id=self.id,
                )

    def claim(self, what: str) -> Turn:
        """Take the slot for ``what`` (clear, compact, ...) or raise SessionBusyError."""
        turn = Turn(None)
        with self.lock:
            if self.current is not None or self.waiting:
                raise SessionBusyError(
                    f"session {self.id!r} is running a turn; {what} is refused until it ends",
                    session_id=self.id,
                )
            self.current = turn
        return turn

    def release_slot(self, turn: Turn) -> None:
        """Give the slot up and wake the next ticket."""
        with self.cond:
            if self.current is turn:
                self.current = None
            self.cond.notify_all()
        turn.done.set()

    @property
    def busy(self) -> bool:
        """Whether a turn holds the slot."""
        with self.lock:
            return self.current is not None

    # --- the lease ---------------------------------------------------------------------------
    def hold(self, ttl_s: float) -> LeaseHold | None:
        """A new, not yet acquired hold on the session's lease (None: the store has none)."""
        if self.leasable is None:
            return None
        return LeaseHold(self.leasable, self.id, self.owner, ttl_s)

    # --- the transcript ---------------------------------------------------------------------
    def reload(self) -> None:
        """Read the stored transcript into the cache (orphaned tool calls repaired)."""
        revision = self.revisioned.revision(self.id) if self.revisioned is not None else None
        stored = list(self.store.load(self.id) or [])
        messages = _loop.repair_orphans(stored, session_id=self.id)
        self.replace(messages, revision)
        self.repaired = messages is not stored

    def sync(self) -> None:
        """Make the cache current (called holding the slot)."""
        if not self.loaded or (
            self.leased
            and self.revisioned is not None
            and self.revisioned.revision(self.id) != self.revision
        ):
            self.reload()

    def current_revision(self) -> object:
        """The store's revision now, when another process may write (else None)."""
        if self.revisioned is not None and self.leased:
            return self.revisioned.revision(self.id)
        return None

    @property
    def used(self) -> Counters:
        """Steps, tool calls and usage of the cached transcript, for the session's budget.
        Counted when read, from where the last count stopped: a session without a budget
        never reads it, and its turns count nothing."""
        with self.lock:
            return self._count()

    def _count(self) -> Counters:
        # (holding ``lock``) the cache only grows between two replace()
        if self._counted < len(self.messages):
            self._used = self._used + counters(self.messages[self._counted:])
            self._counted = len(self.messages)
        return self._used

    def replace(self, messages: list[Message], revision: object) -> None:
        """Make ``messages`` the cached transcript."""
        with self.lock:
            self.messages = messages
            self._used, self._counted = Counters(), 0
            self.revision = revision
            self.loaded = True
            self.repaired = False

    def extend(self, history: list[Message], new: tuple[Message, ...], revision: object) -> None:
        """The turn ``new`` was stored after ``history``."""
        with self.lock:
            if history is self.messages:
                self.messages.extend(new)
            else:  # (after another writer's turn): the count goes on from the cache's
                used = self._count() + counters(new)
                self.messages = [*history, *new]
                self._used, self._counted = used, len(self.messages)
            self.revision = revision

    # --- listeners ---------------------------------------------------------------------------
    def emit(self, cls: Callable[..., ListenerEvent], **fields: Any) -> None:
        """Deliver a session event to every listener of this session id (a listener that
        raises is logged and skipped)."""
        event = cls(session_id=self.id, seq=next(self.event_seq), **fields)
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:
                _log.warning("session %s: listener %r raised on %s", self.id, listener,
                             event.type, exc_info=True)

    # --- approvals ----------------------------------------------------------------------------
    def raise_if_awaiting_locked(self, approvals: ApprovalStore | None) -> None:
        """SessionAwaitingApprovalError while the approval a turn paused on is pending
        (the caller holds ``lock``)."""
        awaiting = self.awaiting
        if awaiting is None:
            return
        record = current(approvals, awaiting) if approvals is not None else None
        if record is not None and record.status == "pending":
            raise awaiting_error(self.id, awaiting)
        self.awaiting = None


def awaiting_error(session_id: str, approval_id: str, before: str = "") -> Exception:
    """The error for a call refused while a turn waits on ``approval_id``."""
    then = f"; resolve it or discard_pending() before {before}" if before else (
        ": resolve it with agent.approvals.resolve(), or discard_pending()"
    )
    return SessionAwaitingApprovalError(
        f"session {session_id!r} has a turn waiting on approval {approval_id!r}{then}",
        approval_id=approval_id,
        session_id=session_id,
    )


_REGISTRY: weakref.WeakValueDictionary[tuple[int, str], SessionState] = (
    weakref.WeakValueDictionary()
)
_REGISTRY_LOCK = threading.Lock()


def state_for(store: SessionStore, session_id: str) -> SessionState:
    """The one SessionState of (``store``, ``session_id``) in this process."""
    key = (id(store), session_id)  # the state keeps the store alive, so id() stays unique
    with _REGISTRY_LOCK:
        state = _REGISTRY.get(key)
        if state is None or state.store is not store:
            state = SessionState(store, session_id)
            _REGISTRY[key] = state
        return state
