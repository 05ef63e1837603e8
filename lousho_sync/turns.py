"""The life of a turn: the only place a turn is started, resumed and ended.

:class:`SessionTurn` is a session turn's whole life — slot → lease → sync the cached
transcript → finish a pending turn → automatic compaction → play → commit → release — for
``send``/``stream``, ``resume()`` and approval continuations alike. :func:`one_shot` and
:func:`resume_one_shot` are a one-shot run's (``agent.send(..., session_id=...)``), and
:class:`AgentExecutor` the low-level entry point. Every kind of turn goes through
:func:`play`, so one rule decides what becomes of a turn's checkpoint:

============================================  ==========================================
the turn ...                                  its checkpoint
============================================  ==========================================
finished (``stop``/``length``), or reached a  committed with the transcript (a session:
limit after recording progress                one store transaction where the store can),
                                              else deleted
reached a limit before any progress           deleted (nothing is stored)
paused on an approval                         kept (``awaiting-approval``)
was aborted                                   deleted (transcript as before)
lost its lease (``LeaseLostError``)           left as it is, for the new holder
failed after recording a model response or   kept as ``interrupted`` for ``resume()``
a tool result (a durable session)
failed before any progress, or not durable    deleted: a plain retry is correct
============================================  ==========================================

Checkpoint keys are built and parsed by :mod:`lousho_sync.records` only.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import attrs

from . import _idempotency as idem
from . import _mailbox as mailbox
from ._eventlog import EventLog, Publisher, seal_turn
from ._lease_hold import LeaseHold
from ._session_parts import SessionParts
from ._session_state import Ticket
from .control import TurnControl
from .errors import (
    LeaseLostError,
    LoushoError,
    SessionAwaitingApprovalError,
    SessionBusyError,
    StoreConflictError,
    StoreCorruptError,
)
from .events import RunDone, RunEvent, RunFailed, RunStart
from .executor import Turn, TurnAborted, TurnEnv, TurnWriter, checkpoint_of
from .inputs import to_messages
from .limits import Counters, Limits
from .messages import Message, Usage
from .providers.base import Provider
from .records import Checkpoint, one_shot_key, session_key
from .results import ExecutionResult
from .signal import Signal, link
from .stores._events import TurnHead
from .stores._mail import MailOps
from .stores.base import ApprovalStore, CheckpointStore
from .tools import Tool
from .turn_state import ApproveCallback, TurnConfig, TurnState

__all__ = [
    "AgentExecutor",
    "Commit",
    "SessionTurn",
    "aborted_result",
    "drive",
    "keyed_turn",
    "note_keyed",
    "one_shot",
    "play",
    "play_linked",
    "resume_one_shot",
    "resumed_turn",
    "tell_pending",
]

_log = logging.getLogger(__name__)

Commit = Callable[[ExecutionResult], None]
"""Stores a finished turn's messages and drops its checkpoint (see :func:`play`)."""

_CONFLICT_RETRIES = 100
_LINE_POLL_S = 0.002  # a poster waiting in line looks again after this, doubling up to
_LINE_POLL_MAX_S = 0.05
_RECORD_FAILED = (
    "the turn is in doubt: its progress (a tool may have run) could not be recorded, so "
    "its last record was left as it was for resume(), which reports a tool that may have "
    "run instead of running it again"
)
_DELETE_FAILED = (
    "the turn is in doubt: its record could not be deleted, so it may still pend; "
    "pending() tells once the store answers"
)
_NOT_SENT = (
    "this error is about the session's pending turn, which this call was finishing first; "
    "this call's own input was not started and not stored: send it again"
)
_NOTHING_USED = Counters()
"""A turn's session count when the session has no budget (nothing reads it then)."""

_RESUME_HINT = (
    "the turn was kept: finish it with session.resume() (or the next send()), or drop it "
    "with session.discard_pending()"
)


# --- playing a turn ----------------------------------------------------------------------------
def play(
    turn: Turn,
    *,
    resumed: bool = False,
    commit: Commit | None = None,
    resume_hint: str | None = None,
) -> Generator[RunEvent, None, ExecutionResult]:
    """Run (or continue) ``turn`` to its end and settle its checkpoint by the one rule of
    the module docstring. ``commit`` stores a finished turn (sessions); without it the
    checkpoint is just deleted (one-shot runs). A LoushoError raised out of the turn says
    in ``pending`` whether the turn was kept, and when it was, ``resume_hint`` (how to
    finish or drop it) joins its message."""
    env, ctl, state = turn.env, turn.ctl, turn.state
    try:
        result = yield from turn.steps(resumed=resumed)
        finish = result.finish_reason
        if finish in ("stop", "length") or (finish == "limit" and state.recorded):
            if commit is not None:
                commit(result)
            elif env.durable or resumed:  # a run that is not durable wrote none unless paused
                env.writer.delete(state.key)
        elif finish == "limit" and (env.durable or resumed):
            env.writer.delete(state.key)
        return result
    except LeaseLostError as exc:
        ctl.close()
        exc.pending = True  # the new holder of the lease finishes it
        raise
    except BaseException as exc:
        if ctl.signal.aborted or isinstance(exc, (TurnAborted, GeneratorExit)):
            ctl.close()
            _quietly(lambda: env.writer.delete(state.key),
                     "delete the checkpoint of aborted turn", state)
            if isinstance(exc, GeneratorExit):
                raise
            return turn.result("aborted", messages=())
        ctl.keep_queued_tokens()
        doubt: str | None = None
        if resumed or (env.durable and turn.has_progress()):
            # a pending turn stays pending until finished or discarded; one with progress
            # is kept. When its record cannot be updated, the last one stays as it was.
            kept = True
            if not _quietly(
                lambda: env.writer.save(turn.checkpoint("interrupted")),
                "mark interrupted the turn", state,
            ) and not resumed:
                doubt = _RECORD_FAILED
        else:  # nothing recorded: a plain retry is correct, so nothing may pend
            kept = env.writer.wrote and not _quietly(
                lambda: env.writer.delete(state.key),
                "delete the checkpoint of failed turn", state,
            )
            if kept:
                doubt = _DELETE_FAILED
        if isinstance(exc, LoushoError):
            tell_pending(exc, kept, resume_hint, doubt)
        raise


