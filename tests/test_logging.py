"""The logger tree and the DEBUG records of a turn (read with caplog)."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import subprocess
import sys

import pytest

import lousho_aio
import lousho_sync
from lousho_sync import ProviderError, ScriptedProvider, Step, ToolCall, create_agent, tool
from lousho_sync.stores import _lease

EXECUTOR = "lousho_sync.executor"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _turn_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == EXECUTOR and r.levelno == logging.DEBUG]


def test_the_library_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("lousho_sync").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


def test_every_module_logs_under_lousho_sync() -> None:
    names = []
    for package in (lousho_sync, lousho_aio):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith(("__main__", ".demo")):
                continue
            module = importlib.import_module(info.name)
            logger = getattr(module, "_log", None)
            if isinstance(logger, logging.Logger):
                names.append(logger.name)
    assert EXECUTOR in names and "lousho_sync.aio" in names
    assert all(n.startswith("lousho_sync.") for n in names), names


def test_a_tool_turn_logs_start_step_tool_checkpoint_and_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider = ScriptedProvider(
        [Step(tool_calls=[ToolCall("call-7", "add", {"a": 1, "b": 2})]), Step(text="3")]
    )
    session = create_agent(provider=provider, tools=[add]).session("log-1")
    with caplog.at_level(logging.DEBUG, logger="lousho_sync"):
        result = session.send("add")
    records = _turn_records(caplog)
    messages = [r.getMessage() for r in records]
    prefix = f"run {result.run_id}: "
    assert all(m.startswith(prefix) for m in messages), messages
    bodies = [m[len(prefix):] for m in messages]
    assert bodies[0] == "turn started (session log-1)"
    assert "step 1: model call" in bodies and "step 2: model call" in bodies
    assert "tool add (call call-7) starts" in bodies
    assert "tool add (call call-7) returned" in bodies
    assert "checkpoint write (running)" in bodies
    assert bodies[-1].startswith("turn ended: stop after 2 step(s)")
    assert bodies.index("tool add (call call-7) starts") < bodies.index(
        "tool add (call call-7) returned") < bodies.index("step 2: model call")
    for record in records:
        assert record.session_id == "log-1"  # type: ignore[attr-defined]
        assert record.run_id == result.run_id  # type: ignore[attr-defined]


def test_a_failed_turn_logs_its_error(caplog: pytest.LogCaptureFixture) -> None:
    provider = ScriptedProvider([Step(error=ProviderError("upstream down"))])
    session = create_agent(provider=provider).session("log-2")
    with caplog.at_level(logging.DEBUG, logger="lousho_sync"), pytest.raises(ProviderError):
        session.send("hi")
    last = _turn_records(caplog)[-1]
    assert "turn failed: ProviderError: upstream down" in last.getMessage()
    assert last.session_id == "log-2"  # type: ignore[attr-defined]


def test_without_debug_a_turn_logs_nothing_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    provider = ScriptedProvider(default="ok")
    with caplog.at_level(logging.INFO, logger="lousho_sync"):
        create_agent(provider=provider).session("log-3").send("hi")
    assert _turn_records(caplog) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX process handling")
def test_the_lease_probe_logs_a_dead_owner(caplog: pytest.LogCaptureFixture) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    owner = f"{_lease.HOST}:{child.pid}:abc"
    with caplog.at_level(logging.DEBUG, logger="lousho_sync"):
        assert _lease.owner_is_dead(owner)
    (record,) = [r for r in caplog.records if r.name == "lousho_sync.stores._lease"]
    assert owner in record.getMessage() and record.levelno == logging.DEBUG
