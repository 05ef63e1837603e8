"""The lousho error tree. Every error raised by lousho derives from :class:`LoushoError`.

::

    LoushoError (.code)
    ├── InvalidInputError (TypeError)          the developer passed a bad input
    ├── InvalidSessionIdError (ValueError)     a session id breaks ^[A-Za-z0-9_-]{1,128}$
    ├── ConfigError (ValueError)               a missing key, an unknown model, no price
    ├── SessionBusyError                       a turn is running (reject policy, clear, compact)
    ├── SessionAwaitingApprovalError           a turn waits on a human (.approval_id)
    ├── AbortedError                           a signal was aborted
    ├── RunConsumedError (RuntimeError)        a run's events were already read
    ├── RunTimeoutError (TimeoutError)         result(timeout=) ran out (the run goes on)
    ├── LoopClosedError (RuntimeError)         an aio callback's event loop closed first
    ├── PropagatingToolError                   raised by a tool to end the turn
    ├── ProviderError                          the model provider failed (.status, .retryable)
    │   └── RateLimitedError                   429
    ├── StoreError (.path / .address, .session_id)
    │   ├── StoreUnavailableError
    │   ├── StoreClosedError
    │   ├── StoreCorruptError
    │   ├── StoreTooNewError
    │   ├── StoreConflictError
    │   ├── StoreDecryptError                  an EncryptedStore record does not decrypt
    │   └── LeaseLostError                     a write refused: a newer lease holder exists
    ├── ApprovalTurnMissingError (LookupError) the paused turn of an approval is gone
    ├── ApprovalAlreadyResolvedError
    │   └── ApprovalExpiredError               denied as "expired" before anyone decided
    └── ApprovalNotFoundError (KeyError)

Codes (``.code``) are stable public API.

Warnings (``warnings.warn``; each also logged once at WARNING)::

    LoushoWarning (UserWarning, .code)
    └── StoreDurabilityWarning                 a store may lose or damage acknowledged data
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "AbortedError",
    "ApprovalAlreadyResolvedError",
    "ApprovalExpiredError",
    "ApprovalNotFoundError",
    "ApprovalTurnMissingError",
    "ConfigError",
    "InvalidInputError",
    "InvalidEventIdError",
    "InvalidMetadataError",
    "InvalidSessionIdError",
    "LeaseLostError",
    "LoopClosedError",
    "LoushoError",
    "LoushoWarning",
    "PropagatingToolError",
    "ProviderError",
    "RateLimitedError",
    "RunConsumedError",
    "RunTimeoutError",
    "SessionAwaitingApprovalError",
    "SessionBusyError",
    "SessionExistsError",
    "StoreClosedError",
    "StoreConflictError",
    "StoreCorruptError",
    "StoreDecryptError",
    "StoreDurabilityWarning",
    "StoreError",
    "StoreTooNewError",
    "StoreUnavailableError",
    "TurnNotFoundError",
    "UnsupportedCapabilityError",
]


def _restore(cls: type[BaseException], args: tuple[object, ...], fields: dict[str, object]) -> Any:
    """Unpickle an error without calling its ``__init__`` (whose keyword-only arguments
    pickle cannot pass)."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(fields)
    return error


class LoushoError(Exception):
    """Root of every lousho error; ``code`` is a stable string.

    Every lousho error pickles (and ``copy.deepcopy``-s) with its message, ``code`` and
    fields, so it can cross a process boundary (``multiprocessing``, Celery).

    ``pending`` is set on errors raised by a session's ``send``/``stream``/``resume`` (and
    a one-shot run's): True when a turn was kept and pends (finish it with ``resume()`` or
    drop it with ``discard_pending()``), False when nothing was kept; None elsewhere.
    ``turn`` says which turn such an error is about: ``"own"``, the call's own input, or
    ``"resumed"``, a pending turn the call was finishing first (then the call's own input
    was neither started nor stored: send it again). ``resumed`` is the result
    (:class:`~lousho_sync.results.ExecutionResult`) of a pending turn the call finished
    and committed before its own turn failed; None otherwise.
    """

    code: str = "LOUSHO_ERROR"
    pending: bool | None = None
    turn: Literal["own", "resumed"] | None = None
    resumed: Any = None  # an ExecutionResult (results is a floor above errors)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(self.__dict__)))