def tell_pending(
    exc: LoushoError, kept: bool, hint: str | None, doubt: str | None = None
) -> None:
    """Say on ``exc`` whether its turn was kept (``pending``), with how to finish it (and,
    when the store failed to record the turn's end, that the turn is in doubt)."""
    exc.pending = kept
    if doubt is not None:
        hint = f"{doubt}; {hint}" if hint else doubt
    if kept and hint and exc.args and isinstance(exc.args[0], str) and hint not in exc.args[0]:
        exc.args = (f"{exc.args[0]} [{hint}]", *exc.args[1:])


def _quietly(fn: Callable[[], object], what: str, state: TurnState) -> bool:
    try:
        fn()
    except Exception:
        _log.warning("could not %s %s", what, state.key, exc_info=True)
        return False
    return True


def resumed_turn(cp: Checkpoint) -> tuple[TurnControl, TurnState]:
    """The control and state that continue the turn ``cp`` recorded (its queued input
    offered again)."""
    ctl = TurnControl(cp.run_id)
    if cp.queued_inputs:
        ctl.offer(cp.queued_inputs, steer=False)
    return ctl, TurnState.from_checkpoint(cp)


def drive(gen: Generator[Any, None, Any]) -> Any:
    """Run a generator to its end, discarding what it yields; return its value."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def play_linked(
    signal: Signal | None, ctl: TurnControl, gen: Generator[RunEvent, None, ExecutionResult]
) -> Generator[RunEvent, None, ExecutionResult]:
    """``gen`` with the caller's ``signal`` aborting ``ctl`` while it runs."""
    unlink = link(signal, ctl.abort)
    try:
        result: ExecutionResult = yield from gen
        return result
    finally:
        unlink()


def aborted_result(control: TurnControl) -> ExecutionResult:
    """The result of a turn aborted before it started."""
    return ExecutionResult(
        text="", finish_reason="aborted", messages=(), usage=Usage(), steps=0,
        run_id=control.run_id,
    )


