"""Store protocols, the checkpoint and approval records, and the capabilities of a store.

Required protocols: :class:`SessionStore`, :class:`CheckpointStore`, :class:`ApprovalStore`.
What a store offers beyond them it declares in ``store.capabilities``, a
:class:`StoreCapabilities`; :func:`capabilities_of` reads it, and derives it once for a store
written before the record existed (from the protocols below). The optional capabilities,
each a Protocol with a helper that tells:

* :class:`Appendable` (:func:`supports_append`) — ``append(id, messages, *,
  expected_length)`` adds a turn's messages; :class:`~lousho_sync.StoreConflictError` when
  the stored length is not ``expected_length``.
* :class:`Leased` (:func:`supports_lease`) — a per-session lease across processes whose
  every acquisition returns a new, strictly greater fence token.
* :class:`Revisioned` (:func:`supports_revision`) — ``revision(id)`` changes whenever the
  stored transcript changes, so a session can skip reloading an unchanged transcript.
* :class:`TurnCommitter` (:func:`turn_committer`) — a combined store (sessions and
  checkpoints in one database) that commits a finished turn in one transaction.
* :class:`Catalogued` (:func:`supports_catalog`) — the session catalog: ``list()``,
  ``info()``, per-session metadata, the messages compaction replaced (``history``,
  ``compact``) and an atomic ``create`` (fork, copy). Every built-in store has it.
* fencing (:func:`supports_fencing`) — a part with ``fenced = True`` takes ``fence=`` on
  every write a turn makes and refuses, atomically with the write, a write whose fence
  token is older than the session's newest (:class:`~lousho_sync.LeaseLostError`).
* the event log (``event_ops()``) and the session mailbox (``mail_ops()``) of a session
  store shared across processes.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import attrs

from ..catalog import SessionInfo, SessionPage
from ..messages import Message
from ..records import CHECKPOINT_VERSION, ApprovalRecord, Checkpoint, Fence, now, resolved

__all__ = [
    "CHECKPOINT_VERSION",
    "AgentStore",
    "Appendable",
    "ApprovalRecord",
    "ApprovalStore",
    "Catalogued",
    "Checkpoint",
    "CheckpointStore",
    "Fence",
    "FencedLease",
    "LeaseQuery",
    "LeaseSaving",
    "Leased",
    "Revisioned",
    "SessionStore",
    "StorageService",
    "StoreCapabilities",
    "TurnCommitter",
    "capabilities_of",
    "now",
    "resolved",
    "supports_append",
    "supports_catalog",
    "supports_fencing",
    "supports_lease",
    "supports_revision",
    "turn_committer",
]

@runtime_checkable
class SessionStore(Protocol):
    """Keeps transcripts by session id."""

    def load(self, id: str) -> list[Message] | None:
        """The stored transcript, or None when the id has none."""
        ...

    def save(self, id: str, messages: Sequence[Message]) -> None:
        """Replace the stored transcript (an empty sequence stores nothing)."""
        ...

    def delete(self, id: str) -> None:
        """Forget the id (no error when absent)."""
        ...


@runtime_checkable
class CheckpointStore(Protocol):
    """Keeps checkpoints of unfinished turns by key."""

    def load(self, key: str) -> Checkpoint | None:
        """The checkpoint, or None."""
        ...

    def save(self, key: str, checkpoint: Checkpoint) -> None:
        """Write (replace) the checkpoint."""
        ...

    def delete(self, key: str) -> None:
        """Delete the checkpoint (no error when absent)."""
        ...

    def keys(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        ...


@runtime_checkable
class ApprovalStore(Protocol):
    """Keeps approval records; ``resolve`` is atomic across threads and processes."""

    def create(self, record: ApprovalRecord) -> None:
        """Store a new pending record."""
        ...

    def get(self, id: str) -> ApprovalRecord | None:
        """The record, or None."""
        ...

    def resolve(self, id: str, *, approved: bool, reason: str | None = None) -> ApprovalRecord:
        """Resolve once: exactly one caller wins; the others get
        ``ApprovalAlreadyResolvedError``; an unknown id raises ``ApprovalNotFoundError``.
        The built-in stores also take ``by=`` (kept as the record's ``resolved_by``, written
        with the decision); the agent passes it only when one is given."""
        ...

    def list_pending(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records (of one session, or all), oldest first."""
        ...


