"""The step loop: model call → tool calls → results → next model call, as a generator of
events. It performs the I/O (provider, tools, checkpoints, approvals); the decisions it
takes are in :mod:`lousho_sync._loop` and :mod:`lousho_sync.limits`.

One turn is driven by whoever pulls its events (``AgentRun`` iteration, ``result()`` or
``send()``), so no thread is started per turn.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import attrs

from . import _loop, _otel
from ._turnlog import LoggedHooks
from .errors import AbortedError, LoushoError, ProviderError
from .events import (
    ApprovalRequested,
    InputApplied,
    InputQueued,
    RunEvent,
    RunStart,
    StepStart,
    TextDelta,
    ToolCallStart,
    ToolResultEvent,
    UsageEvent,
)
from .limits import Counters, Limits, Price, cost_of
from .limits import exceeded_before_model_call as _limit_model
from .limits import exceeded_before_tool_call as _limit_tool
from .messages import Message, ToolCall, Usage
from .providers.base import (
    ModelDone,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ModelToolCallDelta,
    Provider,
    ToolSpec,
)
from .records import ApprovalRecord, Checkpoint, now
from .results import ExecutionResult
from .signal import AbortController, Latch
from .stores.base import ApprovalStore, CheckpointStore
from .tools import Tool, ToolContext, run_tool

__all__ = ["AgentExecutor", "TurnConfig", "TurnControl", "TurnState", "run_turn"]

_log = logging.getLogger(__name__)

ApproveCallback = Callable[[ApprovalRecord], bool]


@attrs.define(slots=True, kw_only=True)
class TurnConfig:
    """Everything a turn needs besides its state. Immutable in practice; built per turn."""

    provider: Provider
    system: str | None = None
    tools: Mapping[str, Tool] = attrs.field(factory=dict)
    tool_specs: tuple[ToolSpec, ...] = ()
    settings: Mapping[str, Any] = attrs.field(factory=dict)
    limits: Limits | None = None
    session_limits: Limits | None = None
    session_used: Counters = Counters()
    prices: Mapping[str, Price] | None = None
    checkpoint_store: CheckpointStore | None = None
    approval_store: ApprovalStore | None = None
    approve: ApproveCallback | None = None
    durable: bool = True
    """False: write a checkpoint only to pause on an approval (one-shot runs without an id)."""

    @property
    def cost_required(self) -> bool:
        """Whether a cost limit is set (then every model call must have a known cost)."""
        return (self.limits is not None and self.limits.max_cost_usd is not None) or (
            self.session_limits is not None and self.session_limits.max_cost_usd is not None
        )


@attrs.define(slots=True, kw_only=True)
class TurnState:
    """The mutable state of one turn; what a checkpoint records."""

    run_id: str
    key: str | None
    session_id: str | None
    turn_index: int = 0
    input: tuple[Message, ...] = ()
    recorded: list[Message] = attrs.field(factory=list)
    started: list[str] = attrs.field(factory=list)
    pending_approvals: list[str] = attrs.field(factory=list)
    usage: Usage = Usage()
    created_at: float = attrs.field(factory=now)
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def from_checkpoint(cls, cp: Checkpoint) -> TurnState:
        """The state a checkpoint recorded."""
        return cls(
            run_id=cp.run_id,
            key=cp.key,
            session_id=cp.session_id,
            turn_index=cp.turn_index,
            input=cp.input,
            recorded=list(cp.recorded),
            started=list(cp.started_call_ids),
            pending_approvals=list(cp.pending_approval_ids),
            usage=cp.usage,
            created_at=cp.created_at,
            extra=cp.extra,
        )

    def checkpoint(self, status: str, queued: Sequence[Message]) -> Checkpoint:
        """A checkpoint of this state."""
        assert self.key is not None
        return Checkpoint(
            key=self.key,
            session_id=self.session_id,
            run_id=self.run_id,
            turn_index=self.turn_index,
            input=self.input,
            recorded=tuple(self.recorded),
            started_call_ids=tuple(self.started),
            queued_inputs=tuple(queued),
            pending_approval_ids=tuple(self.pending_approvals),
            usage=self.usage,
            status=status,  # type: ignore[arg-type]
            created_at=self.created_at,
            updated_at=now(),
            extra=self.extra,
        )

    def counters(self) -> Counters:
        """Steps, tool calls and usage of the turn so far (derived from ``recorded``)."""
        steps = sum(1 for m in self.recorded if m.role == "assistant")
        tools = sum(1 for m in self.recorded if m.role == "tool")
        return Counters(steps, tools, self.usage)


class TurnControl:
    """The live side of a running turn, shared by the executor and its callers.

    Thread-safe: ``_lock`` guards the queued input, the open/closed flag and the state of
    the current model call; ``enqueue``/``steer``/``abort`` may be called from any thread.
    """

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id or new_id()
        self.controller = AbortController()
        self.signal = self.controller.signal
        self._seq = itertools.count()
        self.quiet = False
        """Set when nobody will read the events (``send()``): they are not built."""
        self._lock = threading.Lock()
        self._queued: list[Message] = []
        self._announced: list[tuple[Message, ...]] = []
        self._open = True
        self._steer = False
        self._in_call: AbortController | None = None
        self._unlink_call: Callable[[], None] = _noop
        self._emitted = False
        self._steered_call = False
        self.offered = Latch()
        """Set once some input was queued into the turn (lets callers wait for a join)."""
        self.taken: list[object] = []
        """Tokens of joined inputs the turn took (applied or kept in its checkpoint)."""
        self._tokens: list[tuple[object, int]] = []
        self.otel: _otel.Hooks = _otel.OFF  # tracing hooks (issue 18); set by run_turn

    # --- events -------------------------------------------------------------------------
    def next_seq(self) -> int:
        """The next event sequence number of this run."""
        return next(self._seq)

    # --- queued input ------------------------------------------------------------------
    def offer(self, messages: tuple[Message, ...], *, steer: bool, token: object = None) -> bool:
        """Queue input into the turn; False when the turn no longer takes input."""
        with self._lock:
            if not self._open:
                return False
            self._queued.extend(messages)
            self._announced.append(messages)
            if token is not None:
                self._tokens.append((token, len(self._queued)))
            self.offered.set()
            if steer:
                self._steer = True
                if self._in_call is not None and not self._emitted:
                    self._steered_call = True
                    self._in_call.abort("steer")
            return True

    def close_if_idle(self) -> bool:
        """Stop taking input unless some is queued; True when closed."""
        with self._lock:
            if self._queued:
                return False
            self._open = False
            return True

    def close(self) -> list[Message]:
        """Stop taking input; returns what was queued and never applied."""
        with self._lock:
            self._open = False
            return list(self._queued)

    def queued(self) -> list[Message]:
        """Input queued and not applied yet."""
        with self._lock:
            return list(self._queued)

    def take_announcements(self) -> list[tuple[Message, ...]]:
        """Inputs queued since the last call (for ``input.queued`` events)."""
        with self._lock:
            out, self._announced = self._announced, []
            return out

    def take_queued(self) -> tuple[list[Message], bool]:
        """Remove and return the queued input, and whether a steer asked for it."""
        with self._lock:
            out, self._queued = self._queued, []
            steer, self._steer = self._steer, False
            self.taken.extend(t for t, _ in self._tokens)
            self._tokens = []
            return out, steer

    def has_queued(self) -> bool:
        """Whether input waits to be announced or applied (a racy read: input queued just
        after it is applied at the next safe point)."""
        return bool(self._queued or self._announced)

    def steer_requested(self) -> bool:
        """Whether a steer is waiting to be applied."""
        return self._steer

    def keep_queued_tokens(self) -> None:
        """Count the unapplied joined inputs as taken (the turn failed; its checkpoint keeps
        them for ``resume()``)."""
        with self._lock:
            self.taken.extend(t for t, _ in self._tokens)
            self._tokens = []

    # --- model call -----------------------------------------------------------------------
    def begin_call(self) -> AbortController:
        """Start a model call: a child controller that a steer (or the turn's abort) aborts."""
        child = AbortController()
        signal = self.signal
        self._unlink_call = signal.add_callback(lambda: child.abort(signal.reason))
        with self._lock:
            self._in_call = child
            self._emitted = False
            self._steered_call = False
        return child

    def mark_emitted(self) -> bool:
        """The call emitted something; False when a steer already aborted it."""
        if self._emitted:  # a steer never aborts a call that has emitted
            return True
        with self._lock:
            if self._steered_call:
                return False
            self._emitted = True
            return True

    def end_call(self) -> bool:
        """End the model call; True when a steer aborted it (then it must be made again)."""
        self._unlink_call()
        with self._lock:
            steered = self._steered_call
            self._in_call = None
            self._steered_call = False
            return steered

    def abort(self, reason: object = None) -> None:
        """Abort the turn."""
        self.controller.abort(reason)


def new_id() -> str:
    """A random 128-bit id as 32 hex digits (what uuid4().hex looks like, cheaper)."""
    return os.urandom(16).hex()


def _noop() -> None:
    return None


class _Aborted(Exception):
    pass


def _save(cfg: TurnConfig, state: TurnState, ctl: TurnControl, status: str) -> None:
    if not cfg.durable and status != "awaiting-approval":
        return
    if cfg.checkpoint_store is not None and state.key is not None:
        if ctl.otel is _otel.OFF:
            cfg.checkpoint_store.save(state.key, state.checkpoint(status, ctl.queued()))
        else:  # tracing or DEBUG logging (issue 18)
            with ctl.otel.checkpoint(status):
                cfg.checkpoint_store.save(state.key, state.checkpoint(status, ctl.queued()))


def run_turn(
    cfg: TurnConfig,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    *,
    resumed: bool = False,
) -> Generator[RunEvent, None, ExecutionResult]:
    """Run (or continue) one turn, yielding its events; returns its result.

    Finished turns leave their checkpoint for the caller to delete once the turn is committed;
    aborted turns delete it; failed turns mark it ``interrupted`` and re-raise.
    """
    # --- observability (issue 18): spans when a tracer provider is set, DEBUG records ----
    trace = _otel.turn(cfg.provider, state.session_id, ctl.run_id)
    logged = _log.isEnabledFor(logging.DEBUG)
    if trace is None and not logged:
        return (yield from _turn(cfg, ctl, state, history, resumed))
    body = _turn(cfg, ctl, state, history, resumed)
    if trace is not None:
        ctl.otel = trace
        body = trace.run(body)
    if logged:
        ctl.otel = hooks = LoggedHooks(ctl.otel, _log, state.session_id, ctl.run_id)
        body = hooks.run(body)
    return (yield from body)


def _turn(
    cfg: TurnConfig,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    resumed: bool,
) -> Generator[RunEvent, None, ExecutionResult]:
    ev = _Emit(ctl)
    if not resumed:
        _save(cfg, state, ctl, "running")  # the turn is durable before run.start
    try:
        yield ev(RunStart, session_id=state.session_id, input=state.input)
        result = yield from _steps(cfg, ctl, state, history, ev)
    except BaseException as exc:
        if ctl.signal.aborted or isinstance(exc, (_Aborted, GeneratorExit)):
            ctl.close()
            _drop(cfg, state)
            if isinstance(exc, GeneratorExit):
                raise
            return _result(state, ctl, "aborted", messages=())
        ctl.keep_queued_tokens()
        try:
            _save(cfg, state, ctl, "interrupted")
        except Exception:
            _log.warning("could not mark turn %s interrupted", state.key, exc_info=True)
        raise
    return result


def _drop(cfg: TurnConfig, state: TurnState) -> None:
    if cfg.checkpoint_store is not None and state.key is not None:
        try:
            cfg.checkpoint_store.delete(state.key)
        except Exception:
            _log.warning("could not delete checkpoint %s", state.key, exc_info=True)


class _Emit:
    __slots__ = ("_ctl", "_run_id")

    def __init__(self, ctl: TurnControl) -> None:
        self._ctl = ctl
        self._run_id = ctl.run_id

    def __call__(self, cls: Callable[..., RunEvent], **fields: Any) -> Any:
        if self._ctl.quiet:  # nobody will read this run's events: don't build them
            return QUIET
        return cls(run_id=self._run_id, seq=self._ctl.next_seq(), **fields)


QUIET: Any = object()
"""What a quiet run (one consumed by ``result()`` without iteration) yields instead of
events."""


def _result(
    state: TurnState,
    ctl: TurnControl,
    finish: str,
    *,
    messages: tuple[Message, ...] | None = None,
    exceeded: str | None = None,
) -> ExecutionResult:
    msgs = (*state.input, *state.recorded) if messages is None else messages
    approvals = tuple(state.pending_approvals) if finish == "awaiting-approval" else ()
    return ExecutionResult(
        text=_loop.final_text(msgs),
        finish_reason=finish,
        messages=msgs,
        usage=state.usage,
        steps=sum(1 for m in state.recorded if m.role == "assistant"),
        run_id=ctl.run_id,
        approval_id=approvals[0] if approvals else None,
        approval_ids=approvals,
        exceeded=exceeded,
    )


def _steps(
    cfg: TurnConfig,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    ev: _Emit,
) -> Generator[RunEvent, None, ExecutionResult]:
    used = state.counters()
    finish = "stop"
    while True:
        if ctl.signal.aborted:
            raise _Aborted
        calls = _loop.unresolved_calls(state.recorded)
        if calls:
            outcome = yield from _run_calls(cfg, ctl, state, calls, used, ev)
            used = state.counters()
            if outcome == "paused":
                ctl.close()
                return _result(state, ctl, "awaiting-approval")
            if outcome is not None:
                ctl.close()
                return _result(state, ctl, "limit", exceeded=outcome)
        elif _loop.ends_with_answer(state.recorded) and ctl.close_if_idle():
            return _result(state, ctl, finish)
        exceeded = _limit_model(cfg.limits, used) or _limit_model(
            cfg.session_limits, cfg.session_used + used
        )
        if exceeded:
            ctl.close()
            return _result(state, ctl, "limit", exceeded=exceeded)
        yield from _apply_queued(cfg, ctl, state, ev)
        response = yield from ctl.otel.model_call(  # tracing (issue 18)
            _model_call(cfg, ctl, state, history, used, ev), used.steps + 1
        )
        if response is None:  # steered: make the call again with the new input
            continue
        usage = cost_of(
            response.message.usage or Usage(), response.model, cfg.prices,
            required=cfg.cost_required,
        )
        message = response.message
        if message.usage is not usage:
            message = Message(
                message.role, message.content, message.tool_calls, message.tool_call_id,
                message.is_error, usage, message.metadata, extra=message.extra,
            )
        state.recorded.append(message)
        state.usage = state.usage + usage
        used = used.add(steps=1, usage=usage)
        yield ev(UsageEvent, usage=usage, total=state.usage)
        finish = "length" if response.finish_reason == "length" else "stop"
        if message.tool_calls:
            _save(cfg, state, ctl, "running")


def _apply_queued(
    cfg: TurnConfig, ctl: TurnControl, state: TurnState, ev: _Emit
) -> Generator[RunEvent, None, None]:
    if not ctl.has_queued():
        return
    for announced in ctl.take_announcements():
        yield ev(InputQueued, input=announced)
    queued, _ = ctl.take_queued()
    if queued:
        state.recorded.extend(queued)
        _save(cfg, state, ctl, "running")
        yield ev(InputApplied, input=tuple(queued))


def _model_call(
    cfg: TurnConfig,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    used: Counters,
    ev: _Emit,
) -> Generator[RunEvent, None, ModelResponse | None]:
    request = ModelRequest(
        cfg.system,
        _loop.MessageView(history, state.input, state.recorded),
        cfg.tool_specs,
        cfg.settings,
    )
    call = ctl.begin_call()
    response: ModelResponse | None = None
    try:
        yield ev(StepStart, step=used.steps + 1)
        stream = cfg.provider.stream(request, signal=call.signal)
        try:
            for item in stream:
                if not ctl.mark_emitted():
                    break
                if isinstance(item, ModelTextDelta):
                    if item.text:
                        yield ev(TextDelta, text=item.text)
                elif isinstance(item, ModelDone):
                    response = item.response
                elif not isinstance(item, ModelToolCallDelta):
                    raise ProviderError(
                        f"provider {type(cfg.provider).__name__} yielded "
                        f"{type(item).__name__}; expected ModelTextDelta, ModelToolCallDelta "
                        "or ModelDone"
                    )
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        ctl.end_call()
        raise
    except BaseException as exc:
        steered = ctl.end_call()
        if ctl.signal.aborted:
            raise _Aborted from exc
        if steered:
            return None
        if isinstance(exc, LoushoError) and not isinstance(exc, AbortedError):
            raise
        raise ProviderError(
            f"provider {type(cfg.provider).__name__} failed: {type(exc).__name__}: {exc}"
        ) from exc
    steered = ctl.end_call()
    if ctl.signal.aborted:
        raise _Aborted
    if steered:
        return None
    if response is None:
        raise ProviderError(
            f"provider {type(cfg.provider).__name__} ended its stream without ModelDone"
        )
    if response.message.role != "assistant":
        raise ProviderError(
            f"provider {type(cfg.provider).__name__} answered with a {response.message.role!r} "
            "message; expected 'assistant'"
        )
    return response


def _run_calls(
    cfg: TurnConfig,
    ctl: TurnControl,
    state: TurnState,
    calls: list[ToolCall],
    used: Counters,
    ev: _Emit,
) -> Generator[RunEvent, None, str | None]:
    """Run the step's unresolved calls in order. Returns "paused", a limit name, or None."""
    decisions = _decisions(cfg, state)
    paused = False
    for index, call in enumerate(calls):
        if ctl.signal.aborted:
            raise _Aborted
        if ctl.steer_requested():
            _skip(state, calls[index:], "skipped: the user sent a new message before it ran")
            _save(cfg, state, ctl, "running")
            return None
        tool = cfg.tools.get(call.name)
        if call.id in state.started and tool is not None and tool.on_interrupted == "report":
            yield from _record(cfg, ctl, state, call, _IN_DOUBT.format(call=call), True, ev)
            continue
        decision = decisions.get(call.id)
        if decision is None and tool is not None and tool.validate(call.arguments) is None:
            needs = tool.requires_approval(call.arguments)
            if needs:
                decision = yield from _ask(cfg, state, call, ev)
                if decision is None:
                    paused = True
                    continue
        if decision is not None and not decision[0]:
            reason = f": {decision[1]}" if decision[1] else ""
            yield from _record(cfg, ctl, state, call, f"denied by a human{reason}", True, ev)
            continue
        exceeded = _limit_tool(cfg.limits, used) or _limit_tool(
            cfg.session_limits, cfg.session_used + used
        )
        if exceeded:
            _skip(state, calls[index:], f"not run: the turn reached its limit {exceeded}")
            _save(cfg, state, ctl, "running")
            return exceeded
        yield ev(ToolCallStart, call=call)
        state.started.append(call.id)
        _save(cfg, state, ctl, "running")
        context = ToolContext(call=call, session_id=state.session_id, signal=ctl.signal)
        with ctl.otel.tool_call(call) as span:  # tracing (issue 18)
            text, is_error = run_tool(tool, call, context=context)
            span.tool_result(is_error, text)
        if ctl.signal.aborted:
            raise _Aborted
        used = used.add(tool_calls=1)
        yield from _record(cfg, ctl, state, call, text, is_error, ev)
    if paused:
        _save(cfg, state, ctl, "awaiting-approval")
        return "paused"
    state.pending_approvals.clear()
    return None


_IN_DOUBT = (
    "error: the call {call.id} to {call.name} was interrupted (the process stopped while it "
    "ran); it may or may not have taken effect, so it was not run again. Check before retrying."
)


def _record(
    cfg: TurnConfig,
    ctl: TurnControl,
    state: TurnState,
    call: ToolCall,
    text: str,
    is_error: bool,
    ev: _Emit,
) -> Generator[RunEvent, None, None]:
    state.recorded.append(Message("tool", text, tool_call_id=call.id, is_error=is_error))
    if call.id in state.started:
        state.started.remove(call.id)
    _save(cfg, state, ctl, "running")
    yield ev(ToolResultEvent, call_id=call.id, result=text, is_error=is_error)


def _skip(state: TurnState, calls: Sequence[ToolCall], text: str) -> None:
    for call in calls:
        state.recorded.append(Message("tool", text, tool_call_id=call.id, is_error=True))


def _decisions(cfg: TurnConfig, state: TurnState) -> dict[str, tuple[bool, str | None]]:
    """Decisions already taken on this turn's approvals, by call id (None while pending)."""
    out: dict[str, tuple[bool, str | None]] = {}
    if not state.pending_approvals or cfg.approval_store is None:
        return out
    still: list[str] = []
    for approval_id in state.pending_approvals:
        record = cfg.approval_store.get(approval_id)
        if record is None:
            continue
        if record.status == "pending":
            still.append(approval_id)
        else:
            out[record.call.id] = (record.status == "approved", record.reason)
    state.pending_approvals[:] = still
    return out


def _ask(
    cfg: TurnConfig, state: TurnState, call: ToolCall, ev: _Emit
) -> Generator[RunEvent, None, tuple[bool, str | None] | None]:
    """Ask for a decision: inline through ``approve``, or by an approval record (pause)."""
    if cfg.approval_store is not None:
        for approval_id in state.pending_approvals:
            record = cfg.approval_store.get(approval_id)
            if record is not None and record.call.id == call.id:
                return None  # still pending
    record = ApprovalRecord(
        id=new_id(),
        session_id=state.session_id,
        checkpoint_key=state.key or "",
        call=call,
    )
    if cfg.approve is not None:
        approved = bool(cfg.approve(record))
        return (approved, None)
    if cfg.approval_store is None or cfg.checkpoint_store is None or state.key is None:
        from .errors import ConfigError

        raise ConfigError(
            f"tool {call.name!r} needs approval, but this run has no approval store and "
            "checkpoint store to pause in: pass approval_store= and checkpoint_store= (or use "
            "an agent, which has in-memory ones), or an approve= callback"
        )
    cfg.approval_store.create(record)
    state.pending_approvals.append(record.id)
    yield ev(ApprovalRequested, approval_id=record.id, call=call)
    return None


class AgentExecutor:
    """Runs one turn without a session (what sessions are built on)."""

    @staticmethod
    def execute(
        input: object,
        *,
        provider: Provider,
        instructions: str | None = None,
        tools: Sequence[Tool] = (),
        history: Sequence[Message] = (),
        session_id: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        approval_store: ApprovalStore | None = None,
        limits: Limits | None = None,
        signal: Any = None,
        approve: ApproveCallback | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> ExecutionResult:
        """Run one turn over ``history``. With ``session_id`` and a ``checkpoint_store`` the
        turn is checkpointed under ``session_id``; an input of ``()`` with an existing
        checkpoint continues it (the resume path)."""
        from .inputs import to_messages

        control = TurnControl()
        cp = None
        if session_id is not None and checkpoint_store is not None:
            cp = checkpoint_store.load(session_id)
        if cp is not None and input in ((), [], None):
            state = TurnState.from_checkpoint(cp)
            control = TurnControl(cp.run_id)
            resumed = True
        else:
            state = TurnState(run_id=control.run_id, key=session_id, session_id=session_id,
                              input=to_messages(input))
            resumed = False
        cfg = TurnConfig(
            provider=provider,
            system=instructions,
            tools={t.name: t for t in tools},
            tool_specs=tuple(t.spec() for t in tools),
            settings=settings or {},
            limits=limits,
            checkpoint_store=checkpoint_store if session_id is not None else None,
            approval_store=approval_store,
            approve=approve,
        )
        unlink = signal.add_callback(lambda: control.abort(signal.reason)) if signal else None
        try:
            gen = run_turn(cfg, control, state, history, resumed=resumed)
            while True:
                try:
                    next(gen)
                except StopIteration as stop:
                    result: ExecutionResult = stop.value
                    break
        finally:
            if unlink is not None:
                unlink()
        if cfg.checkpoint_store is not None and session_id is not None and (
            result.finish_reason not in ("awaiting-approval", "aborted")
        ):
            cfg.checkpoint_store.delete(session_id)
        return result