# --- a session turn ----------------------------------------------------------------------------
class SessionTurn:
    """One call's session turn from its place in the queue to its release (see the module
    docstring): ``input`` None finishes the pending turn only (``resume()`` and approval
    continuations). The one thing ``send``, ``stream`` and ``resume`` run; driven by one
    thread at a time through :meth:`run`."""

    __slots__ = ("_approve", "_emit_pending", "_events", "_idem_ttl_s", "_input", "_limits",
                 "_log", "_p", "_policy", "_signal", "_ticket", "_wait")

    def __init__(
        self,
        parts: SessionParts,
        ticket: Ticket,
        input: tuple[Message, ...] | None,
        *,
        signal: Signal | None = None,
        approve: ApproveCallback | None = None,
        limits: Limits | None = None,
        wait_for_lease: bool = True,
        idempotency_ttl_s: float = idem.DEFAULT_TTL_S,
        policy: str = "wait",
        emit_pending: bool = False,
        log: EventLog | None = None,
        events: Callable[[], EventLog] | None = None,
    ) -> None:
        self._p = parts
        self._log = log
        self._events = events
        self._policy = policy
        self._emit_pending = emit_pending
        self._idem_ttl_s = idempotency_ttl_s
        self._ticket = ticket
        self._input = input
        self._signal = signal
        self._approve = approve
        self._limits = limits
        self._wait = wait_for_lease

    def run(self, emit: bool) -> Generator[RunEvent, None, Any]:
        """Wait for the slot, take the lease, finish a pending turn, then run the input (the
        lease is held from the first write to the last commit); returns the result (None:
        ``resume()`` found nothing pending)."""
        st = self._p.state
        turn = self._ticket.turn
        control = turn.control
        assert control is not None
        unlink = link(self._signal, control.abort)
        msgs = self._input
        key = own_key = key_of(msgs)
        if own_key is not None:
            control.keys.add(own_key)  # a retry never joins this turn
        mail = self._p.mail
        mail_id: str | None = None
        unregister: Callable[[], None] | None = None
        result: ExecutionResult | None = None
        failure: BaseException | None = None
        attached: ExecutionResult | None = None
        log = self._log if key is not None and msgs is not None else None
        try:
            if log is not None and st.busy:  # this process runs a turn: is it the key's?
                assert key is not None
                attached = yield from self._attach(log, key, control, emit, None)
                if attached is not None:
                    st.cancel(self._ticket)
            if attached is not None:
                result = attached
            elif not st.wait_for_slot(self._ticket, control.signal):
                result = aborted_result(control)
            else:
                hold = st.hold(self._p.lease_ttl_s)
                first: TurnState | None = None
                try:
                    if hold is None:  # a store without a lease (this process only): taken
                        got = True
                    elif mail is not None and msgs is not None \
                            and self._policy in ("queue", "steer", "rollback"):
                        if key is None:
                            got, mail_id, msgs, attached = yield from self._through_mailbox(
                                mail, hold, control, msgs, emit)
                            key = mail_id
                        else:
                            got, mail_id, msgs, attached = \
                                yield from self._keyed_through_mailbox(
                                    mail, log, key, hold, control, msgs, emit)
                            key = mail_id or key
                    elif log is not None and self._wait:
                        assert key is not None
                        got, attached = yield from self._lease_or_attach(log, key, hold,
                                                                         control, emit)
                    else:
                        first = (self._first_state(control, msgs)
                                 if key is None and self._p.saving is not None else None)
                        got = hold.acquire(
                            wait=self._wait, signal=control.signal,
                            first=None if first is None or self._p.saving is None else
                            (self._p.saving, checkpoint_of(first, control, "running"),
                             st.revision))
                    if mail_id is not None and got:  # never offered to our own turn
                        _quiet_drop(mail, mail_id, self._p.id)
                    if hold is not None and got and mail is not None:
                        unregister = mailbox.register(mail, self._p.id, control,
                                                      self._log_opener(control, msgs))
                    if attached is not None:
                        result = attached
                    elif not got:
                        result = aborted_result(control)
                    elif hold is not None and hold.saved and first is not None:
                        # the cache was current and no turn pended (checked in the lease's
                        # transaction, which wrote the turn's first checkpoint)
                        result = yield from self._play(control, first, self._approve, hold,
                                                       emit=emit, resumed=False, last=True,
                                                       saved_first=True)
                    else:
                        st.sync()
                        resumed = None
                        try:
                            cp = self._pending()
                            if cp is not None:  # (no generator made in the common case)
                                resumed = yield from self._finish_pending(
                                    cp, control, hold, last=msgs is None)
                        except LoushoError as exc:
                            _about_pending(exc, own_input=msgs is not None)
                            raise
                        replay = (idem.find(st.messages, key, self._idem_ttl_s)
                                  if key is not None else None)
                        joined = replay is not None and mail_id is not None
                        if replay is None and own_key is not None and key != own_key:
                            # a keyed input posted to the mailbox that no turn took: is its
                            # key used (another call with it was applied)?
                            replay = idem.find(st.messages, own_key, self._idem_ttl_s)
                        if msgs is None:
                            result = resumed
                        elif replay is not None and joined:
                            result = attrs.evolve(replay, replayed=False, joined=True)
                        elif replay is not None:  # the key was used: no second turn
                            result = replay
                            if resumed is not None and resumed.run_id != replay.run_id:
                                result = attrs.evolve(replay, resumed=resumed)
                        else:
                            try:
                                if self._p.base.compaction is not None:
                                    self._p.maybe_compact(msgs, control.signal, hold,
                                                          self._limits, self._idem_ttl_s)
                                publisher = None
                                if log is not None:
                                    assert own_key is not None
                                    publisher = log.begin(control.run_id, self._p.id, st.owner,
                                                        announce=True)
                                    note_keyed(self._p.id, own_key, control)
                                play = self._new_turn(control, msgs, hold,
                                                      emit or publisher is not None)
                                if publisher is not None:
                                    play = _published(play, publisher, control, emit)
                                result = yield from play
                            except LoushoError as exc:
                                exc.turn, exc.resumed = "own", resumed
                                raise
                            if resumed is not None:
                                result = attrs.evolve(result, resumed=resumed)
                            if publisher is not None:
                                _publish_end(publisher, control, result)
                except BaseException as exc:
                    failure = exc
                    raise
                finally:
                    if unregister is not None:
                        unregister()
                        mailbox.end_join_log(control, result, failure)
                    if hold is not None:
                        hold.release()
                    if mail_id is not None:
                        _quiet_drop(mail, mail_id, self._p.id)
            turn.result = result
            return result
        except BaseException as exc:
            if isinstance(exc, LoushoError):
                if exc.pending is None:
                    exc.pending = isinstance(exc, SessionAwaitingApprovalError)
                if exc.turn is None:
                    exc.turn = "own" if msgs is not None else "resumed"
            turn.error = exc
            raise
        finally:
            unlink()
            control.close()
            st.release_slot(turn)

    def _lease_or_attach(
        self, log: EventLog | None, key: str, hold: LeaseHold, control: TurnControl,
        emit: bool, *, wait: bool = True,
    ) -> Generator[RunEvent, None, tuple[bool, ExecutionResult | None]]:
        """Take the lease for a keyed call; while another process holds it, attach to its
        running turn when that is the turn of ``key`` (see :meth:`_attach`), else (``wait``)
        wait for the lease. Returns (the lease is taken, the attached turn's result)."""
        try:
            return hold.acquire(wait=False), None
        except SessionBusyError:
            pass
        taken: list[bool] = []

        def try_lease() -> bool:
            try:
                got = hold.acquire(wait=False)
            except SessionBusyError:
                return False
            taken.append(got)
            return got

        if log is not None:
            attached = yield from self._attach(log, key, control, emit, try_lease)
            if attached is not None:
                return False, attached
        if taken or not wait:
            return bool(taken), None
        return hold.acquire(wait=True, signal=control.signal), None

    def _attach(
        self, log: EventLog, key: str, control: TurnControl, emit: bool,
        try_lease: Callable[[], bool] | None,
    ) -> Generator[RunEvent, None, ExecutionResult | None]:
        """A keyed call meeting the running turn of its key (it writes its events to the
        event log, see :func:`_published`) attaches to it: yields its events (as that turn's,
        ``turn_id`` and ``seq``) and returns its result (``replayed``). None when the running
        turn is not the key's, or it ended without a result to give (it failed or was
        aborted: the key is free, or the pending turn is finished under the lease), or the
        lease was taken meanwhile (``try_lease``, tried whenever the log is quiet: its holder
        went away)."""
        head = keyed_turn(log, self._p.id, key)
        if head is None:
            return None

        def idle(_: object) -> bool:  # nothing new a while: aborted, or the owner gone?
            if control.signal.aborted:
                return True
            return try_lease is not None and try_lease()

        own_id, last = control.run_id, -1
        done: RunDone | None = None
        try:
            for event in log.follow(head.turn_id, -1, idle=idle):
                if isinstance(event, RunDone):
                    done = event
                    break
                if isinstance(event, RunFailed):
                    continue
                last = event.seq
                if emit:
                    control.run_id = head.turn_id  # this run reads that turn
                    yield event
        except LoushoError:
            _log.warning("could not follow turn %s of the event log", head.turn_id,
                         exc_info=True)
        if done is not None and done.result is not None and done.finish_reason != "aborted":
            control.run_id = head.turn_id
            control.rewind_seq(done.seq)
            return attrs.evolve(done.result, replayed=True, joined=False)
        if control.signal.aborted:
            return aborted_result(control)
        control.run_id = own_id  # this call goes on as its own turn (or a replay)
        control.rewind_seq(last + 1)
        return None

    def _keyed_through_mailbox(
        self, mail: MailOps, log: EventLog | None, key: str, hold: LeaseHold,
        control: TurnControl, msgs: tuple[Message, ...], emit: bool,
    ) -> Generator[RunEvent, None, tuple[bool, str | None, tuple[Message, ...],
                                         ExecutionResult | None]]:
        """``"queue"``/``"steer"``/``"rollback"`` with an idempotency key when another process
        holds the lease: attach to the running turn when it is the key's; wait for the lease
        when the key is used in the transcript; else (``"rollback"``) post an abort naming
        the key (a turn that took the key is not aborted: it is this request's) and wait for
        the lease, or post the input to the mailbox claiming both the mail's id and the key
        (the turn that applies it seals both, so a retry finds it). Returns (the lease is
        taken, the mail id, the input, the attached turn's result)."""
        got, attached = yield from self._lease_or_attach(log, key, hold, control, emit,
                                                         wait=False)
        if got or attached is not None:
            return got, None, msgs, attached
        stored = self._p.sessions.load(self._p.id) or []
        if idem.find(stored, key, self._idem_ttl_s) is not None:  # used: replayed under it
            return hold.acquire(wait=True, signal=control.signal), None, msgs, None
        if self._policy == "rollback":
            abort_id = mailbox.post_abort(mail, self._p.id, "rollback", None, key)
            try:
                return hold.acquire(wait=True, signal=control.signal), None, msgs, None
            finally:  # the turn it was for is over: never let it stop this call's own turn
                _quiet_drop(mail, abort_id, self._p.id)
        mail_id = mailbox.mail_key()
        msgs = idem.claim(msgs, mail_id, also=key)
        posted_at = time.time()
        mailbox.post_input(mail, self._p.id, msgs, steer=self._policy == "steer",
                           mail_id=mail_id, poster=hold.owner)
        got, attached = yield from self._wait_joined(mail, hold, control, mail_id, posted_at,
                                                     emit)
        return got, mail_id, msgs, attached

    def _through_mailbox(
        self, mail: MailOps, hold: LeaseHold, control: TurnControl, msgs: tuple[Message, ...],
        emit: bool,
    ) -> Generator[RunEvent, None, tuple[bool, str | None, tuple[Message, ...],
                                         ExecutionResult | None]]:
        """Take the lease; when another process holds it, post the input (``"queue"``,
        ``"steer"``) or an abort (``"rollback"``) to the session's mailbox first, then wait
        for it (or for the turn the input joined, :meth:`_wait_joined`). Returns (taken, the
        mail id the input claims, the input, the joined turn's result)."""
        try:
            return hold.acquire(wait=False), None, msgs, None
        except SessionBusyError:
            pass
        if self._policy == "rollback":
            abort_id = mailbox.post_abort(mail, self._p.id, "rollback", None)
            try:
                return hold.acquire(wait=True, signal=control.signal), None, msgs, None
            finally:  # the turn it was for is over: never let it stop this call's own turn
                _quiet_drop(mail, abort_id, self._p.id)
        mail_id = mailbox.mail_key()
        msgs = idem.claim(msgs, mail_id)
        posted_at = time.time()
        mailbox.post_input(mail, self._p.id, msgs, steer=self._policy == "steer",
                           mail_id=mail_id, poster=hold.owner)
        got, attached = yield from self._wait_joined(mail, hold, control, mail_id, posted_at,
                                                     emit)
        return got, mail_id, msgs, attached

    def _first_in_line(self, mail: MailOps, hold: LeaseHold, mail_id: str) -> bool:
        """Take the lease when every input posted before ``mail_id`` has had it (next turns
        in arrival order, :func:`~lousho_sync._mailbox.first_in_line`)."""
        if not mailbox.first_in_line(mail, self._p.id, mail_id):
            return False
        try:
            return hold.acquire(wait=False)
        except SessionBusyError:
            return False

    def _wait_joined(
        self, mail: MailOps, hold: LeaseHold, control: TurnControl, mail_id: str,
        posted_at: float, emit: bool,
    ) -> Generator[RunEvent, None, tuple[bool, ExecutionResult | None]]:
        """Wait for the lease in line (:meth:`_first_in_line`) and, meanwhile, for the
        running turn to take the input of ``mail_id``: the owner then writes that turn's
        events to the event log (see :func:`~lousho_sync._mailbox.register`), which this
        call reads from its input's ``input.queued`` on (yielded as that turn's events),
        and a ``run.done`` committed with the input ends the call (its result). Returns
        (the lease is taken, the joined turn's result); (False, None) when the call is
        aborted first. A joined turn that ended otherwise (failed, aborted, paused) is
        settled under the lease, as before: what the transcript says. The session's latest
        turn is read once whether it runs or ended since the post (a short turn may end
        between two looks); a turn that ended before the post is never read (it took no
        input posted later; a second of slack for clocks)."""
        log = self._events() if self._events is not None else None
        pause = _LINE_POLL_S
        read: set[str] = set()  # turns followed to their end

        def unread() -> TurnHead | None:
            """The session's latest turn in the log when it is yet to be read."""
            if log is None:
                return None
            try:
                head = log.latest(self._p.id)
            except LoushoError:
                _log.warning("could not read the event log of session %s", self._p.id,
                             exc_info=True)
                return None
            if head is None or head.turn_id in read or (
                    head.ended_at is not None and head.ended_at < posted_at - 1.0):
                return None
            read.add(head.turn_id)
            return head

        while True:
            if self._first_in_line(mail, hold, mail_id):
                # the turn that took the input wrote its end before it let the lease go: a
                # turn that ran whole between two looks is read now
                head = unread()
                if head is None or head.ended_at is None or log is None:
                    return True, None
                _, joined = yield from self._read_joined(log, head.turn_id, mail, None,
                                                         control, mail_id, emit)
                return True, joined
            head = unread()
            if head is not None:
                assert log is not None
                got, joined = yield from self._read_joined(log, head.turn_id, mail, hold,
                                                           control, mail_id, emit)
                if got or joined is not None:
                    return got, joined
                if control.signal.aborted:
                    return False, None
                pause = _LINE_POLL_S
                continue
            if control.signal.wait(pause):
                return False, None
            pause = min(pause * 2, _LINE_POLL_MAX_S)

    def _read_joined(
        self, log: EventLog, turn_id: str, mail: MailOps, hold: LeaseHold | None,
        control: TurnControl, mail_id: str, emit: bool,
    ) -> Generator[RunEvent, None, tuple[bool, ExecutionResult | None]]:
        """Follow turn ``turn_id`` of the log to its end (see :meth:`_wait_joined`), trying
        the lease (``hold``; None: held already) whenever it is quiet; returns (the lease is
        taken here, the joined result)."""
        taken: list[bool] = []

        def idle(_: object) -> bool:
            if control.signal.aborted:
                return True
            if hold is not None and self._first_in_line(mail, hold, mail_id):
                taken.append(True)
                return True
            return False

        own_id, last = control.run_id, -1
        joined = False
        try:
            for event in log.follow(turn_id, -1, idle=idle, live=False):
                if not joined:
                    joined = mailbox.joined_by(event, mail_id)
                    if not joined:
                        continue
                if isinstance(event, RunDone):
                    result = mailbox.committed_with(event, mail_id)
                    if result is not None:
                        control.run_id = turn_id
                        control.rewind_seq(event.seq)
                        return False, attrs.evolve(result, replayed=False, joined=True)
                    break
                if isinstance(event, RunFailed):
                    continue
                if emit:
                    control.run_id = turn_id  # this run reads that turn
                    last = event.seq
                    yield event
        except LoushoError:
            _log.warning("could not follow turn %s of the event log", turn_id, exc_info=True)
        control.run_id = own_id  # settled under the lease
        if last >= 0:
            control.rewind_seq(last + 1)
        return bool(taken), None

    def _first_state(
        self, control: TurnControl, msgs: tuple[Message, ...] | None
    ) -> TurnState | None:
        """The new turn's state when its first checkpoint may be written with the lease (in
        one transaction, when the cached transcript is still current and no turn pends):
        a plain new turn on a store that can, with nothing checked before its first write
        (no compaction, budget or async tool) and no input queued yet."""
        p, st = self._p, self._p.state
        if msgs is None or not st.loaded or st.repaired \
                or p.base.compaction is not None or self._limits is not None \
                or p.base.config.limits is not None or p.base.config.async_tools \
                or control.has_queued():
            return None
        return self._state(control, msgs)

    def _state(self, control: TurnControl, msgs: tuple[Message, ...]) -> TurnState:
        """The state of a new turn after the cached transcript."""
        n = len(self._p.state.messages)
        sid = self._p.id
        return TurnState(run_id=control.run_id, key=session_key(sid, n), session_id=sid,
                         turn_index=n, input=msgs)

    def _log_opener(
        self, control: TurnControl, msgs: tuple[Message, ...] | None
    ) -> mailbox.OpenLog | None:
        """How the mailbox opens this turn's event log when another process's input joins
        it (None: no log to open, or the turn writes one anyway)."""
        events = self._events
        if events is None or control.logged:
            return None
        p = self._p

        def open_log() -> tuple[Publisher, tuple[Message, ...]]:
            return events().begin(control.run_id, p.id, p.state.owner), msgs or ()

        return open_log

    def _new_turn(
        self, control: TurnControl, msgs: tuple[Message, ...], hold: LeaseHold | None,
        emit: bool,
    ) -> Generator[RunEvent, None, ExecutionResult]:
        """The play of ``msgs`` as a new turn after the cached transcript (the generator of
        :meth:`_play` itself: no layer of its own)."""
        return self._play(control, self._state(control, msgs), self._approve, hold, emit=emit,
                          resumed=False, last=True)

    def _pending(self) -> Checkpoint | None:
        """The checkpoint of the turn that would start now, if one pends."""
        p = self._p
        key = session_key(p.id, len(p.state.messages))
        try:
            return p.turn_store.load(key)
        except StoreCorruptError as exc:
            raise p.unreadable(exc, key) from exc

    def _finish_pending(
        self, cp: Checkpoint, control: TurnControl, hold: LeaseHold | None, *, last: bool
    ) -> Generator[RunEvent, None, ExecutionResult]:
        """Finish the pending turn ``cp`` (its events yielded only with ``emit_pending``:
        a takeover of a detached turn, whose first event is ``step.reset``)."""
        self._p.refuse_if_awaiting(cp)
        inner, state = resumed_turn(cp)
        unlink = link(control.signal, inner.abort)
        try:
            play = self._play(inner, state, None, hold, emit=self._emit_pending, resumed=True,
                              last=last)
            result: ExecutionResult
            if self._emit_pending:
                result = yield from play
            else:
                result = drive(play)
            return result
        finally:
            unlink()

    def _play(
        self,
        control: TurnControl,
        state: TurnState,
        approve: ApproveCallback | None,
        hold: LeaseHold | None,
        *,
        emit: bool,
        resumed: bool,
        last: bool,
        saved_first: bool = False,
    ) -> Generator[RunEvent, None, ExecutionResult]:
        p = self._p
        st = p.state
        writer = TurnWriter(p.turn_store, p.approvals, hold, fences=p.fences)
        writer.wrote = saved_first
        env = TurnEnv(writer=writer, approve=approve, session_limits=self._limits,
                      # (read only against a budget: counted only then)
                      session_used=st.used if self._limits is not None else _NOTHING_USED,
                      durable=p.checkpoints is not None,
                      saved_first=saved_first)
        committer = p.committer if p.checkpoints is not None else None

        sealed: list[tuple[ExecutionResult, ExecutionResult]] = []

        def commit(result: ExecutionResult) -> None:
            # only a user message with extra fields can claim a key (see _idempotency)
            keys = idem.claims(result.messages) if any(
                m.extra for m in result.messages if m.role == "user") else None
            if keys or control.logged:
                plain = result
                if keys:  # the keys claimed in the turn sealed in its commit: _idempotency
                    result = idem.seal(result, keys)
                if control.logged:  # which turn this is, for a takeover: _eventlog
                    result = seal_turn(result, state.run_id)
                sealed.append((plain, result))
            # (a turn that another process's input joined keeps the lease until its log
            # says it ended: that process reads the turn from the log, and would take the
            # lease and settle its input as replayed in between; see _wait_joined)
            _commit(p, result.messages, writer=writer, key=state.key, committer=committer,
                    hold=hold, release=last and control.join_log is None)

        turn = Turn(p.base.config, env, control, state, st.messages, emit=emit)
        result: ExecutionResult = yield from play(
            turn, resumed=resumed, commit=commit, resume_hint=_RESUME_HINT)
        if sealed and sealed[-1][0] is result:
            result = sealed[-1][1]
        paused = result.finish_reason == "awaiting-approval"
        if paused:
            with st.lock:
                st.awaiting = result.approval_id
        return result


