"""The lease rules, once: argument checks, polling, dead-owner takeover, fence tokens and
the LeaseLostError of a refused write. A backend writes :class:`LeaseOps`."""

from __future__ import annotations

import logging
from typing import Protocol

from ...codec import dumps_checkpoint
from ...errors import ConfigError, LeaseLostError
from ...ids import validate_session_id
from ...records import Checkpoint, Fence
from .._lease import owner_is_dead, poll_until
from .backend import Backend

__all__ = [
    "LeaseOps", "LeaseRules", "LeaseSavingOps", "LeaseSavingRules", "check_owner", "check_ttl",
    "fence_token_of", "refused",
]

_log = logging.getLogger("lousho_sync.stores")



def check_ttl(ttl_s: float) -> None:
    """ConfigError unless a lease's ``ttl_s`` is > 0."""
    if not ttl_s > 0:
        raise ConfigError(f"a lease's ttl_s must be > 0 seconds, got {ttl_s!r}")


def check_owner(owner: str) -> None:
    """ConfigError unless a lease ``owner`` is a non-empty str."""
    if type(owner) is not str or not owner:
        raise ConfigError(f"a lease's owner must be a non-empty str, got {owner!r}")


def fence_token_of(fence: Fence | None, id: str | None) -> int:
    """The token of ``fence`` for a write about session ``id`` (0: no fence, no check).

    ConfigError when the fence names another session than ``id`` (None: any) or its token
    is not an int >= 1.
    """
    if fence is None:
        return 0
    if not isinstance(fence, Fence) or type(fence.token) is not int or fence.token < 1 or (
        id is not None and fence.session_id != id
    ):
        raise ConfigError(
            f"a write about session {id!r} was given fence {fence!r}: a fence is a Fence of "
            "the same session with the token acquire_lease returned (>= 1)"
        )
    return fence.token

