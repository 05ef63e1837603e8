"""The session mailbox: turn policies across processes, written once above the stores.

A process whose ``"queue"``/``"steer"``/``"rollback"`` call (or ``abort_turn()``) meets a
turn that another process owns (the session's lease is held elsewhere) posts a mail to the
session's mailbox in the store (:mod:`lousho_sync.stores._mail`), then waits for the lease.

The owner registers its running turn here while it holds the lease. One watcher thread per
mailbox (per store object, per process; it stops after 2 s without a turn) notices new mail
at its wake-ups — a nearly free check (:meth:`~lousho_sync.stores._mail.MailOps.version`)
every :data:`POLL_S`, for turns registered at least that long (a shorter turn costs no
query) — takes it (exactly one process gets each mail) and hands it to the turn's
:class:`~lousho_sync.control.TurnControl`, as an in-process caller would: ``offer`` (queue,
steer: the turn's safe points apply it) or ``abort``. So the turn's own step loop does not
look at the mailbox at all: a plain turn pays one registration.

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

from .codec import message_from_dict, message_to_dict
from .control import TurnControl
from .messages import Message
from .stores._mail import Mail, MailOps

__all__ = ["POLL_S", "mail_key", "post_abort", "post_input", "register"]

_log = logging.getLogger(__name__)

POLL_S = 0.005
"""How often a process with a registered turn checks its mailbox for new mail (seconds)."""

_PREFIX = "mail:"
_IDLE_EXIT_S = 2.0


def mail_key() -> str:
    """A new mail id, also the key its input claims."""
    return f"{_PREFIX}{uuid.uuid4().hex}"


def post_input(ops: MailOps, session_id: str, msgs: tuple[Message, ...], *, steer: bool,
               mail_id: str) -> None:
    """Put ``msgs`` (already claiming ``mail_id``) in the session's mailbox."""
    data = json.dumps([message_to_dict(m) for m in msgs])
    ops.post(session_id, mail_id, "steer" if steer else "queue", data, time.time())
    _watcher(ops).poke()


def post_abort(ops: MailOps, session_id: str, reason: object, turn_id: str | None) -> str:
    """Ask the session's running turn (or ``turn_id``) to abort; returns the mail id."""
    mail_id = mail_key()
    data = json.dumps({"reason": None if reason is None else str(reason), "turn_id": turn_id})
    ops.post(session_id, mail_id, "abort", data, time.time())
    _watcher(ops).poke()
    return mail_id


def register(ops: MailOps, session_id: str, control: TurnControl) -> Callable[[], None]:
    """Deliver ``session_id``'s mail to ``control`` until the returned function is called."""
    return _watcher(ops).add(session_id, control)


class _Watcher:
    """One thread per mailbox: while turns are registered, checks for new mail every
    :data:`POLL_S` and delivers it."""

    def __init__(self, ops: MailOps) -> None:
        self._ops = ops
        self._cond = threading.Condition()
        self._turns: dict[str, tuple[TurnControl, float, float]] = {}
        self._thread: threading.Thread | None = None
        self._poked = False

    def add(self, session_id: str, control: TurnControl) -> Callable[[], None]:
        # no wake-up here: a turn is first looked at one POLL_S after it registered, so a
        # turn shorter than that costs no query at all
        entry = (control, time.time(), time.monotonic())
        with self._cond:
            self._turns[session_id] = entry
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="lousho-mailbox",
                                                daemon=True)
                self._thread.start()

        def remove() -> None:
            with self._cond:
                if self._turns.get(session_id) is entry:
                    del self._turns[session_id]

        return remove

    def poke(self) -> None:
        with self._cond:
            self._poked = True
            self._cond.notify_all()

    def _loop(self) -> None:
        version = -1
        idle_since = time.monotonic()
        while True:
            with self._cond:
                if not self._poked:
                    self._cond.wait(POLL_S)
                poked, self._poked = self._poked, False
                now_m = time.monotonic()
                if self._turns:
                    idle_since = now_m
                elif now_m - idle_since > _IDLE_EXIT_S:  # no turn for a while: stop
                    self._thread = None
                    return
                sessions = [sid for sid, (_, _, at) in self._turns.items()
                            if poked or now_m - at >= POLL_S]
            if not sessions:
                continue
            try:
                seen = self._ops.version()
                if seen == version and not poked:
                    continue
                version = seen
                taken_at = time.monotonic()
                mail = self._ops.take(sessions)
            except Exception:
                _log.warning("could not read the session mailbox", exc_info=True)
                time.sleep(POLL_S * 20)
                continue
            for m in mail:
                self._deliver(m, taken_at)

    def _deliver(self, m: Mail, taken_at: float) -> None:
        with self._cond:
            entry = self._turns.get(m.session_id)
        if entry is None or entry[2] > taken_at:
            return  # the turn it was taken for ended: the poster runs its input itself
        control, since, _ = entry
        try:
            data = json.loads(m.data)
            if m.kind == "abort":
                turn_id = data.get("turn_id")
                if m.posted_at >= since - 1.0 and turn_id in (None, control.run_id):
                    control.abort(data.get("reason") or "aborted from another process")
                return
            msgs = tuple(message_from_dict(d) for d in data)
        except Exception:
            _log.warning("dropped an unreadable mail %s of session %s", m.mail_id,
                         m.session_id, exc_info=True)
            return
        control.offer(msgs, steer=m.kind == "steer")


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