_local_keys: weakref.WeakValueDictionary[tuple[str, str], TurnControl] = (
    weakref.WeakValueDictionary())
"""The keyed turns running in this process, by (session id, key): their events may not be
written to the log yet (the publisher writes from a thread of its own)."""


def note_keyed(session_id: str, key: str, control: TurnControl) -> None:
    """Say that ``control``'s turn, running in this process, is the turn of ``key``."""
    _local_keys[(session_id, key)] = control


def keyed_turn(log: EventLog, session_id: str, key: str) -> TurnHead | None:
    """The head of the session's running turn when it is the turn of idempotency key
    ``key`` (its ``run.start`` in the event log claims it), else None."""
    local = _local_keys.get((session_id, key))
    if local is not None:
        head = log.head(local.run_id)
        if head is not None and head.session_id == session_id and head.ended_at is None:
            return head
    head = log.latest(session_id)
    if head is None or head.ended_at is not None:
        return None
    try:
        first = log.first_event(head.turn_id)
    except Exception:
        _log.warning("could not read turn %s of the event log", head.turn_id, exc_info=True)
        return None
    if not isinstance(first, RunStart) or key not in idem.claims(first.input[:1]):
        return None
    return head


def _published(
    play: Generator[RunEvent, None, ExecutionResult], publisher: Publisher,
    control: TurnControl, emit: bool,
) -> Generator[RunEvent, None, ExecutionResult]:
    """``play`` writing each event to the event log (a keyed turn: a retry of its key
    attaches to it), yielding them only when the caller reads events. A failure is written
    as the caller's run reports it (``error``, then ``run.done``, with the same seqs)."""
    try:
        while True:
            try:
                event = next(play)
            except StopIteration as stop:
                result: ExecutionResult = stop.value
                return result
            publisher.publish(event)
            if emit:
                yield event
    except GeneratorExit:
        play.close()
        seq = control.next_seq()
        publisher.publish(RunDone(run_id=control.run_id, seq=seq, finish_reason="aborted",
                                  result=None))
        publisher.close()
        raise
    except BaseException as exc:
        seq = control.next_seq()
        publisher.publish(RunFailed(run_id=control.run_id, seq=seq, error=exc))
        publisher.publish(RunDone(run_id=control.run_id, seq=seq + 1, finish_reason="error",
                                  result=None))
        publisher.close()
        control.rewind_seq(seq)
        raise


