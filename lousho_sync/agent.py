"""create_agent, Agent (single turns, sessions, resume) and the approvals front."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from ._session_parts import AgentBase
from .approvals import (
    EXPIRED_REASON,
    ApprovalPage,
    check_by,
    check_ttl,
    current,
    pending,
    resolve_record,
    settle,
)
from .approvals import page as page_approvals
from .compaction import Compaction
from .control import TurnControl
from .errors import (
    ApprovalAlreadyResolvedError,
    ApprovalExpiredError,
    ApprovalTurnMissingError,
    ConfigError,
)
from .executor import TurnEnv, TurnWriter
from .ids import check_storable_id, new_session_id, validate_session_id
from .inputs import InputLike, to_messages
from .limits import Limits, Price
from .messages import Message, Usage
from .providers.base import Provider
from .records import ApprovalRecord, Checkpoint, is_expired, parse_key
from .results import ExecutionResult
from .run import AgentRun
from .session import Session, TurnPolicy
from .signal import Signal
from .stores.base import (
    ApprovalStore,
    CheckpointStore,
    SessionStore,
    TurnCommitter,
    turn_committer,
)
from .stores.bundle import AnyStore
from .stores.memory import InMemoryApprovalStore, MemoryCheckpointStore, MemorySessionStore
from .tools import Tool
from .turn_state import ApproveCallback, TurnConfig
from .turns import one_shot, resume_one_shot

__all__ = ["Agent", "Approvals", "create_agent"]

_log = logging.getLogger(__name__)


def _parts(store: object) -> tuple[Any, Any, Any]:
    """(sessions, checkpoints, approvals) of an AgentStore-like object or a SessionStore."""
    if store is None:
        return None, None, None
    if any(hasattr(store, n) for n in ("sessions", "checkpoints", "approvals")):
        return (
            getattr(store, "sessions", None),
            getattr(store, "checkpoints", None),
            getattr(store, "approvals", None),
        )
    if all(hasattr(store, n) for n in ("load", "save", "delete")):
        return store, None, None
    raise ConfigError(
        f"store must be an AgentStore (sessions/checkpoints/approvals) or a SessionStore "
        f"(load/save/delete); got {type(store).__name__}"
    )


class Agent:
    """An agent: a provider, instructions, tools, stores and budgets.

    Thread-safe: ``send``/``stream``/``session`` may be called from any thread.
    """

    def __init__(
        self,
        *,
        provider: Provider,
        instructions: str | None = None,
        tools: Iterable[Tool] = (),
        store: AnyStore | None = None,
        approval_store: ApprovalStore | None = None,
        limits: Limits | None = None,
        prices: Mapping[str, Price] | None = None,
        compaction: Compaction | None = None,
        settings: Mapping[str, Any] | None = None,
        approval_ttl_s: float | None = None,
        on_approval_requested: Callable[[ApprovalRecord], object] | None = None,
    ) -> None:
        self.provider = provider
        self.approval_ttl_s = check_ttl(approval_ttl_s, "create_agent")
        if on_approval_requested is not None and not callable(on_approval_requested):
            raise ConfigError(
                f"on_approval_requested must be a callable taking an ApprovalRecord, got "
                f"{type(on_approval_requested).__name__}"
            )
        self.on_approval_requested = on_approval_requested
        self.instructions = instructions
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise ConfigError(
                    f"tools must be Tool objects (decorate functions with @tool); got "
                    f"{type(t).__name__}"
                )
            if t.name in self.tools:
                raise ConfigError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
        if compaction is not None and not isinstance(compaction, Compaction):
            raise ConfigError(
                f"compaction must be a Compaction(max_input_tokens=...); got "
                f"{type(compaction).__name__}"
            )
        self.limits = limits
        self.prices = dict(prices) if prices else None
        self.compaction = compaction
        self.settings: Mapping[str, Any] = dict(settings or {})
        self._store = store
        sessions, checkpoints, approvals = _parts(store)
        self._session_store: SessionStore | None = sessions
        # no store at all: in-memory checkpoints (durable within this process); a store
        # given without checkpoints is not durable (a turn is saved only when it ends)
        self.checkpoint_store: CheckpointStore | None = (
            checkpoints if store is not None else MemoryCheckpointStore()
        )
        self.approval_store: ApprovalStore = (
            approval_store or approvals or InMemoryApprovalStore()
        )
        self._scratch = MemoryCheckpointStore()
        self._committer = _committer(sessions, self.checkpoint_store)  # checked once
        self._base = AgentBase(
            config=TurnConfig(
                provider=provider,
                system=instructions,
                tools=self.tools,
                tool_specs=tuple(t.spec() for t in self.tools.values()),
                settings=self.settings,
                limits=limits,
                prices=self.prices,
                approval_ttl_s=self.approval_ttl_s,
                on_approval_requested=on_approval_requested,
            ),
            compaction=compaction,
            scratch=self._scratch,
        )
        self._scratch_env = TurnEnv(writer=TurnWriter(self._scratch, self.approval_store),
                                    durable=False)
        self._lock = threading.Lock()
        # no session store given: the agent's own in memory (a session lives as long as
        # its agent, as with memory_store())
        self._memory = MemorySessionStore()
        self._live: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        self.approvals = Approvals(self)

    @property
    def store(self) -> AnyStore | None:
        """The store given to ``create_agent`` (None: the agent keeps its sessions in
        memory, each as long as the agent lives)."""
        return self._store

    # --- single turns --------------------------------------------------------------------------
    def send(
        self,
        input: InputLike,
        *,
        signal: Signal | None = None,
        session_id: str | None = None,
        approve: ApproveCallback | None = None,
    ) -> ExecutionResult:
        """A single turn from an empty history. ``session_id`` makes it durable (checkpointed
        under that id, finished by ``agent.resume(id)`` after a crash)."""
        # the run is driven here and never handed out: only ``signal`` could abort it
        return self._one_shot(to_messages(input), signal, session_id, approve,
                              reachable=signal is not None).result()

    def stream(
        self, input: InputLike, *, signal: Signal | None = None, session_id: str | None = None
    ) -> AgentRun:
        """``send()`` as an :class:`AgentRun` of typed events."""
        return self._one_shot(to_messages(input), signal, session_id, None)

    def _one_shot(
        self,
        msgs: tuple[Message, ...],
        signal: Signal | None,
        session_id: str | None,
        approve: ApproveCallback | None,
        *,
        reachable: bool = True,
    ) -> AgentRun:
        if session_id is not None:
            validate_session_id(session_id)
        control = TurnControl()
        control.reachable = reachable
        durable = session_id is not None and self.checkpoint_store is not None
        if durable or approve is not None:
            store = self.checkpoint_store if durable else self._scratch
            env = TurnEnv(writer=TurnWriter(store, self.approval_store), approve=approve,
                          durable=durable)
        else:
            env = self._scratch_env  # the common case, built once
        driver = one_shot(self._base.config, msgs, env=env, control=control,
                          session_id=session_id, signal=signal)
        return AgentRun(driver, control)

    def _resume_one_shot(
        self, store: CheckpointStore, key: str, signal: Signal | None = None
    ) -> ExecutionResult | None:
        return resume_one_shot(self._base.config, TurnWriter(store, self.approval_store), key,
                               signal)

    # --- sessions ------------------------------------------------------------------------------
    def session(
        self,
        id: str | None = None,
        *,
        store: AnyStore | None = None,
        checkpoint_store: CheckpointStore | None = None,
        turn_policy: TurnPolicy = "wait",
        limits: Limits | None = None,
        lease_ttl_s: float | None = None,
        idempotency_ttl_s: float | None = None,
    ) -> Session:
        """A multi-turn session (a new UUID id unless given). A session-level ``store`` (a
        SessionStore, or an object with sessions/checkpoints) and ``checkpoint_store`` win
        over the agent's, part by part. ``idempotency_ttl_s`` (default 24 h): how long a
        used ``idempotency_key`` starts no second turn."""
        sid = new_session_id() if id is None else validate_session_id(id)
        s_sessions, s_checkpoints, s_approvals = _parts(store)
        sessions = s_sessions or self._session_store or self._memory
        checkpoints = checkpoint_store or s_checkpoints or self.checkpoint_store
        kwargs: dict[str, Any] = {}
        if lease_ttl_s is not None:
            kwargs["lease_ttl_s"] = lease_ttl_s
        if idempotency_ttl_s is not None:
            if not idempotency_ttl_s > 0:
                raise ConfigError(
                    f"idempotency_ttl_s must be a positive number of seconds; "
                    f"got {idempotency_ttl_s!r}"
                )
            kwargs["idempotency_ttl_s"] = idempotency_ttl_s
        session = Session(
            self._base,
            sid,
            sessions=sessions,
            checkpoints=checkpoints,
            approvals=s_approvals or self.approval_store,
            committer=(self._committer if sessions is self._session_store
                       and checkpoints is self.checkpoint_store
                       else _committer(sessions, checkpoints)),
            turn_policy=turn_policy,
            limits=limits,
            opener=lambda nid: self.session(nid, store=store, checkpoint_store=checkpoint_store,
                                            lease_ttl_s=lease_ttl_s,
                                            idempotency_ttl_s=idempotency_ttl_s),
            **kwargs,
        )
        with self._lock:
            self._live[sid] = session
        return session

    def _session_for(self, id: str) -> Session:
        with self._lock:
            live = self._live.get(id)
        if live is not None:
            return live
        return self.session(id)

    def resume(self, id: str, *, signal: Signal | None = None) -> ExecutionResult | None:
        """Finish what ``id`` left unfinished: first a one-shot run started with
        ``send(..., session_id=id)``, then the session's interrupted turn. None if nothing."""
        validate_session_id(id)
        one_shot = (self._resume_one_shot(self.checkpoint_store, id, signal)
                    if self.checkpoint_store is not None else None)
        resumed = self._session_for(id).resume(signal=signal)
        return resumed if resumed is not None else one_shot

    def _paused_turn(
        self, record: ApprovalRecord
    ) -> tuple[Session | None, CheckpointStore, Checkpoint | None]:
        """The session (None for one-shot runs), store and checkpoint of the turn that
        ``record`` paused."""
        where = parse_key(record.checkpoint_key, record.session_id)
        session: Session | None = None
        if where.kind == "session":
            assert where.session_id is not None
            session = self._session_for(where.session_id)
            store = session.checkpoint_store or self._scratch
        else:
            store = (self.checkpoint_store if where.kind == "one-shot" else None) or self._scratch
        return session, store, store.load(record.checkpoint_key)

    def _resolve(
        self, id: str, approved: bool, reason: str | None, by: str | None = None
    ) -> ExecutionResult | None:
        by = check_by(by)
        store = self.approval_store
        record = store.get(id)
        if record is not None and is_expired(record):
            record = settle(store, record)  # denied as expired: its turn continues so
        if record is not None and _expired(record):
            raise _expired_error(record, self._continue(record))
        if record is not None and record.status == "pending":
            _, _, cp = self._paused_turn(record)
            again = self.approval_store.get(id) if cp is None else None
            if cp is None and again is not None and again.status == "pending":
                raise ApprovalTurnMissingError(
                    f"approval {id!r}: the turn that asked for it (checkpoint "
                    f"{record.checkpoint_key!r} of session {record.session_id!r}) is not in "
                    "this agent's checkpoint store, so resolving it could not run the tool; "
                    "the record was left pending (was the turn kept only in the memory of "
                    "another process?)",
                    approval_id=id,
                )
        try:
            record = resolve_record(store, id, approved=approved, reason=reason, by=by)
        except ApprovalAlreadyResolvedError as exc:
            raise _already_error(id, store.get(id), exc) from exc
        return self._continue(record)

    def _continue(self, record: ApprovalRecord) -> ExecutionResult | None:
        """Continue the turn ``record`` (now resolved) paused, when no other approval of it
        still waits; None when the turn is gone."""
        session, store, cp = self._paused_turn(record)
        if cp is None:
            return None  # discarded or continued meanwhile (its approvals went with it)
        still = [a for a in cp.pending_approval_ids
                 if (r := current(self.approval_store, a)) is not None and r.status == "pending"]
        if still:
            return _awaiting(cp.run_id, still)
        if session is not None:
            return session.resume()
        return self._resume_one_shot(store, record.checkpoint_key)

    def __repr__(self) -> str:
        return f"<Agent provider={type(self.provider).__name__} tools={list(self.tools)}>"


