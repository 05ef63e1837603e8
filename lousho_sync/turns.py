"""The life of a turn: the only place a turn is started, resumed and ended.

Every kind of turn goes through :func:`play` — session turns, one-shot
``agent.send(..., session_id=...)`` runs, :meth:`AgentExecutor.execute`, and approval
continuations — so one rule decides what becomes of a turn's checkpoint:

============================================  ==========================================
the turn ...                                  its checkpoint
============================================  ==========================================
finished (``stop``/``length``), or reached a  committed with the transcript (a session:
limit after recording progress                one store transaction where the store can),
                                              else deleted
reached a limit before any progress           deleted (nothing is stored)
paused on an approval                         kept (``awaiting-approval``)
was aborted                                   deleted (transcript as before)
lost its lease (``LeaseLostError``)           left as it is, for the new holder
failed after recording a model response or   kept as ``interrupted`` for ``resume()``
a tool result (a durable session)
failed before any progress, or not durable    deleted: a plain retry is correct
============================================  ==========================================

Checkpoint keys are built and parsed here only: ``"<session id>.turn-<n>"`` for session
turns (``n`` = transcript length when the turn started), ``"<session id>"`` for a durable
one-shot run, ``"run-<run id>"`` for a one-shot run nobody can resume (kept only while it
waits on an approval).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Literal

import attrs

from ._writes import TurnWriter
from .control import TurnControl
from .errors import LeaseLostError, LoushoError
from .events import RunEvent
from .executor import steps
from .inputs import to_messages
from .limits import Limits
from .messages import Message
from .providers.base import Provider
from .records import Checkpoint
from .results import ExecutionResult
from .signal import Signal, link
from .stores.base import ApprovalStore, CheckpointStore
from .tools import Tool
from .turn_state import (
    ApproveCallback,
    TurnAborted,
    TurnConfig,
    TurnEnv,
    TurnState,
    result_of,
)

__all__ = [
    "AgentExecutor",
    "Commit",
    "TurnKey",
    "drive",
    "has_progress",
    "one_shot_key",
    "parse_key",
    "play",
    "play_linked",
    "resumed_turn",
    "session_key",
    "session_of",
    "session_prefix",
    "tell_pending",
]

_log = logging.getLogger(__name__)

_TURN = ".turn-"
_SCRATCH = "run-"

_RECORD_FAILED = (
    "the turn is in doubt: its progress (a tool may have run) could not be recorded, so "
    "its last record was left as it was for resume(), which reports a tool that may have "
    "run instead of running it again"
)
_DELETE_FAILED = (
    "the turn is in doubt: its record could not be deleted, so it may still pend; "
    "pending() tells once the store answers"
)

Commit = Callable[[TurnState, ExecutionResult], None]
"""Stores a finished turn's messages and drops its checkpoint (see :func:`play`)."""


# --- keys ------------------------------------------------------------------------------------
def session_key(session_id: str, turn_index: int) -> str:
    """The checkpoint key of the session turn that starts at ``turn_index``."""
    return f"{session_id}{_TURN}{turn_index}"


def session_prefix(session_id: str) -> str:
    """The prefix of every session-turn checkpoint key of ``session_id``."""
    return f"{session_id}{_TURN}"


def one_shot_key(session_id: str | None, run_id: str) -> str:
    """The key of a one-shot run: its session id (durable), else ``run-<run id>``."""
    return session_id if session_id is not None else f"{_SCRATCH}{run_id}"


def session_of(key: str) -> str | None:
    """The session id of a session-turn checkpoint key (None for any other key)."""
    sid, sep, n = key.rpartition(_TURN)
    return sid if sep and sid and n.isdigit() else None


@attrs.frozen(slots=True)
class TurnKey:
    """What a checkpoint key names: a session turn, a durable one-shot run, or a scratch
    one-shot run."""

    kind: Literal["session", "one-shot", "scratch"]
    session_id: str | None = None
    turn_index: int | None = None


def parse_key(key: str, session_id: str | None) -> TurnKey:
    """What ``key`` (recorded with ``session_id``, e.g. on an approval record) names."""
    if session_id is not None and key.startswith(session_prefix(session_id)):
        rest = key[len(session_prefix(session_id)):]
        if rest.isdigit():
            return TurnKey("session", session_id, int(rest))
    if key.startswith(_SCRATCH):
        return TurnKey("scratch", session_id)
    return TurnKey("one-shot", session_id)


