"""The session mailbox: turn policies across processes, written once above the stores.

A process whose ``"queue"``/``"steer"``/``"rollback"`` call (or ``abort_turn()``) meets a
turn that another process owns (the session's lease is held elsewhere) posts a mail to the
session's mailbox in the store (:mod:`lousho_sync.stores._mail`), then waits for the lease.

The owner registers its running turn here while it holds the lease. One watcher thread per
mailbox (per store object, per process; it stops after 2 s without a turn) takes the mail
of the registered turns when the store says there is some — a wake-up per post where the
store can push (:class:`~lousho_sync.stores._mail.MailPush`: Redis ``XREAD BLOCK``,
PostgreSQL ``NOTIFY``, the memory store), with a look every :data:`FALLBACK_S` anyway (a
lost wake-up only delays); else a nearly free check
(:meth:`~lousho_sync.stores._mail.MailOps.version`: SQLite ``PRAGMA data_version``, a
directory listing) every :data:`POLL_S` — and once when a turn is :data:`POLL_S` old (a
shorter turn costs no query). Exactly one process takes each mail and hands it to the
turn's :class:`~lousho_sync.control.TurnControl`, as an in-process caller would: ``offer``
(queue, steer: the turn's safe points apply it) or ``abort``. So the turn's own step loop
does not look at the mailbox at all: a plain turn pays one registration.

What became of a posted input is read from the transcript, never from the mailbox: the
input's first message claims a key (as an idempotency key does, see
:mod:`lousho_sync._idempotency`), every turn that applied claimed input is sealed with its
keys in its commit, and the poster — once it holds the lease, so the owner's turn is
committed, kept pending (and finished first) or dropped — finds its key in a committed
turn (``joined``) or runs its input as the next turn. Never lost, never applied twice.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable

import attrs

from . import _idempotency as idem
from ._eventlog import Publisher
from .codec import message_from_dict, message_to_dict
from .control import TurnControl
from .events import Event, InputApplied, InputQueued, RunDone, RunFailed, RunStart
from .messages import Message
from .results import ExecutionResult
from .stores._lease import owner_is_dead
from .stores._mail import Mail, MailOps, MailPush

__all__ = ["FALLBACK_S", "LINE_PATIENCE_S", "POLL_S", "OpenLog", "committed_with",
           "end_join_log", "first_in_line", "joined_by", "mail_key", "post_abort",
           "post_input", "register"]

_log = logging.getLogger(__name__)

POLL_S = 0.005
"""How often a process with a registered turn checks its mailbox for new mail on a store
that cannot tell (SQLite, files), and how old a turn is when its mailbox is first looked at
(seconds)."""

FALLBACK_S = 0.5
"""How often a process with a registered turn looks at its mailbox anyway on a store that
wakes it (Redis, PostgreSQL, memory): a lost wake-up only delays mail (seconds)."""

LINE_PATIENCE_S = 60.0
"""How long a waiting poster holds the posters after it back (seconds): next turns run in
arrival order, unless a poster waited this long (its process may be gone on another host,
where its death cannot be told)."""

_PREFIX = "mail:"
_IDLE_EXIT_S = 2.0


def mail_key() -> str:
    """A new mail id, also the key its input claims."""
    return f"{_PREFIX}{uuid.uuid4().hex}"


def post_input(ops: MailOps, session_id: str, msgs: tuple[Message, ...], *, steer: bool,
               mail_id: str, poster: str) -> None:
    """Put ``msgs`` (already claiming ``mail_id``) in the session's mailbox; ``poster`` is
    the lease owner string of the caller (it waits in line for the lease)."""
    data = json.dumps([message_to_dict(m) for m in msgs])
    ops.post(session_id, mail_id, "steer" if steer else "queue", data, time.time(), poster)


def first_in_line(ops: MailOps, session_id: str, mail_id: str) -> bool:
    """Whether the poster of ``mail_id`` may take the lease now: every input posted to the
    session before it has had its turn — its poster took the lease (and dropped its mail),
    died (its mail is dropped here, never applied), or has waited longer than
    :data:`LINE_PATIENCE_S` (then it no longer holds later posters back)."""
    now = time.time()
    for m in ops.line(session_id):
        if m.mail_id == mail_id:
            return True
        if m.kind == "abort" or now - m.posted_at > LINE_PATIENCE_S:
            continue
        if m.poster and owner_is_dead(m.poster):
            _log.info("session %s: dropped the input of a sender that died before it was "
                      "applied (mail %s)", session_id, m.mail_id)
            ops.drop(m.mail_id, session_id)
            continue
        return False
    return True


def post_abort(ops: MailOps, session_id: str, reason: object, turn_id: str | None,
               key: str | None = None) -> str:
    """Ask the session's running turn (or ``turn_id``) to abort; returns the mail id.
    ``key``: the idempotency key of the caller (a keyed ``"rollback"``): a turn that took
    that key (its own input's, or joined input's) is its own, and is not aborted."""
    mail_id = mail_key()
    data = json.dumps({"reason": None if reason is None else str(reason), "turn_id": turn_id,
                       "key": key})
    ops.post(session_id, mail_id, "abort", data, time.time())
    return mail_id


OpenLog = Callable[[], tuple[Publisher, tuple[Message, ...]]]
"""Opens the event log of the registered turn: its publisher, and the turn's input (for the
log's ``run.start``)."""


