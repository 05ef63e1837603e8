"""lousho for asyncio: a thin facade over the blocking core, :mod:`lousho_sync`.

``create_agent`` returns an :class:`AsyncAgent`; its sessions are :class:`AsyncSession`
objects and its streams :class:`AsyncAgentRun` objects. Everything else — messages,
events, errors, stores, providers, tools, limits — is the ``lousho_sync`` class itself,
re-exported here. The blocking calls run in lousho_aio's own thread pool (default 2048
threads, ``$LOUSHO_AIO_THREADS`` or :func:`configure`); cancelling an awaiting task aborts
its turn. No ``asyncio.run`` inside: it works in an already running loop (Jupyter, ASGI).
"""

from lousho_sync import __version__ as __version__
from lousho_sync.compaction import Compaction
from lousho_sync.errors import (
    AbortedError,
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    ConfigError,
    InvalidInputError,
    InvalidSessionIdError,
    LeaseLostError,
    LoushoError,
    PropagatingToolError,
    ProviderError,
    RateLimitedError,
    SessionAwaitingApprovalError,
    SessionBusyError,
    StoreClosedError,
    StoreConflictError,
    StoreCorruptError,
    StoreError,
    StoreTooNewError,
    StoreUnavailableError,
)
from lousho_sync.events import (
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
from lousho_sync.ids import session_id_for
from lousho_sync.limits import Limits, Price
from lousho_sync.messages import FilePart, ImagePart, Message, TextPart, ToolCall, Usage
from lousho_sync.providers.anthropic import AnthropicProvider
from lousho_sync.providers.base import (
    ModelDone,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ModelToolCallDelta,
    Provider,
    ToolSpec,
)
from lousho_sync.providers.openai import OpenAIProvider
from lousho_sync.providers.registry import register_provider, resolve_model
from lousho_sync.providers.scripted import ScriptedProvider, Step
from lousho_sync.results import ExecutionResult, PendingTurn, PruneResult
from lousho_sync.session import TurnPolicy
from lousho_sync.signal import AbortController, Signal
from lousho_sync.stores.base import (
    AgentStore,
    ApprovalRecord,
    ApprovalStore,
    Checkpoint,
    CheckpointStore,
    SessionStore,
    StorageService,
)
from lousho_sync.stores.files import (
    FileSessionStore,
    FileStorage,
    FileStore,
    LocalStorageCheckpointStore,
    StorageServiceApprovalStore,
)
from lousho_sync.stores.memory import (
    InMemoryApprovalStore,
    MemoryCheckpointStore,
    MemorySessionStore,
    memory_store,
)
from lousho_sync.tools import Tool, ToolContext, tool

from ._bridge import DEFAULT_MAX_WORKERS, EVENT_BUFFER, configure, max_workers
from .agent import AsyncAgent, AsyncApprovals, create_agent
from .run import AsyncAgentRun
from .session import AsyncApproveCallback, AsyncSession

__all__ = [
    "DEFAULT_MAX_WORKERS",
    "EVENT_BUFFER",
    "AbortController",
    "AbortedError",
    "AgentStore",
    "AnthropicProvider",
    "ApprovalAlreadyResolvedError",
    "ApprovalNotFoundError",
    "ApprovalRecord",
    "ApprovalRequested",
    "ApprovalStore",
    "AsyncAgent",
    "AsyncAgentRun",
    "AsyncApprovals",
    "AsyncApproveCallback",
    "AsyncSession",
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
    "Limits",
    "LocalStorageCheckpointStore",
    "LoushoError",
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
    "RunDone",
    "RunEvent",
    "RunFailed",
    "RunStart",
    "ScriptedProvider",
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
    "configure",
    "create_agent",
    "max_workers",
    "memory_store",
    "register_provider",
    "resolve_model",
    "session_id_for",
    "tool",
]
