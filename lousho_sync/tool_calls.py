"""Running one step's tool calls: approvals (inline or by pausing), limits, the
``report`` rule for calls in doubt, and recording each result in the turn's checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence

from .approvals import EXPIRED_REASON, settle
from .control import TurnControl, new_id
from .errors import ConfigError
from .events import ApprovalRequested, RunEvent, ToolCallStart, ToolResultEvent
from .limits import Counters
from .limits import exceeded_before_tool_call as _limit_tool
from .messages import Message, ToolCall
from .records import ApprovalRecord, now
from .tools import ToolContext, run_tool
from .turn_state import Emit, TurnAborted, TurnConfig, TurnEnv, TurnState, save

__all__ = ["run_calls"]

_log = logging.getLogger(__name__)


def run_calls(
    cfg: TurnConfig,
    env: TurnEnv,
    ctl: TurnControl,
    state: TurnState,
    calls: list[ToolCall],
    used: Counters,
    ev: Emit,
) -> Generator[RunEvent, None, str | None]:
    """Run the step's unresolved calls in order. Returns "paused", a limit name, or None."""
    decisions = _decisions(env, state)
    paused = False
    asked: list[ApprovalRecord] = []
    for index, call in enumerate(calls):
        if ctl.signal.aborted:
            raise TurnAborted
        if ctl.steer_requested():
            _skip(state, calls[index:], "skipped: the user sent a new message before it ran")
            save(env, state, ctl, "running")
            return None
        tool = cfg.tools.get(call.name)
        if call.id in state.started and tool is not None and tool.on_interrupted == "report":
            yield from _record(env, ctl, state, call, _IN_DOUBT.format(call=call), True, ev)
            continue
        decision = decisions.get(call.id)
        if decision is None and tool is not None and tool.validate(call.arguments) is None:
            needs = tool.requires_approval(call.arguments)
            if needs:
                decision = yield from _ask(cfg, env, state, call, ev, asked)
                if decision is None:
                    paused = True
                    continue
        if decision is not None and not decision[0]:
            if decision[1] == EXPIRED_REASON:
                text = "denied: the request for approval expired before anyone decided"
            else:
                text = "denied by a human" + (f": {decision[1]}" if decision[1] else "")
            yield from _record(env, ctl, state, call, text, True, ev)
            continue
        exceeded = _limit_tool(cfg.limits, used) or _limit_tool(
            env.session_limits, env.session_used + used
        )
        if exceeded:
            _skip(state, calls[index:], f"not run: the turn reached its limit {exceeded}")
            save(env, state, ctl, "running")
            return exceeded
        yield from ev(ToolCallStart, call=call)
        state.started.append(call.id)
        save(env, state, ctl, "running")
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
        save(env, state, ctl, "awaiting-approval")
        _tell(cfg, asked)
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
    ev: Emit,
) -> Generator[RunEvent, None, None]:
    state.recorded.append(Message("tool", text, tool_call_id=call.id, is_error=is_error))
    if call.id in state.started:
        state.started.remove(call.id)
    save(env, state, ctl, "running")
    yield from ev(ToolResultEvent, call_id=call.id, result=text, is_error=is_error)


def _skip(state: TurnState, calls: Sequence[ToolCall], text: str) -> None:
    for call in calls:
        state.recorded.append(Message("tool", text, tool_call_id=call.id, is_error=True))


def _tell(cfg: TurnConfig, asked: list[ApprovalRecord]) -> None:
    """Call ``on_approval_requested`` for each request this step made, now that the pause
    is saved (a hook that raises is logged)."""
    hook = cfg.on_approval_requested
    if hook is None:
        return
    for record in asked:
        try:
            hook(record)
        except Exception:
            _log.warning("on_approval_requested raised on approval %s (tool %r); the turn is "
                         "paused as it should be", record.id, record.call.name, exc_info=True)


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
        record = settle(approvals, record)  # past its expires_at: denied as expired
        if record.status == "pending":
            still.append(approval_id)
        else:
            out[record.call.id] = (record.status == "approved", record.reason)
    state.pending_approvals[:] = still
    return out


def _ask(
    cfg: TurnConfig,
    env: TurnEnv,
    state: TurnState,
    call: ToolCall,
    ev: Emit,
    asked: list[ApprovalRecord],
) -> Generator[RunEvent, None, tuple[bool, str | None] | None]:
    """Ask for a decision: inline through ``approve``, or by an approval record (pause)."""
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
            "checkpoint store to pause in: pass approval_store= and checkpoint_store= (or use "
            "an agent, which has in-memory ones), or an approve= callback"
        )
    writer.create_approval(record)
    asked.append(record)
    state.pending_approvals.append(record.id)
    yield from ev(ApprovalRequested, approval_id=record.id, call=call)
    return None
