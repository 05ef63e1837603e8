"""TurnControl: the live side of a turn — abort, input queued into it, and a steer aimed
at its current model call. Shared by the executor, the run handle and joining callers."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

from .messages import Message
from .signal import AbortController, Latch

__all__ = ["TurnControl", "new_id"]


class TurnControl:
    """The live side of a running turn, shared by the executor and its callers.

    Thread-safe: ``_lock`` guards the queued input, the open/closed flag and the state of
    the current model call; ``enqueue``/``steer``/``abort`` may be called from any thread.
    """

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id or new_id()
        self.controller = AbortController()
        self.signal = self.controller.signal
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._queued: list[Message] = []
        self._announced: list[tuple[Message, ...]] = []
        self._open = True
        self._steer = False
        self._in_call: AbortController | None = None
        self._unlink_call: Callable[[], None] = _noop
        self._emitted = False
        self._steered_call = False
        self.offered = Latch()
        """Set once some input was queued into the turn (lets callers wait for a join)."""
        self.taken: list[object] = []
        """Tokens of joined inputs the turn took (applied or kept in its checkpoint)."""
        self._tokens: list[tuple[object, int]] = []
        self.left = False
        """Set when the reader left: the turn may only finish a final answer already
        streamed; anything more (a tool, another model call, more text) aborts it."""
        self.may_finish = False
        """Whether the turn is streaming its answer's text or has it whole with no tool
        call (kept by the executor): then a leaving reader lets it finish."""
        self.logged = False
        """True for a turn whose events go to an event log (``Session.start``, a takeover):
        its commit records the turn's id in its last message (see
        :func:`lousho_sync._eventlog.seal_turn`)."""
        self.sink: Callable[[Any], None] | None = None
        """Where the turn's events go besides its caller (the executor makes them for it even
        when the caller reads none): the event log opened when input from another process
        joins a turn that wrote none (see :mod:`lousho_sync._mailbox`)."""
        self.join_log: Any = None
        """The publisher of that log; ``join_log_closed``: it may no longer be opened."""
        self.join_log_closed = False
        self.keys: set[str] = set()
        """The idempotency keys of the turn's input and of the input joined into it."""
        self.reachable = True
        """False when nobody else can abort this turn (no caller's signal, no run handle
        given out, no session slot others may roll back: ``agent.send()`` without a
        ``signal``); a tool without ``timeout_s`` then runs on the turn's own thread."""

    # --- events -------------------------------------------------------------------------
    def next_seq(self) -> int:
        """The next event sequence number of this run."""
        return next(self._seq)

    def rewind_seq(self, seq: int) -> None:
        """Make ``seq`` the next sequence number handed out (a run whose last events were
        written elsewhere first, or that reads another turn's events)."""
        self._seq = itertools.count(seq)

    # --- queued input ------------------------------------------------------------------
    def offer(self, messages: tuple[Message, ...], *, steer: bool, token: object = None,
              keys: tuple[str, ...] = ()) -> bool:
        """Queue input into the turn; False when the turn no longer takes input, or when
        ``keys`` (the input's idempotency keys) holds one the turn already has (its own
        input's, or a joined input's: a retry joins no turn twice)."""
        with self._lock:
            if not self._open:
                return False
            if keys:
                if not self.keys.isdisjoint(keys):
                    return False
                self.keys.update(keys)
            self._queued.extend(messages)
            self._announced.append(messages)
            if token is not None:
                self._tokens.append((token, len(self._queued)))
            self.offered.set()
            if steer:
                self._steer = True
                if self._in_call is not None and not self._emitted:
                    self._steered_call = True
                    self._in_call.abort("steer")
            return True

    def close_if_idle(self) -> bool:
        """Stop taking input unless some is queued; True when closed."""
        with self._lock:
            if self._queued:
                return False
            self._open = False
            return True

    def close(self) -> list[Message]:
        """Stop taking input; returns what was queued and never applied."""
        with self._lock:
            self._open = False
            return list(self._queued)

    def queued(self) -> list[Message]:
        """Input queued and not applied yet."""
        with self._lock:
            return list(self._queued)

    def take_announcements(self) -> list[tuple[Message, ...]]:
        """Inputs queued since the last call (for ``input.queued`` events)."""
        with self._lock:
            out, self._announced = self._announced, []
            return out

    def take_queued(self) -> tuple[list[Message], bool]:
        """Remove and return the queued input, and whether a steer asked for it."""
        with self._lock:
            out, self._queued = self._queued, []
            steer, self._steer = self._steer, False
            self.taken.extend(t for t, _ in self._tokens)
            self._tokens = []
            return out, steer

    def has_queued(self) -> bool:
        """Whether input waits to be announced or applied (a racy read: input queued just
        after it is applied at the next safe point)."""
        return bool(self._queued or self._announced)

    def steer_requested(self) -> bool:
        """Whether a steer is waiting to be applied."""
        return self._steer

    def keep_queued_tokens(self) -> None:
        """Count the unapplied joined inputs as taken (the turn failed; its checkpoint keeps
        them for ``resume()``)."""
        with self._lock:
            self.taken.extend(t for t, _ in self._tokens)
            self._tokens = []

    # --- model call -----------------------------------------------------------------------
    def begin_call(self) -> AbortController:
        """Start a model call: a child controller that a steer (or the turn's abort) aborts."""
        child = AbortController()
        signal = self.signal
        self._unlink_call = signal.add_callback(lambda: child.abort(signal.reason))
        with self._lock:
            self._in_call = child
            self._emitted = False
            self._steered_call = False
        self.may_finish = False
        return child

    def mark_emitted(self) -> bool:
        """The call emitted something; False when a steer already aborted it."""
        if self._emitted:  # a steer never aborts a call that has emitted
            return True
        with self._lock:
            if self._steered_call:
                return False
            self._emitted = True
            return True

    def end_call(self) -> bool:
        """End the model call; True when a steer aborted it (then it must be made again)."""
        self._unlink_call()
        with self._lock:
            steered = self._steered_call
            self._in_call = None
            self._steered_call = False
            return steered

    def abort(self, reason: object = None) -> None:
        """Abort the turn."""
        self.controller.abort(reason)

    def leave(self) -> None:
        """The reader left (see ``left``): the turn finishes a final answer it is streaming
        or has whole, and is aborted otherwise."""
        self.left = True
        if not self.may_finish:
            self.abort("the consumer stopped iterating")

    def drop_queued(self) -> None:
        """Stop taking input and forget what was queued and not applied (the turn paused:
        the callers whose input it was are told their call failed, so nothing of it may
        be applied later)."""
        with self._lock:
            self._open = False
            self._queued = []
            self._announced = []
            self._tokens = []
            self._steer = False


def new_id() -> str:
    """A random 128-bit id as 32 hex digits (what uuid4().hex looks like, cheaper)."""
    return os.urandom(16).hex()


def _noop() -> None:
    return None
