"""One running turn: the :class:`Turn` object and its step loop — model call → tool calls →
results → next model call, as a generator of events.

A :class:`Turn` holds what every step needs (the agent's :class:`TurnConfig`, the turn's
:class:`TurnEnv` with its :class:`TurnWriter`, the live :class:`TurnControl`, the mutable
:class:`TurnState`, the history it continues, and whether events are built) and offers the
few things the steps do over and over: ``save`` a checkpoint, ``record`` a tool result,
``emit`` an event, build the ``result``. It performs the I/O of the turn's steps (provider,
tools, checkpoint and approval writes); how a turn starts, resumes and ends — and what
becomes of its checkpoint — is :mod:`lousho_sync.turns`.

One turn is driven by whoever pulls its events (``AgentRun`` iteration, ``result()`` or
``send()``), so no thread is started per turn; the caller says whether events are built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, overload

import attrs

from . import _otel
from ._lease_hold import LeaseHold
from ._tool_run import tool_loop
from ._turnlog import LoggedHooks
from .approvals import EXPIRED_REASON, settle
from .control import TurnControl, new_id
from .errors import AbortedError, ConfigError, LoushoError, ProviderError
from .events import (
    ApprovalRequested,
    InputApplied,
    InputQueued,
    RunEvent,
    RunStart,
    StepReset,
    StepStart,
    TextDelta,
    ToolCallStart,
    ToolResultEvent,
    UsageEvent,
)
from .limits import Counters, Limits, cost_of, no_price_error, price_for
from .limits import exceeded_before_model_call as _limit_model
from .limits import exceeded_before_tool_call as _limit_tool
from .messages import Message, ToolCall, Usage
from .providers.base import (
    ModelDone,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ModelToolCallDelta,
)
from .records import ApprovalRecord, Checkpoint, now
from .results import ExecutionResult
from .stores.base import ApprovalStore, CheckpointStore, supports_fencing
from .tools import ToolContext, async_refusal, run_tool
from .turn_state import ApproveCallback, TurnConfig, TurnState

__all__ = [
    "MessageView",
    "Turn",
    "TurnAborted",
    "TurnEnv",
    "TurnWriter",
    "checkpoint_of",
    "final_text",
]

_log = logging.getLogger(__name__)


class TurnAborted(Exception):
    """Raised inside the step loop when the turn's signal is aborted."""


