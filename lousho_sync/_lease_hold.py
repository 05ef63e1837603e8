"""LeaseHold: this process's hold on one session's store lease.

A hold is taken before a turn's first write and kept through its commit — across a resumed
turn and the new turn of the same call, and across approval continuations. A heartbeat
renews it every ``ttl_s / 3``; a renewal that fails (the store says another owner has it, or
the store cannot be reached for longer than the TTL) marks the hold lost, and the turn's
next write raises :class:`~lousho_sync.errors.LeaseLostError` before touching the store. A
write that finds the last renewal a whole TTL old (the process was stopped) renews first.
Stores that support fencing also refuse, atomically, a write carrying an older token than
the newest acquisition (:class:`~lousho_sync.records.Fence`), which closes the window
between that check and the write. One daemon thread renews every held lease of the
process on time.
Only the hold's owner releases it (directly, or by asking a commit to release it). A release
that fails (the store is away) is retried in the background until it succeeds, the lease
would have expired anyway, or the same owner acquires the session again: an alive, idle
holder never keeps others waiting out the whole TTL once the store is back.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from .errors import LeaseLostError, SessionBusyError
from .records import Checkpoint, Fence
from .signal import Signal
from .stores.base import Leased, LeaseSaving

__all__ = ["LEASE_POLL_S", "LeaseHold"]

_log = logging.getLogger(__name__)

LEASE_POLL_S = 0.25
"""How long one acquire attempt waits before the abort signal is looked at again."""

RELEASE_RETRY_S = 1.0
"""How often a failed release is tried again (at most; ``ttl_s / 3`` when shorter)."""


class _ReleaseRetry:
    """Retries a failed release on the heartbeat thread until it succeeds or the lease has
    expired by itself. Thread-safe: ``lock`` is held across each attempt, so :meth:`stop`
    returns only once no attempt is running (an acquisition by the same owner then cannot
    be released by a late retry)."""

    def __init__(self, store: Leased, session_id: str, owner: str, expires_at: float) -> None:
        self.store, self.id, self.owner = store, session_id, owner
        self.expires_at = expires_at
        self.lock = threading.Lock()
        self.done = False
        self.cancel: Callable[[], None] | None = None

    def __call__(self) -> None:
        with self.lock:
            if not self.done and time.monotonic() < self.expires_at:
                try:
                    self.store.release_lease(self.id, owner=self.owner)
                except Exception:
                    return  # the store is still away: the next beat tries again
                _log.info("session %s: released its lease once the store was back", self.id)
            self.done = True
        self._forget()  # (also when stopped before the heartbeat knew it)

    def stop(self) -> None:
        with self.lock:
            self.done = True
        self._forget()

    def _forget(self) -> None:
        if self.cancel is not None:
            self.cancel()
        with _retries_lock:
            if _retries.get(self.key) is self:
                del _retries[self.key]

    @property
    def key(self) -> tuple[int, str, str]:
        return (id(self.store), self.id, self.owner)


_retries: dict[tuple[int, str, str], _ReleaseRetry] = {}
"""The release retries running, by (store, session id, owner)."""
_retries_lock = threading.Lock()


def _stop_release_retry(store: Leased, session_id: str, owner: str) -> None:
    with _retries_lock:
        retry = _retries.pop((id(store), session_id, owner), None)
    if retry is not None:
        retry.stop()


class LeaseHold:
    """One acquisition of a session's lease by ``owner``.

    Thread-safe: ``_lock`` guards ``_token``, ``_lost`` and ``_held``; the heartbeat thread
    renews while the turn's thread writes.
    """

    __slots__ = ("_cancel", "_held", "_last_ok", "_lock", "_lost", "_token", "id", "owner",
                 "saved", "store", "ttl_s")

    def __init__(self, store: Leased, id: str, owner: str, ttl_s: float) -> None:
        self.store = store
        self.id = id
        self.owner = owner
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._token: int | None = None
        self._held = False
        self._lost = False
        self._last_ok = 0.0
        self._cancel: Callable[[], None] | None = None
        self.saved = False  # the last acquire saved the turn's first checkpoint with it

    def acquire(
        self,
        *,
        wait: bool,
        signal: Signal | None = None,
        first: tuple[LeaseSaving, Checkpoint, object] | None = None,
    ) -> bool:
        """Take the lease. ``wait=False``: one attempt, SessionBusyError when another owner
        holds it. ``wait=True``: poll until taken; False when ``signal`` aborts first.

        ``first`` (a store's lease-with-checkpoint, the turn's first checkpoint, the cached
        transcript's revision): the first attempt also saves that checkpoint, in the same
        transaction, when the revision still holds and no turn pends; ``saved`` tells.
        """
        store = self.store
        _stop_release_retry(store, self.id, self.owner)  # never release what is taken now
        got: int | None = None
        self.saved = False
        if first is not None:
            saving, checkpoint, revision = first
            taken = saving.take_lease_saving(self.id, owner=self.owner, ttl_s=self.ttl_s,
                                             checkpoint=checkpoint, revision=revision)
            if taken is not None:
                got, self.saved = taken
        if got:
            pass
        elif not wait:
            got = store.acquire_lease(self.id, owner=self.owner, ttl_s=self.ttl_s, wait_s=0.0)
            if not got:
                raise SessionBusyError(
                    f"session {self.id!r} is running a turn in another process",
                    session_id=self.id,
                )
        else:
            while True:
                got = store.acquire_lease(self.id, owner=self.owner, ttl_s=self.ttl_s,
                                          wait_s=LEASE_POLL_S)
                if got:
                    break
                if signal is not None and signal.aborted:
                    return False
        with self._lock:
            # stores that predate fencing answer True; fenced ones the acquisition's token
            self._token = got if type(got) is int else None
            self._held = True
            self._lost = False
            self._last_ok = time.monotonic()
        self._cancel = _HEARTBEAT.add(self._renew, self.ttl_s / 3)
        return True

    def _renew(self) -> None:
        try:
            ok = bool(self.store.renew_lease(self.id, owner=self.owner, ttl_s=self.ttl_s))
        except Exception:
            with self._lock:
                late = time.monotonic() - self._last_ok >= self.ttl_s
                if late and self._held:
                    self._lost = True
            _log.warning("session %s: could not renew its lease%s", self.id,
                         " (it has expired: the turn stops before its next write)" if late
                         else "", exc_info=True)
            return
        with self._lock:
            if ok:
                self._last_ok = time.monotonic()
            elif self._held:
                self._lost = True
        if not ok:
            _log.warning("session %s: its lease was taken over by another owner; the turn "
                         "stops before its next write", self.id)

    @property
    def token(self) -> int | None:
        """The fencing token of this acquisition (None for stores without fencing)."""
        return self._token

    def fence(self) -> Fence | None:
        """The fence a write carries; raises LeaseLostError once the hold is lost.

        A hold not renewed for a whole TTL (this process was stopped or starved) renews
        now, before the write: another owner may have taken the lease meanwhile.
        """
        if self._held and time.monotonic() - self._last_ok >= self.ttl_s:
            self._renew()
        with self._lock:
            if self._lost:
                raise LeaseLostError(
                    f"session {self.id!r}: this process lost the session's lease (a renewal "
                    "failed or another process took it over); the turn stopped before writing "
                    "and its checkpoint is left for the new holder",
                    session_id=self.id,
                )
            token = self._token
        return None if token is None else Fence(self.id, token)

    def released_by_commit(self) -> None:
        """The commit this owner asked to release the lease did so."""
        self._stop(release=False)

    def release(self) -> None:
        """Stop renewing and release the lease (idempotent)."""
        self._stop(release=True)

    def _stop(self, *, release: bool) -> None:
        with self._lock:
            held, self._held = self._held, False
        cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()
        if held and release:
            try:
                self.store.release_lease(self.id, owner=self.owner)
            except Exception:
                _log.warning("session %s: could not release its lease; trying again until the "
                             "store is back", self.id, exc_info=True)
                self._retry_release()

    def _retry_release(self) -> None:
        with self._lock:
            expires_at = self._last_ok + self.ttl_s
        retry = _ReleaseRetry(self.store, self.id, self.owner, expires_at)
        with _retries_lock:
            old = _retries.get(retry.key)
            _retries[retry.key] = retry
        if old is not None:
            old.stop()
        retry.cancel = _HEARTBEAT.add(retry, min(RELEASE_RETRY_S, self.ttl_s / 3))

    def __enter__(self) -> LeaseHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Heartbeat:
    """Calls registered functions every ``interval_s`` until cancelled.

    Thread-safe: one condition guards the schedule; the thread starts on first use.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, float, Callable[[], object]]] = []
        self._live: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = 0.0  # when the thread will look at the schedule next (monotonic)

    def add(self, fn: Callable[[], object], interval_s: float) -> Callable[[], None]:
        """Run ``fn`` every ``interval_s`` seconds; returns a cancel function."""
        token = next(self._ids)
        with self._cond:
            self._live.add(token)
            due = time.monotonic() + interval_s
            heapq.heappush(self._heap, (due, token, interval_s, fn))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="lousho-heartbeat",
                                                daemon=True)
                self._thread.start()
            elif due < self._wake_at:  # wake the thread only when it would look too late
                self._cond.notify()

        def cancel() -> None:
            with self._cond:
                self._live.discard(token)
                # its entry goes now: a cancelled renewal keeps nothing (its store) alive
                heap = self._heap
                for i, entry in enumerate(heap):
                    if entry[1] == token:
                        heap[i] = heap[-1]
                        heap.pop()
                        heapq.heapify(heap)
                        break

        return cancel

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][1] not in self._live:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._wake_at = time.monotonic() + 5.0
                        self._cond.wait(5.0)
                        continue
                    due = self._heap[0][0] - time.monotonic()
                    if due <= 0:
                        _, token, interval, fn = heapq.heappop(self._heap)
                        again = (time.monotonic() + interval, token, interval, fn)
                        heapq.heappush(self._heap, again)
                        break
                    self._wake_at = time.monotonic() + due
                    self._cond.wait(due)
            try:
                fn()
            except Exception:
                _log.warning("lease renewal failed", exc_info=True)
            del fn  # a waiting thread keeps nothing of the last renewal alive


_HEARTBEAT = _Heartbeat()
"""One daemon thread that renews every held lease on time."""