class LeaseOps(Protocol):
    """A backend's lease primitives, each one transaction or one script."""

    @property
    def backend(self) -> Backend:
        """The connection the primitives run on."""
        ...

    def take(self, id: str, owner: str, ttl_s: float) -> int | str:
        """Take the lease when free, expired or ``owner``'s already: the new fence token
        (>= 1); else the holder's owner string ("" when it cannot tell)."""
        ...

    def take_over(self, id: str, holder: str, owner: str, ttl_s: float) -> int:
        """Take the lease from ``holder`` (a dead process): the new token, or 0 when
        ``holder`` no longer holds it."""
        ...

    def renew(self, id: str, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease by ``ttl_s`` from now; False when ``owner`` lost it."""
        ...

    def release(self, id: str, owner: str) -> None:
        """Release the lease if ``owner`` holds it (the token stays)."""
        ...

    def newest(self, id: str) -> int:
        """The newest token handed out for ``id`` (0 when none)."""
        ...

    def holder(self, id: str) -> str:
        """The owner holding an unexpired lease of ``id`` ("" when none), read only."""
        ...


def refused(backend: Backend, id: str, newest: int, token: int) -> LeaseLostError:
    """The LeaseLostError for a write of session ``id`` under ``token`` refused because
    ``newest`` was handed out since."""
    return LeaseLostError(
        f"write to session {id!r} {backend.where} refused: it was made under lease token "
        f"{token}, but token {newest} was handed out since: another process took over the "
        "turn",
        **backend.place(id),
    )


def check_newest(backend: Backend, id: str, newest: int, token: int) -> None:
    """LeaseLostError when a write under ``token`` (0: unfenced) meets ``newest``."""
    if token and newest > token:
        raise refused(backend, id, newest, token)


class LeaseRules:
    """``acquire_lease``, ``renew_lease``, ``release_lease`` and ``fence_token`` over the
    primitives in ``_leases``."""

    _leases: LeaseOps

    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> int | None:
        """Take the session's lease for ``ttl_s`` seconds: the new fence token (greater than
        every token handed out before for ``id``, also when ``owner`` held it), or None
        when not taken within ``wait_s`` seconds.

        Taken when free, expired, already ``owner``'s, or held by a dead process on this
        host; otherwise polled until ``wait_s`` seconds pass.
        """
        validate_session_id(id)
        check_owner(owner)
        check_ttl(ttl_s)
        token = self._try_acquire(id, owner, ttl_s)  # the common case: free, no polling
        if token:
            return token
        got: list[int] = []

        def attempt() -> bool:
            token = self._try_acquire(id, owner, ttl_s)
            if token:
                got.append(token)
            return bool(token)

        return got[0] if poll_until(attempt, wait_s) else None

    def _try_acquire(self, id: str, owner: str, ttl_s: float) -> int:
        ops = self._leases
        taken = ops.take(id, owner, ttl_s)
        if isinstance(taken, int):
            return taken
        if not taken or not owner_is_dead(taken):
            return 0
        token = ops.take_over(id, taken, owner, ttl_s)
        if token:
            _log.info("session %s: took over the lease of dead owner %s", id, taken)
        return token

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease by ``ttl_s`` from now; False when ``owner`` lost it."""
        validate_session_id(id)
        check_owner(owner)
        check_ttl(ttl_s)
        return self._leases.renew(id, owner, ttl_s)

    def release_lease(self, id: str, *, owner: str) -> None:
        """Release the lease if ``owner`` holds it (otherwise do nothing); the fence token
        stays."""
        validate_session_id(id)
        check_owner(owner)
        self._leases.release(id, owner)

    def fence_token(self, id: str) -> int:
        """The newest fence token handed out for ``id`` (0 when none)."""
        validate_session_id(id)
        return self._leases.newest(id)

    def lease_held(self, id: str) -> bool:
        """Whether a live owner holds the lease of ``id`` now: a read that changes nothing
        (no acquisition, no fence token). A lease of a dead process on this host counts as
        not held (the next acquirer takes it over)."""
        validate_session_id(id)
        holder = self._leases.holder(id)
        return bool(holder) and not owner_is_dead(holder)


class LeaseSavingOps(LeaseOps, Protocol):
    """Lease primitives whose take can carry a turn's first checkpoint (one transaction)."""

    def take_saving(self, id: str, owner: str, ttl_s: float, key: str, text: str,
                    expected: object) -> tuple[int, bool] | str:
        """``take``, and in the same transaction, once taken, write checkpoint ``text``
        under ``key`` when the session's revision is still ``expected`` and no checkpoint
        is stored under ``key``: (the new token, whether written); else the holder."""
        ...


class LeaseSavingRules(LeaseRules):
    """The lease rules and ``take_lease_saving``: a turn's lease and its first checkpoint
    in one write transaction, over ``_leases`` (a backend offering :class:`LeaseSavingOps`)."""

    _leases: LeaseSavingOps

    def take_lease_saving(
        self, id: str, *, owner: str, ttl_s: float, checkpoint: Checkpoint, revision: object
    ) -> tuple[int, bool] | None:
        """One attempt, no wait, no takeover: take the session's lease and, in the same
        transaction, save ``checkpoint`` (fenced by the new token) when the transcript's
        revision is still ``revision`` (the caller's cached one) and no checkpoint is
        stored under its key (no turn pends). (the new token, whether it was saved), or None
        when another owner holds the lease (the caller then acquires as usual)."""
        validate_session_id(id)
        check_owner(owner)
        check_ttl(ttl_s)
        if checkpoint.session_id != id:
            raise ConfigError(
                f"take_lease_saving of session {id!r} was given a checkpoint of session "
                f"{checkpoint.session_id!r}"
            )
        taken = self._leases.take_saving(id, owner, ttl_s, checkpoint.key,
                                         dumps_checkpoint(checkpoint), revision)
        return taken if isinstance(taken, tuple) else None
