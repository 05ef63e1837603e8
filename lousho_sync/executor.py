"""The step loop: model call → tool calls → results → next model call, as a generator of
events. It performs the I/O of one turn's steps (provider, tools, checkpoint and approval
writes through a :class:`~lousho_sync._writes.TurnWriter`); the decisions it takes are in
:mod:`lousho_sync._loop` and :mod:`lousho_sync.limits`. How a turn starts, resumes and ends
— and what becomes of its checkpoint — is :mod:`lousho_sync.turns`.

One turn is driven by whoever pulls its events (``AgentRun`` iteration, ``result()`` or
``send()``), so no thread is started per turn; the caller says whether events are built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import attrs

from . import _loop, _otel
from ._turnlog import LoggedHooks
from ._writes import TurnWriter
from .control import TurnControl, new_id
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
from .tools import Tool, ToolContext, run_tool

__all__ = [
    "ApproveCallback",
    "TurnAborted",
    "TurnConfig",
    "TurnEnv",
    "TurnState",
    "cost_required",
    "result_of",
    "steps",
]

_log = logging.getLogger(__name__)

ApproveCallback = Callable[[ApprovalRecord], bool]


@attrs.frozen(slots=True, kw_only=True)
class TurnConfig:
    """What every turn of an agent shares: built once by the agent, never changed."""

    provider: Provider
    system: str | None = None
    tools: Mapping[str, Tool] = attrs.field(factory=dict)
    tool_specs: tuple[ToolSpec, ...] = ()
    settings: Mapping[str, Any] = attrs.field(factory=dict)
    limits: Limits | None = None
    prices: Mapping[str, Price] | None = None


@attrs.frozen(slots=True, kw_only=True)
class TurnEnv:
    """What one turn adds to its agent's config: where it writes, how approvals are
    decided, and the session budget it counts against."""

    writer: TurnWriter
    approve: ApproveCallback | None = None
    session_limits: Limits | None = None
    session_used: Counters = Counters()
    durable: bool = True
    """False: write a checkpoint only to pause on an approval (runs nobody can resume)."""


def cost_required(cfg: TurnConfig, env: TurnEnv) -> bool:
    """Whether a cost limit is set (then every model call must have a known cost)."""
    return (cfg.limits is not None and cfg.limits.max_cost_usd is not None) or (
        env.session_limits is not None and env.session_limits.max_cost_usd is not None
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


class TurnAborted(Exception):
    """Raised inside the step loop when the turn's signal is aborted."""


def _save(env: TurnEnv, state: TurnState, ctl: TurnControl, status: str) -> None:
    if not env.durable and status != "awaiting-approval":
        return
    writer = env.writer
    if writer.checkpoints is not None and writer.key is not None:
        if ctl.otel is _otel.OFF:
            writer.save(state.checkpoint(status, ctl.queued()))
        else:  # tracing or DEBUG logging (issue 18)
            with ctl.otel.checkpoint(status):
                writer.save(state.checkpoint(status, ctl.queued()))


def steps(
    cfg: TurnConfig,
    env: TurnEnv,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    *,
    emit: bool,
    resumed: bool = False,
) -> Generator[RunEvent, None, ExecutionResult]:
    """Run (or continue) one turn, yielding its events when ``emit`` (else none are built);
    returns its result. Raises TurnAborted on abort and any failure as it is: what becomes
    of the checkpoint is decided by the caller (:mod:`lousho_sync.turns`)."""
    # --- observability (issue 18): spans when a tracer provider is set, DEBUG records.
    # A plain function (no generator layer when both are off): called where the turn is
    # driven, so the turn's span starts, and finds its parent, in the driving context.
    body = _turn(cfg, env, ctl, state, history, emit, resumed)
    trace = _otel.turn(cfg.provider, state.session_id, ctl.run_id)
    logged = _log.isEnabledFor(logging.DEBUG)
    if trace is None and not logged:
        return body
    if trace is not None:
        ctl.otel = trace
        body = trace.run(body, aborted=TurnAborted)
    if logged:
        ctl.otel = hooks = LoggedHooks(ctl.otel, _log, state.session_id, ctl.run_id)
        body = hooks.run(body, aborted=TurnAborted)
    return body


