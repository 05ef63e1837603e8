"""lousho: agents whose conversations survive.

The blocking core. ``SqliteStore`` lives in :mod:`lousho_sync.sqlite` and ``RedisStore`` in
:mod:`lousho_sync.redis`; importing this package imports neither sqlite3 nor redis.
"""

from .agent import Agent, Approvals, create_agent
from .compaction import Compaction
from .errors import (
    AbortedError,
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    ApprovalTurnMissingError,
    ConfigError,
    InvalidInputError,
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
    StoreClosedError,
    StoreConflictError,
    StoreCorruptError,
    StoreDurabilityWarning,
    StoreError,
    StoreTooNewError,
    StoreUnavailableError,
)
from .events import (
    ApprovalRequested,
    CompactionDone,
    CompactionStart,
    ContextCleared,
    Event,
    InputApplied,
    InputQueued,
    RunDone,
    RunEvent,
    RunFailed,
    RunStart,
    SessionEvent,
    StepStart,
    TextDelta,
    ToolCallStart,
    ToolResultEvent,
    UsageEvent,
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
from .results import ExecutionResult, PendingTurn, PruneResult
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
)
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
    "AbortController",
    "AbortedError",
    "Agent",
    "AgentExecutor",
    "AgentRun",
    "AgentStore",
    "AnthropicProvider",
    "ApprovalAlreadyResolvedError",
    "ApprovalNotFoundError",
    "ApprovalTurnMissingError",
    "ApprovalRecord",
    "ApprovalRequested",
    "ApprovalStore",
    "Approvals",
    "Checkpoint",
    "CheckpointStore",
    "Compaction",
    "CompactionDone",
    "CompactionStart",
    "ConfigError",
    "ContextCleared",
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
    "InvalidInputError",
    "InvalidSessionIdError",
    "LeaseLostError",
    "LoopClosedError",
    "Limits",
    "LocalStorageCheckpointStore",
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
    "RunTimeoutError",
    "RunDone",
    "RunEvent",
    "RunFailed",
    "RunStart",
    "ScriptedProvider",
    "Session",
    "SessionAwaitingApprovalError",
    "SessionBusyError",
    "SessionEvent",
    "SessionStore",
    "Signal",
    "Step",
    "StepStart",
    "StorageService",
    "StorageServiceApprovalStore",
    "StoreClosedError",
    "StoreConflictError",
    "StoreCorruptError",
    "StoreDurabilityWarning",
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
    "TurnPolicy",
    "Usage",
    "UsageEvent",
    "create_agent",
    "memory_store",
    "register_provider",
    "resolve_model",
    "session_id_for",
    "tool",
]