def _committer(sessions: object, checkpoints: object) -> TurnCommitter | None:
    """The combined store that commits turns of ``sessions`` in one transaction, when the
    checkpoints in use are its own too."""
    committer = turn_committer(sessions)
    if committer is not None and committer.checkpoints is checkpoints:
        return committer
    return None


def _expired(record: ApprovalRecord) -> bool:
    """Whether ``record`` was denied by its expiry (not by a person)."""
    return (record.status == "denied" and record.reason == EXPIRED_REASON
            and record.resolved_by is None and record.expires_at is not None)


def _when(t: float | None) -> str:
    import datetime

    if t is None:
        return "?"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _expired_error(record: ApprovalRecord, result: ExecutionResult | None) -> Exception:
    return ApprovalExpiredError(
        f"approval {record.id!r} (tool {record.call.name!r}, session {record.session_id!r}) "
        f"expired at {_when(record.expires_at)} before anyone decided: it was denied with "
        "the reason 'expired' and its turn continued as a denial does",
        approval_id=record.id, expires_at=record.expires_at, result=result,
    )


def _already_error(
    id: str, record: ApprovalRecord | None, exc: ApprovalAlreadyResolvedError
) -> Exception:
    """The error for a resolve that lost: who decided, when, and why."""
    if record is None or record.status == "pending":
        return exc
    if _expired(record):
        return _expired_error(record, None)
    who = f" by {record.resolved_by}" if record.resolved_by else ""
    why = f" (reason: {record.reason})" if record.reason else ""
    return ApprovalAlreadyResolvedError(
        f"approval {id!r} was already {record.status}{who} at {_when(record.resolved_at)}"
        f"{why}",
        approval_id=id,
    )