def _turn(
    cfg: TurnConfig,
    env: TurnEnv,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    emit: bool,
    resumed: bool,
) -> Generator[RunEvent, None, ExecutionResult]:
    ev = _Emit(ctl, emit)
    if not resumed:
        _save(env, state, ctl, "running")  # the turn is durable before run.start
    yield from ev(RunStart, session_id=state.session_id, input=state.input)
    result = yield from _steps(cfg, env, ctl, state, history, ev)
    return result


class _Emit:
    """Builds the run's events, or none when nobody can read them (``emit=False``)."""

    __slots__ = ("_ctl", "_emit", "_run_id")

    def __init__(self, ctl: TurnControl, emit: bool) -> None:
        self._ctl = ctl
        self._run_id = ctl.run_id
        self._emit = emit

    def __call__(self, cls: Callable[..., RunEvent], **fields: Any) -> tuple[RunEvent, ...]:
        if not self._emit:
            return ()
        return (cls(run_id=self._run_id, seq=self._ctl.next_seq(), **fields),)


def result_of(
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
    env: TurnEnv,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    ev: _Emit,
) -> Generator[RunEvent, None, ExecutionResult]:
    used = state.counters()
    finish = "stop"
    while True:
        if ctl.signal.aborted:
            raise TurnAborted
        calls = _loop.unresolved_calls(state.recorded)
        if calls:
            if ctl.left:  # tools left to run and nobody reads: abort
                raise TurnAborted
            outcome = yield from _run_calls(cfg, env, ctl, state, calls, used, ev)
            used = state.counters()
            if outcome == "paused":
                ctl.close()
                return result_of(state, ctl, "awaiting-approval")
            if outcome is not None:
                ctl.close()
                return result_of(state, ctl, "limit", exceeded=outcome)
        elif _loop.ends_with_answer(state.recorded) and ctl.close_if_idle():
            return result_of(state, ctl, finish)
        exceeded = _limit_model(cfg.limits, used) or _limit_model(
            env.session_limits, env.session_used + used
        )
        if exceeded:
            ctl.close()
            return result_of(state, ctl, "limit", exceeded=exceeded)
        if ctl.left:  # another model call and nobody reads: abort
            raise TurnAborted
        yield from _apply_queued(env, ctl, state, ev)
        response = yield from ctl.otel.model_call(  # tracing (issue 18)
            _model_call(cfg, ctl, state, history, used, ev), used.steps + 1
        )
        if response is None:  # steered: make the call again with the new input
            continue
        usage = cost_of(
            response.message.usage or Usage(), response.model, cfg.prices,
            required=cost_required(cfg, env),
        )
        message = response.message
        if message.usage is not usage:
            message = Message(
                message.role, message.content, message.tool_calls, message.tool_call_id,
                message.is_error, usage, message.metadata, extra=message.extra,
            )
        state.recorded.append(message)
        ctl.may_finish = not message.tool_calls
        state.usage = state.usage + usage
        used = used.add(steps=1, usage=usage)
        yield from ev(UsageEvent, usage=usage, total=state.usage)
        finish = "length" if response.finish_reason == "length" else "stop"
        if message.tool_calls:
            _save(env, state, ctl, "running")


def _apply_queued(
    env: TurnEnv, ctl: TurnControl, state: TurnState, ev: _Emit
) -> Generator[RunEvent, None, None]:
    if not ctl.has_queued():
        return
    for announced in ctl.take_announcements():
        yield from ev(InputQueued, input=announced)
    queued, _ = ctl.take_queued()
    if queued:
        state.recorded.extend(queued)
        _save(env, state, ctl, "running")
        yield from ev(InputApplied, input=tuple(queued))