# --- playing a turn ----------------------------------------------------------------------------
def play(
    cfg: TurnConfig,
    env: TurnEnv,
    ctl: TurnControl,
    state: TurnState,
    history: Sequence[Message],
    *,
    emit: bool,
    resumed: bool = False,
    commit: Commit | None = None,
    resume_hint: str | None = None,
) -> Generator[RunEvent, None, ExecutionResult]:
    """Run (or continue) one turn to its end and settle its checkpoint by the one rule of
    the module docstring. ``commit`` stores a finished turn (sessions); without it the
    checkpoint is just deleted (one-shot runs). A LoushoError raised out of the turn says
    in ``pending`` whether the turn was kept, and when it was, ``resume_hint`` (how to
    finish or drop it) joins its message."""
    try:
        result = yield from steps(cfg, env, ctl, state, history, emit=emit, resumed=resumed)
        finish = result.finish_reason
        if finish in ("stop", "length") or (finish == "limit" and state.recorded):
            if commit is not None:
                commit(state, result)
            elif env.durable or resumed:  # a run that is not durable wrote none unless paused
                env.writer.delete(state.key)
        elif finish == "limit" and (env.durable or resumed):
            env.writer.delete(state.key)
        return result
    except LeaseLostError as exc:
        ctl.close()
        exc.pending = True  # the new holder of the lease finishes it
        raise
    except BaseException as exc:
        if ctl.signal.aborted or isinstance(exc, (TurnAborted, GeneratorExit)):
            ctl.close()
            _quietly(lambda: env.writer.delete(state.key),
                     "delete the checkpoint of aborted turn", state)
            if isinstance(exc, GeneratorExit):
                raise
            return result_of(state, ctl, "aborted", messages=())
        ctl.keep_queued_tokens()
        doubt: str | None = None
        if resumed or (env.durable and has_progress(state)):
            # a pending turn stays pending until finished or discarded; one with progress
            # is kept. When its record cannot be updated, the last one stays as it was.
            kept = True
            if not _quietly(
                lambda: env.writer.save(state.checkpoint("interrupted", ctl.queued())),
                "mark interrupted the turn", state,
            ) and not resumed:
                doubt = _RECORD_FAILED
        else:  # nothing recorded: a plain retry is correct, so nothing may pend
            kept = env.writer.wrote and not _quietly(
                lambda: env.writer.delete(state.key),
                "delete the checkpoint of failed turn", state,
            )
            if kept:
                doubt = _DELETE_FAILED
        if isinstance(exc, LoushoError):
            tell_pending(exc, kept, resume_hint, doubt)
        raise


def has_progress(state: TurnState) -> bool:
    """Whether the turn recorded a model response or a tool result (applied queued input
    alone is not progress)."""
    return any(m.role != "user" for m in state.recorded)


def tell_pending(
    exc: LoushoError, kept: bool, hint: str | None, doubt: str | None = None
) -> None:
    """Say on ``exc`` whether its turn was kept (``pending``), with how to finish it (and,
    when the store failed to record the turn's end, that the turn is in doubt)."""
    exc.pending = kept
    if doubt is not None:
        hint = f"{doubt}; {hint}" if hint else doubt
    if kept and hint and exc.args and isinstance(exc.args[0], str) and hint not in exc.args[0]:
        exc.args = (f"{exc.args[0]} [{hint}]", *exc.args[1:])


def _quietly(fn: Callable[[], object], what: str, state: TurnState) -> bool:
    try:
        fn()
    except Exception:
        _log.warning("could not %s %s", what, state.key, exc_info=True)
        return False
    return True


def resumed_turn(cp: Checkpoint) -> tuple[TurnControl, TurnState]:
    """The control and state that continue the turn ``cp`` recorded (its queued input
    offered again)."""
    ctl = TurnControl(cp.run_id)
    if cp.queued_inputs:
        ctl.offer(cp.queued_inputs, steer=False)
    return ctl, TurnState.from_checkpoint(cp)


def drive(gen: Generator[Any, None, Any]) -> Any:
    """Run a generator to its end, discarding what it yields; return its value."""
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def play_linked(
    signal: Signal | None, ctl: TurnControl, gen: Generator[RunEvent, None, ExecutionResult]
) -> Generator[RunEvent, None, ExecutionResult]:
    """``gen`` with the caller's ``signal`` aborting ``ctl`` while it runs."""
    unlink = link(signal, ctl.abort)
    try:
        result: ExecutionResult = yield from gen
        return result
    finally:
        unlink()


# --- the low-level entry point -------------------------------------------------------------
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
        signal: Signal | None = None,
        approve: ApproveCallback | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> ExecutionResult:
        """Run one turn over ``history``. With ``session_id`` and a ``checkpoint_store`` the
        turn is checkpointed under ``session_id``; an input of ``()`` with an existing
        checkpoint continues it (the resume path)."""
        cfg = TurnConfig(
            provider=provider,
            system=instructions,
            tools={t.name: t for t in tools},
            tool_specs=tuple(t.spec() for t in tools),
            settings=settings or {},
            limits=limits,
        )
        checkpoints = checkpoint_store if session_id is not None else None
        cp = checkpoints.load(session_id) if checkpoints is not None and session_id else None
        if cp is not None and input in ((), [], None):
            ctl, state = resumed_turn(cp)
            resumed = True
        else:
            ctl = TurnControl()
            state = TurnState(run_id=ctl.run_id, key=session_id, session_id=session_id,
                              input=to_messages(input))
            resumed = False
        env = TurnEnv(writer=TurnWriter(checkpoints, approval_store),
                      approve=approve)
        gen = play(cfg, env, ctl, state, history, emit=False, resumed=resumed)
        result: ExecutionResult = drive(play_linked(signal, ctl, gen))
        return result