def _publish_end(publisher: Publisher, control: TurnControl, result: ExecutionResult) -> None:
    """Write the turn's ``run.done`` to the log with the seq its caller's run gives it."""
    seq = control.next_seq()
    publisher.publish(RunDone(run_id=control.run_id, seq=seq,
                              finish_reason=result.finish_reason, result=result))
    publisher.close()
    control.rewind_seq(seq)


def _quiet_drop(mail: MailOps | None, mail_id: str, session_id: str) -> None:
    if mail is None:
        return
    try:
        mail.drop(mail_id, session_id)
    except Exception:
        _log.warning("could not drop mail %s", mail_id, exc_info=True)


def key_of(msgs: Sequence[Message] | None) -> str | None:
    """The idempotency key a turn's input claims (see :mod:`lousho_sync._idempotency`)."""
    extra = msgs[0].extra if msgs else None
    if not extra:  # the common input: no extra fields, no stamp to look into
        return None
    stamp = extra.get(idem.EXTRA)
    key = stamp.get("key") if isinstance(stamp, Mapping) else None
    return key if isinstance(key, str) else None


def _about_pending(exc: LoushoError, *, own_input: bool) -> None:
    """Say on ``exc`` that it is about the pending turn the call was finishing first, and
    (for ``send``/``stream``) that the call's own input was neither started nor stored."""
    exc.turn = "resumed"
    if own_input and exc.args and isinstance(exc.args[0], str) and _NOT_SENT not in exc.args[0]:
        exc.args = (f"{exc.args[0]} [{_NOT_SENT}]", *exc.args[1:])


