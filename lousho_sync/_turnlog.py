"""DEBUG records of a turn: start and end, each step (model call), each tool call, each
checkpoint write; every record carries ``extra={"session_id": ..., "run_id": ...}``.

They go to the ``lousho_sync.executor`` logger and cost one ``isEnabledFor`` check per turn
while DEBUG is off (the hooks are then not installed at all).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ._otel import Hooks, ToolSpan
    from .events import RunEvent
    from .messages import ToolCall
    from .providers.base import ModelResponse
    from .results import ExecutionResult

__all__ = ["LoggedHooks"]

E = TypeVar("E")


class _LoggedTool:
    __slots__ = ("_call", "_hooks", "_inner")

    def __init__(self, hooks: LoggedHooks, call: ToolCall, inner: ToolSpan) -> None:
        self._hooks = hooks
        self._call = call
        self._inner = inner

    def __enter__(self) -> _LoggedTool:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._inner.__exit__(*exc)

    def tool_result(self, is_error: bool, text: str) -> None:
        self._inner.tool_result(is_error, text)
        self._hooks.debug("tool %s (call %s) %s", self._call.name, self._call.id,
                          "failed" if is_error else "returned")


class LoggedHooks:
    """Turn hooks that log at DEBUG, then delegate to ``inner`` (tracing or off)."""

    __slots__ = ("_extra", "_inner", "_logger", "_run_id")

    def __init__(self, inner: Hooks, logger: logging.Logger, session_id: str | None,
                 run_id: str) -> None:
        self._inner = inner
        self._logger = logger
        self._run_id = run_id
        self._extra = {"session_id": session_id, "run_id": run_id}

    def debug(self, msg: str, *args: object) -> None:
        """One DEBUG record of this turn (``run <id>: `` prefixed, with the ids as extra)."""
        self._logger.debug("run %s: " + msg, self._run_id, *args, extra=self._extra)

    def run(self, body: Generator[E, None, ExecutionResult], *,
            aborted: type[BaseException] | None = None
            ) -> Generator[E, None, ExecutionResult]:
        """Drive the turn ``body``, logging its start and its end (``aborted``: the exception
        an aborted turn raises)."""
        session = self._extra["session_id"]
        self.debug("turn started (session %s)", session)
        try:
            result = yield from body
        except GeneratorExit:
            self.debug("turn closed by its consumer")
            raise
        except BaseException as exc:
            if aborted is not None and isinstance(exc, aborted):
                self.debug("turn aborted")
            else:
                self.debug("turn failed: %s: %s", type(exc).__name__, exc)
            raise
        self.debug("turn ended: %s after %d step(s), %d input / %d output tokens",
                   result.finish_reason, result.steps, result.usage.input_tokens,
                   result.usage.output_tokens)
        return result

    def model_call(
        self, body: Generator[RunEvent, None, ModelResponse | None], step: int
    ) -> Generator[RunEvent, None, ModelResponse | None]:
        self.debug("step %d: model call", step)
        return self._inner.model_call(body, step)

    def tool_call(self, call: ToolCall) -> _LoggedTool:
        self.debug("tool %s (call %s) starts", call.name, call.id)
        return _LoggedTool(self, call, self._inner.tool_call(call))

    def checkpoint(self, status: str) -> AbstractContextManager[Any]:
        self.debug("checkpoint write (%s)", status)
        return self._inner.checkpoint(status)