@runtime_checkable
class StorageService(Protocol):
    """Bytes by key, with atomic puts and a cross-process lock per key."""

    def get(self, key: str) -> bytes | None:
        """The value, or None."""
        ...

    def put(self, key: str, value: bytes) -> None:
        """Write atomically."""
        ...

    def delete(self, key: str) -> None:
        """Delete (no error when absent)."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        ...

    def lock(self, key: str) -> AbstractContextManager[None]:
        """A lock held across threads and processes while the block runs."""
        ...


@attrs.frozen(slots=True, kw_only=True)
class StoreCapabilities:
    """What a store offers beyond the required protocols: ``store.capabilities``.

    A combined store (``SqliteStore``, ``AgentStore``, ``EncryptedStore``, …) declares what it
    offers through itself and its parts; a session store what it offers (``prune`` is a whole
    store's); a checkpoint or approval store only ``fencing``. Each field, and where its
    methods are:
    """

    lease: bool = False
    """A per-session lease across processes whose every acquisition returns a new, greater
    fence token: ``sessions.acquire_lease``/``renew_lease``/``release_lease``/``fence_token``.
    (The file stores' lease is an OS file lock: it lapses when its holder's process dies,
    never while that process is stopped, so no reader takes over a stopped driver's turn
    there.)"""
    lease_query: bool = False
    """``sessions.lease_held(id)`` (:class:`LeaseQuery`): whether a live owner holds the
    lease now, a read that takes nothing."""
    fencing: bool = False
    """Every write a turn makes takes ``fence=`` and refuses, atomically with the write, a
    token older than the session's newest (``LeaseLostError``)."""
    append: bool = False
    """``sessions.append(id, messages, *, expected_length)``."""
    revision: bool = False
    """``sessions.revision(id)``: whether a transcript changed, without loading it."""
    commit_turn: bool = False
    """A finished turn is committed in one transaction with its checkpoint dropped
    (``commit_turn`` on the combined store, which :func:`turn_committer` finds)."""
    catalog: bool = False
    """The session catalog on ``sessions`` (:class:`Catalogued`)."""
    prune: bool = False
    """``store.prune(older_than_s)``."""
    events: bool = False
    """The turn event log kept in the store (``sessions.event_ops()``), read from every
    process; without it a turn's events live in this process's memory."""
    mailbox: bool = False
    """The session mailbox (``sessions.mail_ops()``): ``"queue"``, ``"steer"`` and
    ``"rollback"`` reach a turn another process runs; without it they fall back to
    ``"wait"`` across processes."""

    def names(self) -> tuple[str, ...]:
        """The names of the capabilities offered, in field order."""
        return tuple(f.name for f in attrs.fields(StoreCapabilities) if getattr(self, f.name))


@attrs.define(slots=True, kw_only=True)
class AgentStore:
    """Bundles a session store, a checkpoint store and an approval store (each optional)."""

    sessions: SessionStore | None = None
    checkpoints: CheckpointStore | None = None
    approvals: ApprovalStore | None = None

    @property
    def capabilities(self) -> StoreCapabilities:
        """What the parts offer together (:class:`StoreCapabilities`; no ``prune``)."""
        return _bundled(self, prune=False)



# --- optional capabilities -------------------------------------------------------------------


@runtime_checkable
class Appendable(Protocol):
    """A session store that adds a turn's messages without rewriting the transcript."""

    def append(self, id: str, messages: Sequence[Message], *, expected_length: int) -> None:
        """Add ``messages``; StoreConflictError when the stored transcript does not hold
        exactly ``expected_length`` messages (nothing is written then)."""
        ...


@runtime_checkable
class Leased(Protocol):
    """A session store with a per-session lease across processes. Stores that fence also
    return a token from ``acquire_lease`` (True is accepted from stores that do not) and
    offer ``fence_token(id)``, the newest token handed out."""

    def acquire_lease(self, id: str, *, owner: str, ttl_s: float, wait_s: float) -> int | None:
        """Take the lease for ``ttl_s`` seconds, waiting up to ``wait_s``: the fence token
        of this acquisition (>= 1, greater than every token handed out before for ``id``),
        or None when not taken in time."""
        ...

    def renew_lease(self, id: str, *, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease by ``ttl_s`` from now; False when ``owner`` lost it."""
        ...

    def release_lease(self, id: str, *, owner: str) -> None:
        """Release the lease if ``owner`` holds it (the fence token stays)."""
        ...


@runtime_checkable
class FencedLease(Leased, Protocol):
    """A lease whose acquisitions hand out fence tokens (the built-in shared stores)."""

    def fence_token(self, id: str) -> int:
        """The newest fence token handed out for ``id`` (0 when none)."""
        ...


@runtime_checkable
class LeaseQuery(Protocol):
    """A leased store that tells whether its lease is held without taking it."""

    def lease_held(self, id: str) -> bool:
        """Whether a live owner holds the lease of ``id`` now; changes nothing."""
        ...


@runtime_checkable
class LeaseSaving(Protocol):
    """A leased session store whose lease can be taken together with a turn's first
    checkpoint, in one write transaction (SqliteStore)."""

    @property
    def first_checkpoints(self) -> CheckpointStore:
        """The checkpoint store ``take_lease_saving`` writes to."""
        ...

    def take_lease_saving(
        self, id: str, *, owner: str, ttl_s: float, checkpoint: Checkpoint, revision: object
    ) -> tuple[int, bool] | None:
        """One attempt to take the lease, saving ``checkpoint`` in the same transaction
        when the transcript's revision is still ``revision`` and none pends under its key:
        (the fence token, whether saved), or None when another owner holds the lease."""
        ...


@runtime_checkable
class Revisioned(Protocol):
    """A session store that tells whether a transcript changed without loading it."""

    def revision(self, id: str) -> object:
        """A token that changes whenever the transcript of ``id`` changes; None if absent."""
        ...


@runtime_checkable
class TurnCommitter(Protocol):
    """A combined store that commits a finished turn in one transaction."""

    @property
    def checkpoints(self) -> CheckpointStore:
        """The checkpoint store whose checkpoint ``commit_turn`` deletes."""
        ...

    def commit_turn(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        expected_length: int,
        checkpoint_key: str | None,
        fence: Fence | None = None,
        release: bool = False,
    ) -> object:
        """In one transaction: refuse when a newer fence token than ``fence`` exists
        (LeaseLostError), check the length (StoreConflictError, as ``append``), append
        ``messages``, delete checkpoint ``checkpoint_key`` (if given) and, when ``release``,
        release the lease held under ``fence.token`` (only if that token still holds it).
        Returns the session's new revision."""
        ...


@runtime_checkable
class Catalogued(Protocol):
    """A session store with a catalog of its sessions.

    Each session has, besides its transcript, ``created_at`` (its first write),
    ``updated_at`` (the last change of its transcript or metadata), a metadata JSON object
    (:func:`~lousho_sync.catalog.check_metadata`; never counted as a message) and the
    messages compaction replaced (its *history*, oldest first). ``save(id, [])`` empties the
    transcript and the history and keeps the metadata; ``delete`` and ``prune`` remove all
    of it; ``load`` returns None for a session that has metadata only.
    """

    def info(self, id: str) -> SessionInfo | None:
        """The session's catalog entry (its transcript is not loaded), or None."""
        ...

    def set_metadata(self, id: str, metadata: Mapping[str, Any]) -> None:
        """Replace the metadata of ``id`` atomically (``{}`` removes it), creating the
        catalog entry when absent; InvalidMetadataError when it breaks the rule."""
        ...

    def history(self, id: str) -> list[Message]:
        """The messages compaction replaced in ``id``, oldest first ([] when none)."""
        ...

    def compact(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        replaced: Sequence[Message],
        fence: Fence | None = None,
    ) -> None:
        """In one transaction: add ``replaced`` to the history of ``id`` and replace its
        transcript with ``messages`` (fenced stores refuse an old ``fence`` first)."""
        ...

    def create(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        metadata: Mapping[str, Any] | None = None,
        history: Sequence[Message] = (),
    ) -> None:
        """Create session ``id`` with a transcript, metadata and history, in one
        transaction; SessionExistsError (nothing written) when ``id`` has messages or
        metadata already."""
        ...

    def list(
        self, *, prefix: str | None = None, limit: int = 100, after: str | None = None
    ) -> SessionPage:
        """One page of sessions whose id starts with ``prefix``: newest ``updated_at``
        first, then by id; ``after`` is the ``next`` of the page before. (Defined last:
        it shadows ``list`` in the class body.)"""
        ...


def supports_catalog(store: object) -> bool:
    """Whether ``store`` has :class:`Catalogued`'s catalog (list, metadata, history)."""
    return capabilities_of(store).catalog


def supports_append(store: object) -> bool:
    """Whether ``store`` has :class:`Appendable`'s ``append``."""
    return capabilities_of(store).append


def supports_lease(store: object) -> bool:
    """Whether ``store`` offers :class:`Leased`'s lease and fence tokens."""
    return capabilities_of(store).lease


def supports_revision(store: object) -> bool:
    """Whether ``store`` has :class:`Revisioned`'s ``revision``."""
    return capabilities_of(store).revision


def supports_fencing(part: object) -> bool:
    """Whether the store part ``part`` takes ``fence=`` on its writes."""
    return capabilities_of(part).fencing


def turn_committer(store: object) -> TurnCommitter | None:
    """What commits turns for ``store`` (``capabilities.commit_turn``): the combined store
    itself, the one a session store names in its ``combined`` attribute (SqliteStore's
    ``sessions``, …), or the one an ``AgentStore``'s sessions name; else None."""
    if not capabilities_of(store).commit_turn:
        return None
    combined = getattr(store, "combined", None)
    if combined is not None:
        return combined  # type: ignore[no-any-return]
    if callable(getattr(store, "commit_turn", None)):
        return store  # type: ignore[return-value]
    return turn_committer(getattr(store, "sessions", None))  # a bundle: its sessions'


# --- what a store declares, or what is derived once for a store that declares nothing --------

_PARTS = ("sessions", "checkpoints", "approvals")
_derived: weakref.WeakKeyDictionary[object, StoreCapabilities] = weakref.WeakKeyDictionary()


def capabilities_of(store: object) -> StoreCapabilities:
    """``store.capabilities`` when the store declares it; for a store that does not (one
    written for an earlier release), what its methods offer, derived once per store object
    (a Leased, Appendable, Revisioned, Catalogued session store; ``fenced = True``; a
    ``commit_turn``, ``prune``, ``event_ops`` or ``mail_ops`` method)."""
    declared = getattr(store, "capabilities", None)
    if isinstance(declared, StoreCapabilities):
        return declared
    try:
        found = _derived.get(store)
    except TypeError:  # not weakly referenceable: derived at each call
        return _derive(store)
    if found is None:
        found = _derived[store] = _derive(store)
    return found


def _derive(store: object) -> StoreCapabilities:
    if any(hasattr(store, n) for n in _PARTS):  # a bundle of parts
        return _bundled(store, prune=callable(getattr(store, "prune", None)))
    combined = getattr(store, "combined", None)
    return StoreCapabilities(
        lease=isinstance(store, Leased),
        lease_query=isinstance(store, LeaseQuery),
        fencing=getattr(store, "fenced", False) is True,
        append=isinstance(store, Appendable),
        revision=isinstance(store, Revisioned),
        commit_turn=isinstance(store, TurnCommitter) or isinstance(combined, TurnCommitter),
        catalog=isinstance(store, Catalogued),
        prune=callable(getattr(store, "prune", None)),
        events=callable(getattr(store, "event_ops", None)),
        mailbox=callable(getattr(store, "mail_ops", None)),
    )


def _bundled(store: object, *, prune: bool) -> StoreCapabilities:
    """What a bundle of parts offers: its sessions' capabilities, fencing when every part
    fences, commit_turn when its sessions' committer drops the bundle's own checkpoints."""
    sessions, checkpoints, approvals = (getattr(store, n, None) for n in _PARTS)
    caps = capabilities_of(sessions) if sessions is not None else StoreCapabilities()
    parts = [p for p in (sessions, checkpoints, approvals) if p is not None]
    committer = turn_committer(sessions) if caps.commit_turn else None
    return attrs.evolve(
        caps,
        fencing=bool(parts) and all(capabilities_of(p).fencing for p in parts),
        commit_turn=isinstance(store, TurnCommitter) or (
            committer is not None and committer.checkpoints is checkpoints),
        prune=prune,
    )