def _model_call(
    cfg: TurnConfig,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    used: Counters,
    ev: _Emit,
) -> Generator[RunEvent, None, ModelResponse | None]:
    """One model call (None when a steer aborted it). A stream that breaks mid-way with a
    retryable error is made again, within the provider's retry budget, as long as no
    reader has been handed a text delta of it (never, when nobody reads the events)."""
    request = ModelRequest(
        cfg.system,
        _loop.MessageView(history, state.input, state.recorded),
        cfg.tool_specs,
        cfg.settings,
    )
    budget = _retry_budget(cfg.provider)
    attempt = 0
    while True:
        seen = _Seen()
        try:
            step = used.steps + 1 if attempt == 0 else None
            response = yield from _stream_once(cfg, ctl, request, ev, seen, step)
            return response
        except ProviderError as exc:
            if not (exc.retryable and seen.received and not seen.handed and attempt < budget):
                raise
            attempt += 1
            _log.warning("provider %s: the stream broke mid-way (%s) before any reader saw "
                         "it; making the call again (%d of %d)", type(cfg.provider).__name__,
                         exc, attempt, budget)


def _ends_the_answer(item: object) -> bool:
    """Whether ``item`` adds nothing a reader would have seen (the call's end, or empty
    text)."""
    return isinstance(item, ModelDone) or (isinstance(item, ModelTextDelta) and not item.text)


def _retry_budget(provider: object) -> int:
    budget = getattr(provider, "max_retries", 2)
    return budget if isinstance(budget, int) and budget >= 0 else 2


class _Seen:
    """What one attempt of a model call delivered: anything at all, and text to a reader."""

    __slots__ = ("handed", "received")

    def __init__(self) -> None:
        self.received = False
        self.handed = False


def _stream_once(
    cfg: TurnConfig,
    ctl: TurnControl,
    request: ModelRequest,
    ev: _Emit,
    seen: _Seen,
    step: int | None,
) -> Generator[RunEvent, None, ModelResponse | None]:
    call = ctl.begin_call()
    response: ModelResponse | None = None
    try:
        if step is not None:  # a steer while the reader holds step.start aborts this call
            yield from ev(StepStart, step=step)
        stream = cfg.provider.stream(request, signal=call.signal)
        try:
            for item in stream:
                seen.received = True
                if ctl.left and not _ends_the_answer(item):
                    raise TurnAborted  # the reader left before the answer was complete
                if not ctl.mark_emitted():
                    break
                if isinstance(item, ModelTextDelta):
                    if item.text:
                        for event in ev(TextDelta, text=item.text):
                            seen.handed = True
                            ctl.may_finish = True  # a reader leaving now may keep it
                            yield event
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
    except (KeyboardInterrupt, SystemExit, GeneratorExit, TurnAborted):
        ctl.end_call()
        raise
    except BaseException as exc:
        steered = ctl.end_call()
        if ctl.signal.aborted:
            raise TurnAborted from exc
        if steered:
            return None
        if isinstance(exc, LoushoError) and not isinstance(exc, AbortedError):
            raise
        raise ProviderError(
            f"provider {type(cfg.provider).__name__} failed: {type(exc).__name__}: {exc}"
        ) from exc
    steered = ctl.end_call()
    if ctl.signal.aborted:
        raise TurnAborted
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
    env: TurnEnv,
    ctl: TurnControl,
    state: TurnState,
    calls: list[ToolCall],
    used: Counters,
    ev: _Emit,
) -> Generator[RunEvent, None, str | None]:
    """Run the step's unresolved calls in order. Returns "paused", a limit name, or None."""
    decisions = _decisions(env, state)
    paused = False
    for index, call in enumerate(calls):
        if ctl.signal.aborted:
            raise TurnAborted
        if ctl.steer_requested():
            _skip(state, calls[index:], "skipped: the user sent a new message before it ran")
            _save(env, state, ctl, "running")
            return None
        tool = cfg.tools.get(call.name)
        if call.id in state.started and tool is not None and tool.on_interrupted == "report":
            yield from _record(env, ctl, state, call, _IN_DOUBT.format(call=call), True, ev)
            continue
        decision = decisions.get(call.id)
        if decision is None and tool is not None and tool.validate(call.arguments) is None:
            needs = tool.requires_approval(call.arguments)
            if needs:
                decision = yield from _ask(env, state, call, ev)
                if decision is None:
                    paused = True
                    continue
        if decision is not None and not decision[0]:
            reason = f": {decision[1]}" if decision[1] else ""
            yield from _record(env, ctl, state, call, f"denied by a human{reason}", True, ev)
            continue
        exceeded = _limit_tool(cfg.limits, used) or _limit_tool(
            env.session_limits, env.session_used + used
        )
        if exceeded:
            _skip(state, calls[index:], f"not run: the turn reached its limit {exceeded}")
            _save(env, state, ctl, "running")
            return exceeded
        yield from ev(ToolCallStart, call=call)
        state.started.append(call.id)
        _save(env, state, ctl, "running")
        context = ToolContext(call=call, session_id=state.session_id, signal=ctl.signal)
        with ctl.otel.tool_call(call) as span:  # tracing (issue 18)
            text, is_error = run_tool(tool, call, context=context)
            span.tool_result(is_error, text)
        if ctl.signal.aborted:
            raise TurnAborted
        used = used.add(tool_calls=1)
        yield from _record(env, ctl, state, call, text, is_error, ev)
    if paused:
        ctl.drop_queued()  # input not applied yet leaves no trace: its callers get an error
        _save(env, state, ctl, "awaiting-approval")
        return "paused"
    state.pending_approvals.clear()
    return None


