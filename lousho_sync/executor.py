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
from collections.abc import Generator, Sequence

from . import _loop, _otel
from ._tool_run import tool_loop
from ._turnlog import LoggedHooks
from .control import TurnControl
from .errors import AbortedError, ConfigError, LoushoError, ProviderError
from .events import InputApplied, InputQueued, RunEvent, RunStart, StepStart, TextDelta, UsageEvent
from .limits import Counters, cost_of, no_price_error, price_for
from .limits import exceeded_before_model_call as _limit_model
from .messages import Message, Usage
from .providers.base import (
    ModelDone,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ModelToolCallDelta,
)
from .results import ExecutionResult
from .tool_calls import run_calls
from .tools import async_refusal
from .turn_state import (
    Emit,
    TurnAborted,
    TurnConfig,
    TurnEnv,
    TurnState,
    cost_required,
    result_of,
    save,
)

__all__ = ["steps"]

_log = logging.getLogger(__name__)


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
    ev = Emit(ctl, emit)
    if cfg.async_tools and tool_loop() is None:  # before anything is paid for or written
        raise ConfigError(async_refusal(cfg.async_tools[0]))
    if cfg.model is not None and cost_required(cfg, env) and (
        price_for(cfg.model, cfg.prices) is None
    ):
        raise no_price_error(cfg.model)  # never after a paid model call
    if not resumed:
        save(env, state, ctl, "running")  # the turn is durable before run.start
    yield from ev(RunStart, session_id=state.session_id, input=state.input)
    result = yield from _steps(cfg, env, ctl, state, history, ev)
    return result


def _steps(
    cfg: TurnConfig,
    env: TurnEnv,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    ev: Emit,
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
            outcome = yield from run_calls(cfg, env, ctl, state, calls, used, ev)
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
            required=cost_required(cfg, env), configured=cfg.model,
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
            save(env, state, ctl, "running")


def _apply_queued(
    env: TurnEnv, ctl: TurnControl, state: TurnState, ev: Emit
) -> Generator[RunEvent, None, None]:
    if not ctl.has_queued():
        return
    for announced in ctl.take_announcements():
        yield from ev(InputQueued, input=announced)
    queued, _ = ctl.take_queued()
    if queued:
        state.recorded.extend(queued)
        save(env, state, ctl, "running")
        yield from ev(InputApplied, input=tuple(queued))


def _model_call(
    cfg: TurnConfig,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    used: Counters,
    ev: Emit,
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
    attempt = 0
    while True:
        seen = _Seen()
        try:
            step = used.steps + 1 if attempt == 0 else None
            response = yield from _stream_once(cfg, ctl, request, ev, seen, step)
            return response
        except ProviderError as exc:
            if not (exc.retryable and seen.received and not seen.handed):
                raise
            budget = _retry_budget(cfg.provider)
            if attempt >= budget:
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
    ev: Emit,
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