class Approvals:
    """``agent.approvals``: resolve, list, page and get approval records. Every read
    denies a request past its ``expires_at`` first (reason ``"expired"``)."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def get(self, id: str) -> ApprovalRecord | None:
        """One record, or None."""
        return current(self._agent.approval_store, check_storable_id(id, "approval id"))

    def list(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records (of one session, or all), oldest first."""
        if session_id is not None:
            check_storable_id(session_id, "session id")
        return pending(self._agent.approval_store, session_id)

    def page(
        self,
        status: Literal["pending"] = "pending",
        *,
        session_prefix: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> ApprovalPage:
        """One page of the pending approvals of every session (whose id starts with
        ``session_prefix``), newest first; pass ``next_cursor`` as ``cursor`` for the next.
        Paged over ``list_pending()`` of the approval store (O(pending) per page)."""
        return page_approvals(self._agent.approval_store, status,
                              session_prefix=session_prefix, limit=limit, cursor=cursor)

    def resolve(
        self, *, id: str, approved: bool, reason: str | None = None, by: str | None = None
    ) -> ExecutionResult | None:
        """Approve or deny (``by``: who decides, kept as ``resolved_by``); when it was the
        turn's last open approval, continue the turn (as the session's next turn) and return
        its result. Exactly one resolver wins; others get ApprovalAlreadyResolvedError
        saying who decided. A request past its ``expires_at`` is denied as expired, its turn
        continued, and ApprovalExpiredError raised (``.result``: the continued turn). When
        the paused turn cannot be found, raises ApprovalTurnMissingError and leaves the
        record pending (never "approved" without running)."""
        return self._agent._resolve(check_storable_id(id, "approval id"), approved, reason, by)


def _awaiting(run_id: str, pending: list[str]) -> ExecutionResult:
    return ExecutionResult(
        text="", finish_reason="awaiting-approval", messages=(), usage=Usage(), steps=0,
        run_id=run_id, approval_id=pending[0], approval_ids=tuple(pending),
    )


def create_agent(
    *,
    instructions: str | None = None,
    provider: Provider | None = None,
    model: str | None = None,
    tools: Iterable[Tool] = (),
    store: AnyStore | None = None,
    approval_store: ApprovalStore | None = None,
    limits: Limits | None = None,
    prices: Mapping[str, Price] | None = None,
    project_instructions: bool | str | Path = False,
    compaction: Compaction | None = None,
    settings: Mapping[str, Any] | None = None,
    approval_ttl_s: float | None = None,
    on_approval_requested: Callable[[ApprovalRecord], object] | None = None,
) -> Agent:
    """Build an :class:`Agent`. Give a ``provider`` object or a ``model`` string
    (``"openai/gpt-4o-mini"``); ``project_instructions=True`` (or a path) appends AGENTS.md.
    ``approval_ttl_s``: how long an approval request waits before it is denied as expired
    (tools may set their own; None: forever). ``on_approval_requested(record)`` is called
    once per request, after it is durable (for notifications; what it raises is logged)."""
    if provider is None and model is None:
        raise ConfigError("create_agent needs provider= (a Provider) or model= ('openai/...')")
    if provider is None:
        assert model is not None
        from .providers.registry import resolve_model

        provider = resolve_model(model)
    system = _with_project_instructions(instructions, project_instructions)
    return Agent(
        provider=provider,
        instructions=system,
        tools=tools,
        store=store,
        approval_store=approval_store,
        limits=limits,
        prices=prices,
        compaction=compaction,
        settings=settings,
        approval_ttl_s=approval_ttl_s,
        on_approval_requested=on_approval_requested,
    )


def _with_project_instructions(
    instructions: str | None, project: bool | str | Path
) -> str | None:
    if project is False or project is None:
        return instructions
    path = Path("AGENTS.md") if project is True else Path(project)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return instructions
    except OSError as exc:
        raise ConfigError(f"could not read project instructions {str(path)!r}: {exc}") from exc
    if not text.strip():
        return instructions
    return f"{instructions}\n\n{text}" if instructions else text