def _commit(
    p: SessionParts,
    new: tuple[Message, ...],
    *,
    writer: TurnWriter,
    key: str | None,
    committer: Any,
    hold: LeaseHold | None,
    release: bool,
) -> None:
    """Store the turn ``new`` after the cached transcript and drop its checkpoint: the
    store's ``commit_turn`` (both in one transaction, giving the lease up with ``release``),
    else ``append`` then a checkpoint delete, else ``save`` of the whole transcript — with
    the conflict retry of SPEC §5."""
    st = p.state
    store = st.store
    history = st.messages
    fence = hold.fence() if hold is not None else None
    if st.repaired:  # the transcript with its repair, then the turn: one whole write
        kw = {"fence": fence} if fence is not None and p.fences[2] else {}
        store.save(st.id, [*history, *new], **kw)
        _log.info("session %s: stored the repair of its orphaned tool calls with the turn",
                  st.id)
        writer.delete(key)
        st.extend(history, new, st.current_revision())
        st.repaired = False
        return
    if committer is not None:
        with contextlib.suppress(StoreConflictError):  # then the slow path below
            revision = committer.commit_turn(
                st.id, new, expected_length=len(history), checkpoint_key=key,
                fence=fence, release=release and hold is not None,
            )
            if release and hold is not None:
                hold.released_by_commit()
            st.extend(history, new, revision)
            return
    kw = {"fence": fence} if fence is not None and p.fences[2] else {}
    appendable = st.appendable
    if appendable is not None:
        try:
            appendable.append(st.id, new, expected_length=len(history), **kw)
        except StoreConflictError as exc:
            _log.warning(
                "session %s: another writer stored %s messages where %s were expected; "
                "appending this turn after them",
                st.id, exc.actual_length, len(history),
            )
            history = _append_after_conflict(p, new, kw)
    else:
        store.save(st.id, [*history, *new], **kw)
    writer.delete(key)
    st.extend(history, new, st.current_revision())