def register(ops: MailOps, session_id: str, control: TurnControl,
             open_log: OpenLog | None = None) -> Callable[[], None]:
    """Deliver ``session_id``'s mail to ``control`` until the returned function is called.
    ``open_log``: how the turn's events start going to the event log when input from
    another process joins it (a turn that writes no log of its own: ``control.logged``
    False), so that process reads the turn from its join on (:func:`joined_by`); the turn
    ends it with :func:`end_join_log`."""
    return _watcher(ops).add(ops, session_id, control, open_log)


_log_lock = threading.Lock()  # opening and ending a joined turn's log (see _open_join_log)


def _open_join_log(control: TurnControl, session_id: str, open_log: OpenLog) -> None:
    """Have ``control``'s turn write its events to the event log from now on (once; never
    after :func:`end_join_log`): ``run.start``, then every event the turn makes."""
    if control.logged:
        return  # its events go to the log already (start(), a keyed call, a takeover)
    with _log_lock:
        if control.join_log is not None or control.join_log_closed:
            return
        publisher, input = open_log()
        publisher.publish(RunStart(run_id=control.run_id, seq=control.next_seq(),
                                   session_id=session_id, input=input))
        control.join_log = publisher
        control.sink = publisher.publish


def end_join_log(control: TurnControl, result: ExecutionResult | None,
                 error: BaseException | None) -> None:
    """End the event log :func:`register`'s ``open_log`` opened for ``control``'s turn, if
    any: ``run.done`` with ``result`` (or ``error`` then ``run.done``), with the seqs the
    turn's caller's run gives them."""
    with _log_lock:
        control.join_log_closed = True
        publisher: Publisher | None = control.join_log
        control.join_log = control.sink = None
    if publisher is None:
        return
    seq = control.next_seq()
    if error is not None and not isinstance(error, GeneratorExit):
        publisher.publish(RunFailed(run_id=control.run_id, seq=seq, error=error))
        publisher.publish(RunDone(run_id=control.run_id, seq=seq + 1, finish_reason="error",
                                  result=None))
    elif result is None:
        publisher.publish(RunDone(run_id=control.run_id, seq=seq, finish_reason="aborted",
                                  result=None))
    else:
        publisher.publish(RunDone(run_id=control.run_id, seq=seq,
                                  finish_reason=result.finish_reason, result=result))
    try:
        publisher.close()
    finally:
        control.rewind_seq(seq)


def joined_by(event: Event, mail_id: str) -> bool:
    """Whether ``event`` is the input of mail ``mail_id`` joining the turn (queued or
    applied): where the poster's view of that turn starts."""
    return isinstance(event, InputQueued | InputApplied) and mail_id in idem.claims(event.input)


def committed_with(event: Event, mail_id: str) -> ExecutionResult | None:
    """The result of a turn's ``run.done`` when the turn was committed with the input of
    mail ``mail_id`` in it (``stop``/``length``: always committed), else None."""
    if not isinstance(event, RunDone) or event.result is None \
            or event.finish_reason not in ("stop", "length"):
        return None
    return event.result if mail_id in idem.claims(event.result.messages) else None


@attrs.define(eq=False)
class _Entry:
    control: TurnControl
    open_log: OpenLog | None
    since: float  # wall clock, when registered
    at: float  # monotonic, when registered
    looked: bool = False  # its mailbox was looked at since it registered


