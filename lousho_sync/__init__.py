"""lousho: agents whose conversations survive.

The blocking core. ``SqliteStore`` lives in :mod:`lousho_sync.sqlite` and ``RedisStore`` in
:mod:`lousho_sync.redis`; importing this package imports neither sqlite3 nor redis, and
neither requests (imported when the first HTTP provider is made) nor asyncio (when an async
tool is first called).

Logging: every record goes to the ``lousho_sync`` logger or a child named after its module
(``lousho_sync.executor`` for turns, steps, tool calls and checkpoint writes at DEBUG, with
``extra={"session_id", "run_id"}``; ``lousho_sync.session``, ``lousho_sync.compaction``,
``lousho_sync.stores.sqlite``/``.redis``/``.files`` for leases (takeovers at INFO, the
liveness probe at DEBUG in ``lousho_sync.stores._lease``), ``lousho_sync.providers._http``
for requests and retries, ``lousho_sync.aio`` for ``lousho_aio``). The ``lousho_sync``
logger has a ``NullHandler``: configure logging in your application to see the records.
Tracing: see :mod:`lousho_sync._otel` (the ``otel`` extra).
"""

import logging as _logging

from .agent import Agent, Approvals, create_agent
from .approvals import ApprovalPage
from .catalog import SessionInfo, SessionPage
from .codec import message_from_dict, message_to_dict, result_from_dict, result_to_dict
from .compaction import Compaction
from .errors import (
    AbortedError,
    ApprovalAlreadyResolvedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    ApprovalTurnMissingError,
    ConfigError,
    InvalidEventIdError,
    InvalidInputError,
    InvalidMetadataError,
    InvalidSessionIdError,
    LeaseLostError,
    LoopClosedError,
    LoushoError,
    LoushoWarning,
    PropagatingToolError,
    ProviderError,
    RateLimitedError,
    RunConsumedError,
    RunTimeoutError,
    SessionAwaitingApprovalError,
    SessionBusyError,
    SessionExistsError,
    StoreClosedError,
    StoreConflictError,
    StoreCorruptError,
    StoreDecryptError,
    StoreDurabilityWarning,
    StoreEncryptedError,
    StoreError,
    StoreTooNewError,
    StoreUnavailableError,
    TurnNotFoundError,
    UnsupportedCapabilityError,
)
from .event_json import EVENT_JSON_VERSION, event_to_dict
from .events import (
    ApprovalRequested,
    CompactionDone,
    CompactionStart,
    ContextCleared,
    Event,
    InputApplied,
    InputQueued,
    ListenerEvent,
    RunDone,
    RunEvent,
    RunFailed,
    RunStart,
    SessionEvent,
    StepReset,
    StepStart,
    TextDelta,
    ToolCallStart,
    ToolResultEvent,
    UsageEvent,
    event_id,
    parse_event_id,
)
from .ids import session_id_for
from .limits import Limits, Price
from .messages import FilePart, ImagePart, Message, TextPart, ToolCall, Usage
from .providers.anthropic import AnthropicProvider
from .providers.base import (
    ModelDone,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ModelToolCallDelta,
    Provider,
    ToolSpec,
)
from .providers.openai import OpenAIProvider
from .providers.registry import register_provider, resolve_model
from .providers.scripted import ScriptedProvider, Step
from .results import ExecutionResult, PendingTurn, PruneResult, TurnInfo
from .run import AgentRun
from .session import Session, TurnPolicy
from .signal import AbortController, Signal
from .stores.base import (
    AgentStore,
    ApprovalRecord,
    ApprovalStore,
    Checkpoint,
    CheckpointStore,
    SessionStore,
    StorageService,
    StoreCapabilities,
)
from .stores.encrypted import EncryptedStore
from .stores.files import (
    FileSessionStore,
    FileStorage,
    FileStore,
    LocalStorageCheckpointStore,
    StorageServiceApprovalStore,
)
from .stores.memory import (
    InMemoryApprovalStore,
    MemoryCheckpointStore,
    MemorySessionStore,
    memory_store,
)
from .tools import Tool, ToolContext, tool
from .turns import AgentExecutor


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lousho")
    except PackageNotFoundError:  # pragma: no cover - running from a tree never installed
        return "0+unknown"


__version__ = _version()
"""The installed distribution's version (one source: the package metadata)."""

__all__ = [
    "EVENT_JSON_VERSION",
    "AbortController",
    "AbortedError",
    "Agent",
    "AgentExecutor",
    "AgentRun",
    "AgentStore",
    "AnthropicProvider",
    "ApprovalAlreadyResolvedError",
    "ApprovalExpiredError",
    "ApprovalNotFoundError",
    "ApprovalPage",
    "ApprovalRecord",
    "ApprovalRequested",
    "ApprovalStore",
    "ApprovalTurnMissingError",
    "Approvals",
    "Checkpoint",
    "CheckpointStore",
    "Compaction",
    "CompactionDone",
    "CompactionStart",
    "ConfigError",
    "ContextCleared",
    "EncryptedStore",
    "Event",
    "ExecutionResult",
    "FilePart",
    "FileSessionStore",
    "FileStorage",
    "FileStore",
    "ImagePart",
    "InMemoryApprovalStore",
    "InputApplied",
    "InputQueued",
    "InvalidEventIdError",
    "InvalidInputError",
    "InvalidMetadataError",
    "InvalidSessionIdError",
    "LeaseLostError",
    "Limits",
    "ListenerEvent",
    "LocalStorageCheckpointStore",
    "LoopClosedError",
    "LoushoError",
    "LoushoWarning",
    "MemoryCheckpointStore",
    "MemorySessionStore",
    "Message",
    "ModelDone",
    "ModelEvent",
    "ModelRequest",
    "ModelResponse",
    "ModelTextDelta",
    "ModelToolCallDelta",
    "OpenAIProvider",
    "PendingTurn",
    "Price",
    "PropagatingToolError",
    "Provider",
    "ProviderError",
    "PruneResult",
    "RateLimitedError",
    "RunConsumedError",
    "RunDone",
    "RunEvent",
    "RunFailed",
    "RunStart",
    "RunTimeoutError",
    "ScriptedProvider",
    "Session",
    "SessionAwaitingApprovalError",
    "SessionBusyError",
    "SessionEvent",
    "SessionExistsError",
    "SessionInfo",
    "SessionPage",
    "SessionStore",
    "Signal",
    "Step",
    "StepReset",
    "StepStart",
    "StorageService",
    "StorageServiceApprovalStore",
    "StoreCapabilities",
    "StoreClosedError",
    "StoreConflictError",
    "StoreCorruptError",
    "StoreDecryptError",
    "StoreDurabilityWarning",
    "StoreEncryptedError",
    "StoreError",
    "StoreTooNewError",
    "StoreUnavailableError",
    "TextDelta",
    "TextPart",
    "Tool",
    "ToolCall",
    "ToolCallStart",
    "ToolContext",
    "ToolResultEvent",
    "ToolSpec",
    "TurnInfo",
    "TurnNotFoundError",
    "TurnPolicy",
    "UnsupportedCapabilityError",
    "Usage",
    "UsageEvent",
    "create_agent",
    "event_id",
    "event_to_dict",
    "memory_store",
    "message_from_dict",
    "message_to_dict",
    "parse_event_id",
    "register_provider",
    "resolve_model",
    "result_from_dict",
    "result_to_dict",
    "session_id_for",
    "tool",
]

_logging.getLogger(__name__).addHandler(_logging.NullHandler())