def _append_after_conflict(
    p: SessionParts, new: tuple[Message, ...], kw: dict[str, Any]
) -> list[Message]:
    st = p.state
    appendable = st.appendable
    assert appendable is not None
    for _ in range(_CONFLICT_RETRIES):
        fresh = list(st.store.load(st.id) or [])
        try:
            appendable.append(st.id, new, expected_length=len(fresh), **kw)
        except StoreConflictError:
            continue
        return fresh
    raise StoreConflictError(
        f"session {st.id!r}: could not append the turn after {_CONFLICT_RETRIES} conflicts",
        session_id=st.id,
    )


# --- one-shot runs -----------------------------------------------------------------------------
def one_shot(
    cfg: TurnConfig,
    msgs: tuple[Message, ...],
    *,
    env: TurnEnv,
    control: TurnControl,
    session_id: str | None,
    signal: Signal | None,
) -> Callable[[bool], Generator[RunEvent, None, ExecutionResult]]:
    """The driver factory of a one-shot run of ``msgs`` from an empty history (an
    ``AgentRun`` starts it saying whether events are read)."""
    state = TurnState(run_id=control.run_id, key=one_shot_key(session_id, control.run_id),
                      session_id=session_id, input=msgs)
    hint = f"the run was kept: finish it with agent.resume({session_id!r})"

    def driver(emit: bool) -> Generator[RunEvent, None, ExecutionResult]:
        gen = play(Turn(cfg, env, control, state, emit=emit), resume_hint=hint)
        return gen if signal is None else play_linked(signal, control, gen)

    return driver