class _Watcher:
    """One thread per mailbox: while turns are registered, takes their mail when the store
    says some was posted (:class:`~lousho_sync.stores._mail.MailPush`: a wake-up per post;
    else :meth:`~lousho_sync.stores._mail.MailOps.version` every :data:`POLL_S`) and
    delivers it. Thread-safe: ``_cond`` guards every field but ``_push``."""

    def __init__(self, ops: MailOps) -> None:
        # the store is held by the thread only, while it runs: a watcher (kept per store
        # object in a weak mapping) never keeps its store alive
        self._push = isinstance(ops, MailPush)
        self._cond = threading.Condition()
        self._turns: dict[str, _Entry] = {}
        self._thread: threading.Thread | None = None
        self._woken: set[str] = set()
        self._woken_all = False
        self._wake_at = 0.0  # when the thread looks at the turns next (monotonic)

    def add(self, ops: MailOps, session_id: str, control: TurnControl,
            open_log: OpenLog | None) -> Callable[[], None]:
        # a turn is first looked at one POLL_S after it registered, so a turn shorter than
        # that costs no query at all; the thread is woken only when it would look later
        entry = _Entry(control, open_log, time.time(), time.monotonic())
        with self._cond:
            self._turns[session_id] = entry
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, args=(ops,),
                                                name="lousho-mailbox", daemon=True)
                self._thread.start()
            elif self._wake_at > entry.at + POLL_S:
                self._cond.notify_all()

        def remove() -> None:
            with self._cond:
                if self._turns.get(session_id) is entry:
                    del self._turns[session_id]

        return remove

    def _wake(self, session_id: str | None) -> None:
        with self._cond:
            if session_id is None:
                self._woken_all = True
            elif session_id in self._turns:
                self._woken.add(session_id)
            else:
                return
            self._cond.notify_all()

    def _loop(self, ops: MailOps) -> None:
        stop = ops.subscribe(self._wake) if isinstance(ops, MailPush) else None
        try:
            self._watch(ops)
        finally:
            if stop is not None:
                stop()

    def _watch(self, ops: MailOps) -> None:
        every = FALLBACK_S if self._push else POLL_S
        version: object = None
        check_at = 0.0  # the next full look (monotonic)
        idle_since = time.monotonic()
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if not self._turns:
                        if now - idle_since > _IDLE_EXIT_S:  # no turn for a while: stop
                            self._thread = None
                            return
                        self._wake_at = now + _IDLE_EXIT_S
                        self._cond.wait(_IDLE_EXIT_S)
                        continue
                    idle_since = now
                    ready = {sid for sid, e in self._turns.items()
                             if not e.looked and now - e.at >= POLL_S}
                    if self._woken_all:
                        ready.update(sid for sid, e in self._turns.items()
                                     if now - e.at >= POLL_S or e.looked)
                    ready.update(self._woken)
                    self._woken.clear()
                    self._woken_all = False
                    full = now >= check_at
                    if ready or full:
                        break
                    self._wake_at = min([check_at, *(e.at + POLL_S for e in
                                                     self._turns.values() if not e.looked)])
                    self._cond.wait(max(self._wake_at - now, 0.0))
                for sid in ready:
                    self._turns[sid].looked = True
                every_sid = list(self._turns)
            try:
                if full:
                    check_at = now + every
                    if self._push:  # the fallback of lost wake-ups: look
                        ready.update(every_sid)
                    else:
                        seen = ops.version()
                        if seen != version:
                            version = seen
                            ready.update(every_sid)
                if not ready:
                    continue
                taken_at = time.monotonic()
                mail = ops.take(sorted(ready))
            except Exception:
                _log.warning("could not read the session mailbox", exc_info=True)
                time.sleep(POLL_S * 20)
                continue
            for m in mail:
                self._deliver(ops, m, taken_at)

    def _deliver(self, ops: MailOps, m: Mail, taken_at: float) -> None:
        with self._cond:
            entry = self._turns.get(m.session_id)
        if entry is not None and entry.at > taken_at:
            entry = None  # the turn it was taken for ended (another one runs now)
        if m.kind == "abort":
            _drop(ops, m)  # done with once taken, whether or not its turn still ran
            try:
                data = json.loads(m.data)
                turn_id, reason, key = data.get("turn_id"), data.get("reason"), data.get("key")
            except Exception:
                _log.warning("dropped an unreadable abort %s of session %s", m.mail_id,
                             m.session_id, exc_info=True)
                return
            if entry is not None and m.posted_at >= entry.since - 1.0 \
                    and turn_id in (None, entry.control.run_id) \
                    and (key is None or key not in entry.control.keys):
                entry.control.abort(reason or "aborted from another process")
            return
        if entry is None:
            return  # the poster runs its input itself
        if m.poster and owner_is_dead(m.poster):
            # its sender died before it was applied: nobody learns of it, so it is not
            # stored (a retry of that request would store it twice)
            _log.info("session %s: dropped the input of a sender that died before it was "
                      "applied (mail %s)", m.session_id, m.mail_id)
            _drop(ops, m)
            return
        try:
            msgs = tuple(message_from_dict(d) for d in json.loads(m.data))
        except Exception:
            _log.warning("dropped an unreadable mail %s of session %s", m.mail_id,
                         m.session_id, exc_info=True)
            return
        if entry.open_log is not None:  # the poster reads the turn from its join on
            try:
                _open_join_log(entry.control, m.session_id, entry.open_log)
            except Exception:
                _log.warning("could not open the event log of turn %s for joined input",
                             entry.control.run_id, exc_info=True)
        # a retry's input (its idempotency key already in the turn) is not applied twice
        entry.control.offer(msgs, steer=m.kind == "steer", keys=tuple(idem.claims(msgs[:1])))


def _drop(ops: MailOps, m: Mail) -> None:
    try:
        ops.drop(m.mail_id, m.session_id)
    except Exception:
        _log.warning("could not drop mail %s", m.mail_id, exc_info=True)


_watchers: weakref.WeakKeyDictionary[object, _Watcher] = weakref.WeakKeyDictionary()
_by_id: dict[int, _Watcher] = {}
_lock = threading.Lock()


def _watcher(ops: MailOps) -> _Watcher:
    with _lock:
        try:
            w = _watchers.get(ops)
            if w is None:
                w = _watchers[ops] = _Watcher(ops)
        except TypeError:
            w = _by_id.get(id(ops))
            if w is None:
                w = _by_id[id(ops)] = _Watcher(ops)
        return w
