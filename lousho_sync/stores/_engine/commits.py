"""The commit rules, once: a turn's commit (and ``append``) is checked and encoded here, one
backend primitive writes it, and its outcome becomes the revision, a StoreConflictError or
a LeaseLostError. A backend writes :class:`CommitOps` (its transaction stays its own)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import attrs

from ...codec import dumps_message
from ...errors import ConfigError
from ...ids import check_storable_text
from ...messages import Message
from ...records import Fence
from .._common import check_length, validate_session_id
from .backend import Backend
from .leases import fence_token_of, refused

__all__ = ["AppendRules", "CommitOp", "CommitOps", "CommitRules", "Conflict", "Stale", "settle"]


class CommitOp(NamedTuple):
    """One commit: in one transaction refuse when a token newer than ``token`` (0:
    unfenced) exists, check that session ``id`` holds ``expected_length`` messages, append
    ``texts`` (codec JSON), delete checkpoint ``checkpoint_key`` (None: none) and, with
    ``release``, release the lease held under ``token``. ``messages``: what ``texts``
    encode; a backend that keeps objects (``keeps_objects``, the memory one) takes them as
    they are, and its ``texts`` are left empty (no JSON made). A tuple (made once per
    turn: a frozen attrs record costs several times more to make)."""

    id: str
    texts: list[str]
    expected_length: int
    checkpoint_key: str | None
    token: int
    release: bool
    messages: Sequence[Message] = ()


@attrs.frozen(slots=True)
class Conflict:
    """Nothing written: the session holds ``actual`` messages, not the expected number."""

    actual: int


@attrs.frozen(slots=True)
class Stale:
    """Nothing written: token ``newest`` was handed out after the commit's."""

    newest: int


class CommitOps(Protocol):
    """A backend's commit primitive."""

    @property
    def backend(self) -> Backend:
        """The connection the primitives run on."""
        ...

    def commit(self, op: CommitOp) -> object:
        """Write ``op`` in one transaction (or script): the session's new revision, or a
        :class:`Conflict` or :class:`Stale` outcome (nothing written then)."""
        ...


_NOT_WRITTEN = (Conflict, Stale)
"""The outcomes :func:`settle` raises for (looked up before calling it: a turn's commit)."""


def _texts(ops: CommitOps, id: str, messages: Sequence[Message]) -> list[str]:
    """The codec JSON of ``messages`` for ``ops``. None for a backend keeping objects, which
    still refuses what no store keeps (InvalidInputError for a surrogate code point, as the
    codec would raise), checked without the JSON."""
    if not getattr(ops, "keeps_objects", False):
        return [dumps_message(m) for m in messages]
    for m in messages:  # the common message: ASCII text, nothing else to look into
        content, call_id = m.content, m.tool_call_id
        if not (type(content) is str and content.isascii() and not m.tool_calls
                and (call_id is None or call_id.isascii()) and not m.metadata
                and not m.extra):  # (role is one of three words; usage holds numbers)
            check_storable_text(messages, f"a message for session {id!r}")
            break
    return []


def settle(backend: Backend, op: CommitOp, outcome: object) -> object:
    """The revision of a committed ``op``; StoreConflictError or LeaseLostError for the
    outcomes that wrote nothing."""
    if isinstance(outcome, Conflict):
        check_length(op.id, op.expected_length, outcome.actual, backend.where,
                     path=backend.path, address=backend.address)
    elif isinstance(outcome, Stale):
        raise refused(backend, op.id, outcome.newest, op.token)
    return outcome



def commit_token(id: str, fence: Fence | None, release: bool) -> int:
    """The fence token of a ``commit_turn`` of session ``id`` (0: unfenced), after checking
    the id, the fence, and that ``release`` comes with a fence."""
    validate_session_id(id)
    token = fence_token_of(fence, id)
    if release and not token:
        raise ConfigError(
            f"commit_turn(release=True) of session {id!r} needs the fence its lease was "
            "acquired under (fence=Fence(id, token))"
        )
    return token


class CommitRules:
    """``commit_turn`` of a combined store over the primitive in ``_commits``."""

    _commits: CommitOps

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
        """:meth:`~lousho_sync.stores.base.TurnCommitter.commit_turn` in ONE transaction:
        fence check, length check, append, checkpoint delete, lease release. Nothing is
        written when it raises. Returns the new ``sessions.revision(id)``."""
        token = commit_token(id, fence, release)
        op = CommitOp(id, _texts(self._commits, id, messages), expected_length,
                      checkpoint_key, token, release, messages)
        outcome = self._commits.commit(op)
        if outcome.__class__ in _NOT_WRITTEN:
            settle(self._commits.backend, op, outcome)
        return outcome


class AppendRules:
    """``append`` and ``check_length`` of a session store over ``_commits``."""

    _commits: CommitOps

    def append(
        self,
        id: str,
        messages: Sequence[Message],
        *,
        expected_length: int,
        fence: Fence | None = None,
    ) -> None:
        """Add a turn's messages in one transaction.

        Raises StoreConflictError when the stored transcript does not hold exactly
        ``expected_length`` messages (another writer appended first), and with ``fence``
        LeaseLostError when a newer lease token exists; nothing is written then.
        """
        validate_session_id(id)
        op = CommitOp(id, _texts(self._commits, id, messages), expected_length, None,
                      fence_token_of(fence, id), False, messages)
        outcome = self._commits.commit(op)
        if outcome.__class__ in _NOT_WRITTEN:
            settle(self._commits.backend, op, outcome)

    def check_length(self, id: str, expected: int, actual: int) -> None:
        """StoreConflictError when ``actual`` is not ``expected`` (naming this store)."""
        backend = self._commits.backend
        check_length(id, expected, actual, backend.where, path=backend.path,
                     address=backend.address)