def resume_one_shot(
    cfg: TurnConfig, writer: TurnWriter, key: str, signal: Signal | None = None
) -> ExecutionResult | None:
    """Continue the one-shot run checkpointed under ``key`` (after a crash, or once its
    approvals are decided); None when there is none."""
    assert writer.checkpoints is not None
    cp = writer.checkpoints.load(key)
    if cp is None:
        return None
    control, state = resumed_turn(cp)
    turn = Turn(cfg, TurnEnv(writer=writer), control, state, emit=False)
    result: ExecutionResult = drive(play_linked(signal, control, play(turn, resumed=True)))
    return result


# --- the low-level entry point -------------------------------------------------------------
class AgentExecutor:
    """Runs one turn without a session (what sessions are built on)."""

    @staticmethod
    def execute(
        input: object,
        *,
        provider: Provider,
        instructions: str | None = None,
        tools: Sequence[Tool] = (),
        history: Sequence[Message] = (),
        session_id: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        approval_store: ApprovalStore | None = None,
        limits: Limits | None = None,
        signal: Signal | None = None,
        approve: ApproveCallback | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> ExecutionResult:
        """Run one turn over ``history``. With ``session_id`` and a ``checkpoint_store`` the
        turn is checkpointed under ``session_id``; an input of ``()`` with an existing
        checkpoint continues it (the resume path)."""
        cfg = TurnConfig(
            provider=provider,
            system=instructions,
            tools={t.name: t for t in tools},
            tool_specs=tuple(t.spec() for t in tools),
            settings=settings or {},
            limits=limits,
        )
        checkpoints = checkpoint_store if session_id is not None else None
        cp = checkpoints.load(session_id) if checkpoints is not None and session_id else None
        if cp is not None and input in ((), [], None):
            ctl, state = resumed_turn(cp)
            resumed = True
        else:
            ctl = TurnControl()
            state = TurnState(run_id=ctl.run_id, key=session_id, session_id=session_id,
                              input=to_messages(input))
            resumed = False
        env = TurnEnv(writer=TurnWriter(checkpoints, approval_store), approve=approve)
        turn = Turn(cfg, env, ctl, state, history, emit=False)
        result: ExecutionResult = drive(play_linked(signal, ctl, play(turn, resumed=resumed)))
        return result