# --- where a turn writes ---------------------------------------------------------------------
class TurnWriter:
    """The checkpoint and approval writes of turns; a no-op where there is no store.

    Each write first asks the lease hold (if any) for its fence, so a turn whose lease was
    lost stops before writing; stores that check fences also refuse a stale one atomically.
    """

    __slots__ = ("approvals", "checkpoints", "fences", "hold", "wrote")

    def __init__(
        self,
        checkpoints: CheckpointStore | None,
        approvals: ApprovalStore | None,
        hold: LeaseHold | None = None,
        *,
        fences: tuple[bool, ...] | None = None,
    ) -> None:
        self.checkpoints = checkpoints
        self.approvals = approvals
        self.hold = hold
        self.wrote = False  # a checkpoint write was attempted (it may have landed)
        self.fences = fences if fences is not None or hold is None else (
            supports_fencing(checkpoints), supports_fencing(approvals))
        """Whether the checkpoint and the approval store take ``fence=`` (given by a caller
        that checked once; looked up only when there is a lease to fence with)."""

    @property
    def durable(self) -> bool:
        """Whether there is somewhere to keep a checkpoint."""
        return self.checkpoints is not None

    def _fence(self, which: int) -> dict[str, Any]:
        if self.hold is None:
            return {}
        fence = self.hold.fence()
        fences = self.fences
        return {"fence": fence} if fence is not None and fences and fences[which] else {}

    def save(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` under its key."""
        store = self.checkpoints
        if store is not None:
            fence = self._fence(0)
            self.wrote = True
            store.save(checkpoint.key, checkpoint, **fence)

    def delete(self, key: str | None) -> None:
        """Delete the checkpoint ``key`` (nothing when None)."""
        store = self.checkpoints
        if store is not None and key is not None:
            store.delete(key, **self._fence(0))

    def create_approval(self, record: ApprovalRecord) -> None:
        """Store a new pending approval record."""
        store = self.approvals
        assert store is not None
        store.create(record, **self._fence(1))


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
    saved_first: bool = False
    """The turn's first ``running`` checkpoint was written with the lease (not again)."""


# --- pure decisions of the step loop ---------------------------------------------------------
class MessageView(Sequence[Message]):
    """A read-only concatenation of list prefixes, built in O(1).

    The transcript and a turn's messages are append-only lists; a view fixes each one's
    length when it is made, so it never changes afterwards and nothing is copied.
    """

    __slots__ = ("_len", "_parts")

    def __init__(self, *parts: Sequence[Message]) -> None:
        self._parts = tuple((p, len(p)) for p in parts if len(p))
        self._len = sum(n for _, n in self._parts)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Message]:
        for part, n in self._parts:
            for i in range(n):
                yield part[i]

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("message index out of range")
        for part, n in self._parts:
            if index < n:
                return part[index]
            index -= n
        raise IndexError("message index out of range")  # pragma: no cover

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, MessageView)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MessageView({list(self)!r})"


def _unresolved_calls(recorded: Sequence[Message]) -> list[ToolCall]:
    """Tool calls of the last assistant message in ``recorded`` that have no result yet."""
    for i in range(len(recorded) - 1, -1, -1):
        message = recorded[i]
        if message.role == "assistant":
            if not message.tool_calls:
                return []
            done = {m.tool_call_id for m in recorded[i + 1 :] if m.role == "tool"}
            return [c for c in message.tool_calls if c.id not in done]
    return []


def final_text(messages: Sequence[Message]) -> str:
    """The text of the last assistant message ("" if none)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            return messages[i].text
    return ""


_IN_DOUBT = (
    "error: the call {call.id} to {call.name} was interrupted (the process stopped while it "
    "ran); it may or may not have taken effect, so it was not run again. Check before retrying."
)


def checkpoint_of(state: TurnState, ctl: TurnControl, status: str) -> Checkpoint:
    """A checkpoint of the turn ``state`` as it stands (``ctl``'s queued input included)."""
    assert state.key is not None
    return Checkpoint(
        key=state.key,
        session_id=state.session_id,
        run_id=state.run_id,
        turn_index=state.turn_index,
        input=state.input,
        recorded=tuple(state.recorded),
        started_call_ids=tuple(state.started),
        queued_inputs=tuple(ctl.queued()),
        pending_approval_ids=tuple(state.pending_approvals),
        usage=state.usage,
        status=status,  # type: ignore[arg-type]
        created_at=state.created_at,
        updated_at=now(),
        extra=state.extra,
    )


# --- the turn ------------------------------------------------------------------------------
class Turn:
    """One running turn (see the module docstring). Not thread-safe: driven by one thread
    at a time, through its generator; other threads reach it only through ``ctl``."""

    __slots__ = ("_hooks", "cfg", "ctl", "emits", "env", "history", "state")

    def __init__(
        self,
        cfg: TurnConfig,
        env: TurnEnv,
        ctl: TurnControl,
        state: TurnState,
        history: Sequence[Message] = (),
        *,
        emit: bool,
    ) -> None:
        self.cfg = cfg
        self.env = env
        self.ctl = ctl
        self.state = state
        self.history = history
        self.emits = emit
        self._hooks: _otel.Hooks = _otel.OFF  # tracing/logging hooks (issue 18)

    # --- what the steps do over and over ---------------------------------------------------
    def checkpoint(self, status: str) -> Checkpoint:
        """A checkpoint of the turn as it stands (its queued input included)."""
        return checkpoint_of(self.state, self.ctl, status)

    def save(self, status: str) -> None:
        """Write the turn's checkpoint with ``status`` (only an approval pause when the turn
        is not durable)."""
        env = self.env
        if not env.durable and status != "awaiting-approval":
            return
        writer = env.writer
        if writer.checkpoints is not None and self.state.key is not None:
            if self._hooks is _otel.OFF:
                writer.save(self.checkpoint(status))
            else:  # tracing or DEBUG logging (issue 18)
                with self._hooks.checkpoint(status):
                    writer.save(self.checkpoint(status))

    def emit(self, cls: Callable[..., RunEvent], **fields: Any) -> tuple[RunEvent, ...]:
        """The event ``cls(**fields)`` of this run, or none when nobody can read events
        (the control's ``sink``, when set, gets it either way)."""
        ctl = self.ctl
        sink = ctl.sink
        if not self.emits:
            if sink is not None:
                sink(cls(run_id=ctl.run_id, seq=ctl.next_seq(), **fields))
            return ()
        event = cls(run_id=ctl.run_id, seq=ctl.next_seq(), **fields)
        if sink is not None:
            sink(event)
        return (event,)

    def record(self, call: ToolCall, text: str, is_error: bool) -> Generator[RunEvent, None, None]:
        """Record the result of ``call`` (checkpointed) and announce it."""
        state = self.state
        state.recorded.append(Message("tool", text, tool_call_id=call.id, is_error=is_error))
        if call.id in state.started:
            state.started.remove(call.id)
        self.save("running")
        yield from self.emit(ToolResultEvent, call_id=call.id, result=text, is_error=is_error)

    def result(
        self,
        finish: str,
        *,
        messages: tuple[Message, ...] | None = None,
        exceeded: str | None = None,
    ) -> ExecutionResult:
        """The turn's result as it stands, ending with ``finish``."""
        state = self.state
        msgs = (*state.input, *state.recorded) if messages is None else messages
        approvals = tuple(state.pending_approvals) if finish == "awaiting-approval" else ()
        return ExecutionResult(
            text=final_text(msgs),
            finish_reason=finish,
            messages=msgs,
            usage=state.usage,
            steps=sum(1 for m in state.recorded if m.role == "assistant"),
            run_id=self.ctl.run_id,
            approval_id=approvals[0] if approvals else None,
            approval_ids=approvals,
            exceeded=exceeded,
        )

    def counters(self) -> Counters:
        """Steps, tool calls and usage of the turn so far (derived from ``recorded``)."""
        recorded = self.state.recorded
        steps = sum(1 for m in recorded if m.role == "assistant")
        tools = sum(1 for m in recorded if m.role == "tool")
        return Counters(steps, tools, self.state.usage)

    def has_progress(self) -> bool:
        """Whether the turn recorded a model response or a tool result (applied queued input
        alone is not progress)."""
        return any(m.role != "user" for m in self.state.recorded)

    def _exceeded(
        self, check: Callable[[Limits | None, Counters], str | None], used: Counters
    ) -> str | None:
        """The limit ``check`` finds reached by the turn's count ``used``, else by the
        session's (its sum made only when the session has a budget: once per step)."""
        exceeded = check(self.cfg.limits, used)
        session = self.env.session_limits
        if exceeded is None and session is not None:
            exceeded = check(session, self.env.session_used + used)
        return exceeded

    def _cost_required(self) -> bool:
        """Whether a cost limit is set (then every model call must have a known cost)."""
        limits, session = self.cfg.limits, self.env.session_limits
        return (limits is not None and limits.max_cost_usd is not None) or (
            session is not None and session.max_cost_usd is not None
        )

    # --- the step loop -------------------------------------------------------------------
    def steps(self, *, resumed: bool = False) -> Generator[RunEvent, None, ExecutionResult]:
        """Run (or continue) the turn, yielding its events when it emits (else none are
        built); returns its result. Raises TurnAborted on abort and any failure as it is:
        what becomes of the checkpoint is decided by the caller (:mod:`lousho_sync.turns`).
        """
        # --- observability (issue 18): spans when a tracer provider is set, DEBUG records.
        # A plain method (no generator layer when both are off): called where the turn is
        # driven, so the turn's span starts, and finds its parent, in the driving context.
        body = self._turn(resumed)
        state, run_id = self.state, self.ctl.run_id
        trace = _otel.turn(self.cfg.provider, state.session_id, run_id)
        logged = _log.isEnabledFor(logging.DEBUG)
        if trace is None and not logged:
            return body
        if trace is not None:
            self._hooks = trace
            body = trace.run(body, aborted=TurnAborted)
        if logged:
            self._hooks = hooks = LoggedHooks(self._hooks, _log, state.session_id, run_id)
            body = hooks.run(body, aborted=TurnAborted)
        return body

    def _turn(self, resumed: bool) -> Generator[RunEvent, None, ExecutionResult]:
        cfg = self.cfg
        if cfg.async_tools and tool_loop() is None:  # before anything is paid for or written
            raise ConfigError(async_refusal(cfg.async_tools[0]))
        if cfg.model is not None and self._cost_required() and (
            price_for(cfg.model, cfg.prices) is None
        ):
            raise no_price_error(cfg.model)  # never after a paid model call
        if resumed:  # made again from its checkpoint: readers drop the interrupted step
            yield from self.emit(StepReset, step=self.counters().steps + 1)
        else:
            if not self.env.saved_first:  # (else written with the lease)
                self.save("running")  # the turn is durable before run.start
            yield from self.emit(RunStart, session_id=self.state.session_id,
                                 input=self.state.input)
        result = yield from self._steps()
        return result

    def _steps(self) -> Generator[RunEvent, None, ExecutionResult]:
        cfg, ctl, state = self.cfg, self.ctl, self.state
        used = self.counters()
        finish = "stop"
        while True:
            if ctl.signal.aborted:
                raise TurnAborted
            recorded = state.recorded
            calls = _unresolved_calls(recorded)
            if calls:
                if ctl.left:  # tools left to run and nobody reads: abort
                    raise TurnAborted
                outcome = yield from self._run_calls(calls, used)
                used = self.counters()
                if outcome == "paused":
                    ctl.close()
                    return self.result("awaiting-approval")
                if outcome is not None:
                    ctl.close()
                    return self.result("limit", exceeded=outcome)
            elif (recorded and recorded[-1].role == "assistant" and not recorded[-1].tool_calls
                  and ctl.close_if_idle()):  # the answer, and no input waits
                return self.result(finish)
            exceeded = self._exceeded(_limit_model, used)
            if exceeded:
                ctl.close()
                return self.result("limit", exceeded=exceeded)
            if ctl.left:  # another model call and nobody reads: abort
                raise TurnAborted
            if ctl.has_queued():
                yield from self._apply_queued()
            call = self._model_call(used)
            if self._hooks is not _otel.OFF:  # tracing (issue 18)
                call = self._hooks.model_call(call, used.steps + 1)
            response = yield from call
            if response is None:  # steered: make the call again with the new input
                continue
            usage = cost_of(
                response.message.usage or Usage(), response.model, cfg.prices,
                required=self._cost_required(), configured=cfg.model,
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
            yield from self.emit(UsageEvent, usage=usage, total=state.usage)
            finish = "length" if response.finish_reason == "length" else "stop"
            if message.tool_calls:
                self.save("running")

    def _apply_queued(self) -> Generator[RunEvent, None, None]:
        ctl = self.ctl
        for announced in ctl.take_announcements():
            yield from self.emit(InputQueued, input=announced)
        queued, _ = ctl.take_queued()
        if queued:
            self.state.recorded.extend(queued)
            self.save("running")
            yield from self.emit(InputApplied, input=tuple(queued))

    # --- one model call ------------------------------------------------------------------
    def _model_call(self, used: Counters) -> Generator[RunEvent, None, ModelResponse | None]:
        """One model call (None when a steer aborted it). A stream that breaks mid-way with a
        retryable error is made again, within the provider's retry budget, as long as no
        reader has been handed a text delta of it (never, when nobody reads the events)."""
        cfg, state = self.cfg, self.state
        request = ModelRequest(
            cfg.system,
            MessageView(self.history, state.input, state.recorded),
            cfg.tool_specs,
            cfg.settings,
        )
        attempt = 0
        while True:
            seen = _Seen()
            try:
                step = used.steps + 1 if attempt == 0 else None
                response = yield from self._stream_once(request, seen, step)
                return response
            except ProviderError as exc:
                if not (exc.retryable and seen.received and not seen.handed):
                    raise
                budget = _retry_budget(cfg.provider)
                if attempt >= budget:
                    raise
                attempt += 1
                _log.warning("provider %s: the stream broke mid-way (%s) before any reader "
                             "saw it; making the call again (%d of %d)",
                             type(cfg.provider).__name__, exc, attempt, budget)

    def _stream_once(
        self, request: ModelRequest, seen: _Seen, step: int | None
    ) -> Generator[RunEvent, None, ModelResponse | None]:
        ctl, provider = self.ctl, self.cfg.provider
        call = ctl.begin_call()
        response: ModelResponse | None = None
        try:
            if step is not None:  # a steer while the reader holds step.start aborts this call
                yield from self.emit(StepStart, step=step)
            stream = provider.stream(request, signal=call.signal)
            try:
                for item in stream:
                    seen.received = True
                    if ctl.left and not _ends_the_answer(item):
                        raise TurnAborted  # the reader left before the answer was complete
                    if not ctl.mark_emitted():
                        break
                    if isinstance(item, ModelTextDelta):
                        if item.text:
                            for event in self.emit(TextDelta, text=item.text):
                                seen.handed = True
                                ctl.may_finish = True  # a reader leaving now may keep it
                                yield event
                    elif isinstance(item, ModelDone):
                        response = item.response
                    elif not isinstance(item, ModelToolCallDelta):
                        raise ProviderError(
                            f"provider {type(provider).__name__} yielded "
                            f"{type(item).__name__}; expected ModelTextDelta, "
                            "ModelToolCallDelta or ModelDone"
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
                f"provider {type(provider).__name__} failed: {type(exc).__name__}: {exc}"
            ) from exc
        steered = ctl.end_call()
        if ctl.signal.aborted:
            raise TurnAborted
        if steered:
            return None
        if response is None:
            raise ProviderError(
                f"provider {type(provider).__name__} ended its stream without ModelDone"
            )
        if response.message.role != "assistant":
            raise ProviderError(
                f"provider {type(provider).__name__} answered with a "
                f"{response.message.role!r} message; expected 'assistant'"
            )
        return response

    # --- one step's tool calls -----------------------------------------------------------
    def _run_calls(
        self, calls: list[ToolCall], used: Counters
    ) -> Generator[RunEvent, None, str | None]:
        """Run the step's unresolved calls in order: approvals (inline or by pausing),
        limits, the ``report`` rule for calls in doubt. Returns "paused", a limit name, or
        None."""
        cfg, ctl, state = self.cfg, self.ctl, self.state
        decisions = self._decisions()
        paused = False
        asked: list[ApprovalRecord] = []
        for index, call in enumerate(calls):
            if ctl.signal.aborted:
                raise TurnAborted
            if ctl.steer_requested():
                self._skip(calls[index:], "skipped: the user sent a new message before it ran")
                self.save("running")
                return None
            tool = cfg.tools.get(call.name)
            if call.id in state.started and tool is not None and tool.on_interrupted == "report":
                yield from self.record(call, _IN_DOUBT.format(call=call), True)
                continue
            decision = decisions.get(call.id)
            if decision is None and tool is not None and tool.validate(call.arguments) is None:
                needs = tool.requires_approval(call.arguments)
                if needs:
                    decision = yield from self._ask(call, asked)
                    if decision is None:
                        paused = True
                        continue
            if decision is not None and not decision[0]:
                if decision[1] == EXPIRED_REASON:
                    text = "denied: the request for approval expired before anyone decided"
                else:
                    text = "denied by a human" + (f": {decision[1]}" if decision[1] else "")
                yield from self.record(call, text, True)
                continue
            exceeded = self._exceeded(_limit_tool, used)
            if exceeded:
                self._skip(calls[index:], f"not run: the turn reached its limit {exceeded}")
                self.save("running")
                return exceeded
            yield from self.emit(ToolCallStart, call=call)
            if ctl.signal.aborted:  # e.g. the reader left on tool.call: the tool never starts
                raise TurnAborted
            state.started.append(call.id)
            self.save("running")
            context = ToolContext(call=call, session_id=state.session_id, signal=ctl.signal)
            with self._hooks.tool_call(call) as span:  # tracing (issue 18)
                text, is_error = run_tool(tool, call, context=context, here=not ctl.reachable)
                span.tool_result(is_error, text)
            if ctl.signal.aborted:
                raise TurnAborted
            used = used.add(tool_calls=1)
            yield from self.record(call, text, is_error)
        if paused:
            ctl.drop_queued()  # input not applied yet leaves no trace: its callers get an error
            self.save("awaiting-approval")
            self._tell(asked)
            return "paused"
        state.pending_approvals.clear()
        return None

    def _tell(self, asked: list[ApprovalRecord]) -> None:
        """Call ``on_approval_requested`` for each request this step made, now that the
        pause is saved (a hook that raises is logged)."""
        hook = self.cfg.on_approval_requested
        if hook is None:
            return
        for record in asked:
            try:
                hook(record)
            except Exception:
                _log.warning("on_approval_requested raised on approval %s (tool %r); the turn "
                             "is paused as it should be", record.id, record.call.name,
                             exc_info=True)

    def _skip(self, calls: Sequence[ToolCall], text: str) -> None:
        for call in calls:
            self.state.recorded.append(
                Message("tool", text, tool_call_id=call.id, is_error=True))

    def _decisions(self) -> dict[str, tuple[bool, str | None]]:
        """Decisions already taken on this turn's approvals, by call id (None while
        pending)."""
        out: dict[str, tuple[bool, str | None]] = {}
        state, approvals = self.state, self.env.writer.approvals
        if not state.pending_approvals or approvals is None:
            return out
        still: list[str] = []
        for approval_id in state.pending_approvals:
            record = approvals.get(approval_id)
            if record is None:
                continue
            record = settle(approvals, record)  # past its expires_at: denied as expired
            if record.status == "pending":
                still.append(approval_id)
            else:
                out[record.call.id] = (record.status == "approved", record.reason)
        state.pending_approvals[:] = still
        return out

    def _ask(
        self, call: ToolCall, asked: list[ApprovalRecord]
    ) -> Generator[RunEvent, None, tuple[bool, str | None] | None]:
        """Ask for a decision: inline through ``approve``, or by an approval record
        (pause; the record joins ``asked``)."""
        cfg, env, state = self.cfg, self.env, self.state
        writer = env.writer
        if writer.approvals is not None:
            for approval_id in state.pending_approvals:
                record = writer.approvals.get(approval_id)
                if record is not None and record.call.id == call.id:
                    return None  # still pending
        tool = cfg.tools.get(call.name)
        ttl = tool.approval_ttl_s if tool is not None and tool.approval_ttl_s else None
        ttl = ttl or cfg.approval_ttl_s
        created = now()
        record = ApprovalRecord(
            id=new_id(),
            session_id=state.session_id,
            checkpoint_key=state.key or "",
            call=call,
            created_at=created,
            expires_at=None if ttl is None else created + ttl,
        )
        if env.approve is not None:
            approved = bool(env.approve(record))
            return (approved, None)
        if writer.approvals is None or not writer.durable or state.key is None:
            raise ConfigError(
                f"tool {call.name!r} needs approval, but this run has no approval store and "
                "checkpoint store to pause in: pass approval_store= and checkpoint_store= (or "
                "use an agent, which has in-memory ones), or an approve= callback"
            )
        writer.create_approval(record)
        asked.append(record)
        state.pending_approvals.append(record.id)
        yield from self.emit(ApprovalRequested, approval_id=record.id, call=call)
        return None


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
