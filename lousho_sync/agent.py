"""create_agent, Agent (single turns, sessions, resume) and the approvals front."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Generator, Iterable, Mapping
from pathlib import Path
from typing import Any

from .compaction import Compaction
from .errors import ConfigError
from .events import RunEvent
from .executor import ApproveCallback, TurnConfig, TurnControl, TurnState, run_turn
from .inputs import InputLike, to_messages
from .limits import Counters, Limits, Price
from .messages import Message
from .providers.base import Provider
from .results import ExecutionResult
from .run import AgentRun
from .session import Session, TurnPolicy, _drive, new_session_id, validate_session_id
from .signal import Signal
from .stores.base import ApprovalRecord, ApprovalStore, CheckpointStore, SessionStore
from .stores.bundle import AnyStore
from .stores.memory import InMemoryApprovalStore, MemoryCheckpointStore, MemorySessionStore
from .tools import Tool

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
    ) -> None:
        self.provider = provider
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
        self.limits = limits
        self.prices = dict(prices) if prices else None
        if compaction is not None and not isinstance(compaction, Compaction):
            raise ConfigError(f"compaction must be a Compaction or None, got {compaction!r}")
        self.compaction = compaction
        self.settings: Mapping[str, Any] = dict(settings or {})
        sessions, checkpoints, approvals = _parts(store)
        self._session_store: SessionStore | None = sessions
        self.checkpoint_store: CheckpointStore = checkpoints or MemoryCheckpointStore()
        self.approval_store: ApprovalStore = (
            approval_store or approvals or InMemoryApprovalStore()
        )
        self._scratch = MemoryCheckpointStore()
        self._base = TurnConfig(
            provider=provider,
            system=instructions,
            tools=self.tools,
            tool_specs=tuple(t.spec() for t in self.tools.values()),
            settings=self.settings,
            limits=limits,
            prices=self.prices,
        )
        self._scratch_config = self._turn_config(
            checkpoints=self._scratch, approvals=self.approval_store, durable=False
        )
        self._lock = threading.Lock()
        self._default_stores: weakref.WeakValueDictionary[str, MemorySessionStore] = (
            weakref.WeakValueDictionary()
        )
        self._live: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()
        self.approvals = Approvals(self)

    def _turn_config(
        self,
        *,
        checkpoints: CheckpointStore | None,
        approvals: ApprovalStore | None,
        session_limits: Limits | None = None,
        session_used: Counters = Counters(),
        approve: ApproveCallback | None = None,
        durable: bool = True,
    ) -> TurnConfig:
        base = self._base
        return TurnConfig(
            provider=base.provider,
            system=base.system,
            tools=base.tools,
            tool_specs=base.tool_specs,
            settings=base.settings,
            limits=base.limits,
            prices=base.prices,
            checkpoint_store=checkpoints,
            approval_store=approvals,
            session_limits=session_limits,
            session_used=session_used,
            approve=approve,
            durable=durable,
        )

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
        return self._one_shot(to_messages(input), signal, session_id, approve).result()

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
    ) -> AgentRun:
        if session_id is not None:
            validate_session_id(session_id)
        control = TurnControl()
        return AgentRun(self._one_shot_driver(control, msgs, signal, session_id, approve),
                        control)

    def _one_shot_driver(
        self,
        control: TurnControl,
        msgs: tuple[Message, ...],
        signal: Signal | None,
        session_id: str | None,
        approve: ApproveCallback | None,
    ) -> Generator[RunEvent, None, ExecutionResult]:
        unlink = (
            signal.add_callback(lambda: control.abort(signal.reason)) if signal is not None
            else None
        )
        try:
            store = self.checkpoint_store if session_id is not None else self._scratch
            key = session_id if session_id is not None else f"run-{control.run_id}"
            state = TurnState(run_id=control.run_id, key=key, session_id=session_id, input=msgs)
            if session_id is None and approve is None:
                cfg = self._scratch_config  # the common case, built once
            else:
                cfg = self._turn_config(checkpoints=store, approvals=self.approval_store,
                                        approve=approve, durable=session_id is not None)
            result = yield from run_turn(cfg, control, state, ())
            if result.finish_reason not in ("awaiting-approval", "aborted"):
                store.delete(key)
            return result
        finally:
            if unlink is not None:
                unlink()

    def _resume_one_shot(
        self, store: CheckpointStore, key: str, signal: Signal | None = None
    ) -> ExecutionResult | None:
        cp = store.load(key)
        if cp is None:
            return None
        control = TurnControl(cp.run_id)
        if cp.queued_inputs:
            control.offer(cp.queued_inputs, steer=False)
        unlink = (
            signal.add_callback(lambda: control.abort(signal.reason)) if signal is not None
            else None
        )
        try:
            cfg = self._turn_config(checkpoints=store, approvals=self.approval_store)
            gen = run_turn(cfg, control, TurnState.from_checkpoint(cp), (), resumed=True)
            result: ExecutionResult = _drive(gen)
            if result.finish_reason not in ("awaiting-approval", "aborted"):
                store.delete(key)
            return result
        finally:
            if unlink is not None:
                unlink()

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
    ) -> Session:
        """A multi-turn session (a new UUID id unless given). A session-level ``store`` (a
        SessionStore, or an object with sessions/checkpoints) and ``checkpoint_store`` win
        over the agent's, part by part."""
        sid = new_session_id() if id is None else validate_session_id(id)
        s_sessions, s_checkpoints, s_approvals = _parts(store)
        sessions = s_sessions or self._session_store
        if sessions is None:
            with self._lock:
                sessions = self._default_stores.get(sid)
                if sessions is None:
                    sessions = MemorySessionStore()
                    self._default_stores[sid] = sessions
        kwargs: dict[str, Any] = {}
        if lease_ttl_s is not None:
            kwargs["lease_ttl_s"] = lease_ttl_s
        session = Session(
            self,
            sid,
            sessions=sessions,
            checkpoints=checkpoint_store or s_checkpoints or self.checkpoint_store,
            approvals=s_approvals or self.approval_store,
            turn_policy=turn_policy,
            limits=limits,
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
        one_shot = self._resume_one_shot(self.checkpoint_store, id, signal)
        resumed = self._session_for(id).resume(signal=signal)
        return resumed if resumed is not None else one_shot

    def __repr__(self) -> str:
        return f"<Agent provider={type(self.provider).__name__} tools={list(self.tools)}>"


class Approvals:
    """``agent.approvals``: resolve, list and get approval records."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def get(self, id: str) -> ApprovalRecord | None:
        """One record, or None."""
        return self._agent.approval_store.get(id)

    def list(self, session_id: str | None = None) -> list[ApprovalRecord]:
        """Pending records (of one session, or all), oldest first."""
        return self._agent.approval_store.list_pending(session_id)

    def resolve(
        self, *, id: str, approved: bool, reason: str | None = None
    ) -> ExecutionResult | None:
        """Approve or deny; when it was the turn's last open approval, continue the turn (as
        the session's next turn) and return its result. Exactly one resolver wins; others get
        ApprovalAlreadyResolvedError. None when the turn no longer exists (discarded)."""
        agent = self._agent
        record = agent.approval_store.resolve(id, approved=approved, reason=reason)
        key = record.checkpoint_key
        if record.session_id is not None and key.startswith(f"{record.session_id}.turn-"):
            session = agent._session_for(record.session_id)
            store = session.checkpoint_store
            cp = store.load(key) if store is not None else None
            if cp is None:
                return None
            still = [a for a in cp.pending_approval_ids
                     if (r := agent.approval_store.get(a)) is not None and r.status == "pending"]
            if still:
                return _awaiting(cp.run_id, still)
            return session.resume()
        store = agent._scratch if key.startswith("run-") else agent.checkpoint_store
        cp = store.load(key)
        if cp is None:
            return None
        still = [a for a in cp.pending_approval_ids
                 if (r := agent.approval_store.get(a)) is not None and r.status == "pending"]
        if still:
            return _awaiting(cp.run_id, still)
        return agent._resume_one_shot(store, key)


def _awaiting(run_id: str, pending: list[str]) -> ExecutionResult:
    from .messages import Usage

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
) -> Agent:
    """Build an :class:`Agent`. Give a ``provider`` object or a ``model`` string
    (``"openai/gpt-4o-mini"``); ``project_instructions=True`` (or a path) appends AGENTS.md."""
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