class InvalidInputError(LoushoError, TypeError):
    """An input to ``send()``/``stream()`` or a message field has the wrong type."""

    code = "LOUSHO_INVALID_INPUT"


class InvalidSessionIdError(LoushoError, ValueError):
    """A session id does not match ``^[A-Za-z0-9_-]{1,128}$``."""

    code = "LOUSHO_INVALID_SESSION_ID"

    def __init__(self, message: str, *, session_id: object = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class InvalidEventIdError(InvalidInputError):
    """A ``Last-Event-ID`` is not ``<turn_id>:<seq>`` or names another turn (a web view
    answers it with HTTP 400)."""

    code = "LOUSHO_INVALID_EVENT_ID"

    def __init__(self, message: str, *, event_id: object = None) -> None:
        super().__init__(message)
        self.event_id = event_id


class InvalidMetadataError(LoushoError, ValueError):
    """Session metadata is not a JSON object of at most ``MAX_METADATA_BYTES`` bytes."""

    code = "LOUSHO_INVALID_METADATA"

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class ConfigError(LoushoError, ValueError):
    """The agent or a provider is misconfigured (missing key, unknown model, no price)."""

    code = "LOUSHO_CONFIG"


class UnsupportedCapabilityError(ConfigError, AttributeError):
    """A store was asked for a capability it does not offer (``capability`` names it, one
    of the fields of ``StoreCapabilities``). Also an AttributeError, so ``hasattr`` and
    ``getattr(store, name, None)`` tell that the method is not there."""

    code = "LOUSHO_UNSUPPORTED_CAPABILITY"

    def __init__(self, message: str, *, capability: str | None = None) -> None:
        super().__init__(message)
        self.capability = capability


class SessionBusyError(LoushoError):
    """A turn is running on the session."""

    code = "LOUSHO_SESSION_BUSY"

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class SessionAwaitingApprovalError(LoushoError):
    """A turn of the session is paused on an approval; resolve or discard it first."""

    code = "LOUSHO_SESSION_AWAITING_APPROVAL"
    pending = True  # the turn waiting on the approval

    def __init__(
        self, message: str, *, approval_id: str | None, session_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.approval_id = approval_id
        self.session_id = session_id


class AbortedError(LoushoError):
    """The operation was aborted through its signal; ``reason`` is the abort reason."""

    code = "LOUSHO_ABORTED"

    def __init__(self, message: str = "aborted", *, reason: object = None) -> None:
        super().__init__(message)
        self.reason = reason


class RunConsumedError(LoushoError, RuntimeError):
    """An ``AgentRun`` was iterated after its events were read (or ``result()`` drove it)."""

    code = "LOUSHO_RUN_CONSUMED"


class RunTimeoutError(LoushoError, TimeoutError):
    """``result(timeout=...)`` ran out before the run ended; the run goes on."""

    code = "LOUSHO_TIMEOUT"


class LoopClosedError(LoushoError, RuntimeError):
    """``lousho_aio``: the event loop running an async callback closed before it returned."""

    code = "LOUSHO_LOOP_CLOSED"


class PropagatingToolError(LoushoError):
    """Raised by a tool to end the turn and propagate to the caller (not fed to the model)."""

    code = "LOUSHO_TOOL_PROPAGATED"


class ProviderError(LoushoError):
    """The model provider failed.

    ``status`` is the HTTP status (or None), ``error_type`` the provider's error type,
    ``retryable`` whether trying again may succeed, ``provider`` the provider's name.
    """

    code = "LOUSHO_PROVIDER_ERROR"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error_type: str | None = None,
        retryable: bool = False,
        provider: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.retryable = retryable
        self.provider = provider


class RateLimitedError(ProviderError):
    """The provider answered 429 after every retry."""


class StoreError(LoushoError):
    """A store failed; ``path`` or ``address`` says where, ``session_id`` for what."""

    code = "LOUSHO_STORE_ERROR"

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        address: str | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.address = address
        self.session_id = session_id


class StoreUnavailableError(StoreError):
    """The store cannot be reached (disk, database or server)."""

    code = "LOUSHO_STORE_UNAVAILABLE"


class StoreClosedError(StoreError):
    """The store was used after ``close()``."""

    code = "LOUSHO_STORE_CLOSED"


class StoreCorruptError(StoreError):
    """Stored data cannot be read; it is left as it was."""

    code = "LOUSHO_STORE_CORRUPT"


class StoreTooNewError(StoreError):
    """The store was written by a newer release of lousho."""

    code = "LOUSHO_STORE_TOO_NEW"


class StoreConflictError(StoreError):
    """An append found a different transcript length than expected (another writer)."""

    code = "LOUSHO_STORE_CONFLICT"

    def __init__(
        self,
        message: str,
        *,
        expected_length: int | None = None,
        actual_length: int | None = None,
        path: str | None = None,
        address: str | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__(message, path=path, address=address, session_id=session_id)
        self.expected_length = expected_length
        self.actual_length = actual_length


class StoreDecryptError(StoreError):
    """A record of an EncryptedStore does not decrypt: written with a key not given,
    changed (tampering), moved from another record, or not encrypted at all. ``record``
    names it ("message 3 of session 's1'"); the stored data is left as it was."""

    code = "LOUSHO_STORE_DECRYPT"

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        address: str | None = None,
        session_id: str | None = None,
        record: str | None = None,
    ) -> None:
        super().__init__(message, path=path, address=address, session_id=session_id)
        self.record = record


class StoreEncryptedError(StoreError):
    """The store was written through ``EncryptedStore`` (it is marked so) and is used
    without it: plain reads would show empty texts and plain writes would mix plaintext into
    encrypted sessions, so both are refused. Open it as ``EncryptedStore(inner,
    keys=[...])``."""

    code = "LOUSHO_STORE_ENCRYPTED"


class SessionExistsError(StoreError):
    """A session was to be created (``fork``, ``create``, ``sessions copy``) under an id
    that already holds messages or metadata."""

    code = "LOUSHO_SESSION_EXISTS"


class LeaseLostError(StoreError):
    """A turn's write was refused because another holder took the session's lease since
    (fencing); the turn stopped there and its checkpoint is left for the new holder."""

    code = "LOUSHO_LEASE_LOST"


class ApprovalAlreadyResolvedError(LoushoError):
    """The approval was already resolved (by this or another caller)."""

    code = "LOUSHO_APPROVAL_RESOLVED"

    def __init__(self, message: str, *, approval_id: str | None = None) -> None:
        super().__init__(message)
        self.approval_id = approval_id


class ApprovalExpiredError(ApprovalAlreadyResolvedError):
    """The approval passed its ``expires_at`` before anyone decided: it was denied with the
    reason ``"expired"`` (its turn continues as a denial does). ``result`` is the result of
    the turn the resolving call continued, or None."""

    code = "LOUSHO_APPROVAL_EXPIRED"

    def __init__(
        self,
        message: str,
        *,
        approval_id: str | None = None,
        expires_at: float | None = None,
        result: Any = None,
    ) -> None:
        super().__init__(message, approval_id=approval_id)
        self.expires_at = expires_at
        self.result = result


class ApprovalTurnMissingError(LoushoError, LookupError):
    """The turn an approval paused cannot be found, so resolving it could not continue it;
    the record was left pending."""

    code = "LOUSHO_APPROVAL_TURN_MISSING"

    def __init__(self, message: str, *, approval_id: str | None = None) -> None:
        super().__init__(message)
        self.approval_id = approval_id


class ApprovalNotFoundError(LoushoError, KeyError):
    """No approval has this id."""

    code = "LOUSHO_APPROVAL_NOT_FOUND"

    def __init__(self, message: str, *, approval_id: str | None = None) -> None:
        super().__init__(message)
        self.approval_id = approval_id

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TurnNotFoundError(LoushoError, LookupError):
    """``attach()`` named a turn whose events are gone (kept ``event_ttl_s`` after its end)
    or never existed."""

    code = "LOUSHO_TURN_NOT_FOUND"

    def __init__(self, message: str, *, turn_id: str | None = None,
                 session_id: str | None = None) -> None:
        super().__init__(message)
        self.turn_id = turn_id
        self.session_id = session_id


class LoushoWarning(UserWarning):
    """Root of every warning lousho issues; ``code`` is a stable string."""

    code: str = "LOUSHO_WARNING"


class StoreDurabilityWarning(LoushoWarning):
    """A store's setup can lose or damage acknowledged data (a Redis server without
    persistence; a SQLite library with a known corruption bug). Issued once per server
    address or per process; filter it with ``warnings.filterwarnings``."""

    code = "LOUSHO_STORE_DURABILITY"