_IN_DOUBT = (
    "error: the call {call.id} to {call.name} was interrupted (the process stopped while it "
    "ran); it may or may not have taken effect, so it was not run again. Check before retrying."
)


def _record(
    env: TurnEnv,
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
    _save(env, state, ctl, "running")
    yield from ev(ToolResultEvent, call_id=call.id, result=text, is_error=is_error)


def _skip(state: TurnState, calls: Sequence[ToolCall], text: str) -> None:
    for call in calls:
        state.recorded.append(Message("tool", text, tool_call_id=call.id, is_error=True))


def _decisions(env: TurnEnv, state: TurnState) -> dict[str, tuple[bool, str | None]]:
    """Decisions already taken on this turn's approvals, by call id (None while pending)."""
    out: dict[str, tuple[bool, str | None]] = {}
    approvals = env.writer.approvals
    if not state.pending_approvals or approvals is None:
        return out
    still: list[str] = []
    for approval_id in state.pending_approvals:
        record = approvals.get(approval_id)
        if record is None:
            continue
        if record.status == "pending":
            still.append(approval_id)
        else:
            out[record.call.id] = (record.status == "approved", record.reason)
    state.pending_approvals[:] = still
    return out


def _ask(
    env: TurnEnv, state: TurnState, call: ToolCall, ev: _Emit
) -> Generator[RunEvent, None, tuple[bool, str | None] | None]:
    """Ask for a decision: inline through ``approve``, or by an approval record (pause)."""
    writer = env.writer
    if writer.approvals is not None:
        for approval_id in state.pending_approvals:
            record = writer.approvals.get(approval_id)
            if record is not None and record.call.id == call.id:
                return None  # still pending
    record = ApprovalRecord(
        id=new_id(),
        session_id=state.session_id,
        checkpoint_key=state.key or "",
        call=call,
    )
    if env.approve is not None:
        approved = bool(env.approve(record))
        return (approved, None)
    if writer.approvals is None or not writer.durable:
        from .errors import ConfigError

        raise ConfigError(
            f"tool {call.name!r} needs approval, but this run has no approval store and "
            "checkpoint store to pause in: pass approval_store= and checkpoint_store= (or use "
            "an agent, which has in-memory ones), or an approve= callback"
        )
    writer.create_approval(record)
    state.pending_approvals.append(record.id)
    yield from ev(ApprovalRequested, approval_id=record.id, call=call)
    return None
