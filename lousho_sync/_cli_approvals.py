"""``lousho approvals``: list, show, approve and deny approval requests from a shell, and
``--app MODULE:ATTR``, how the command (and ``lousho serve``) finds the agent whose model and
tools continue a turn once it is decided.

``--app`` names an :class:`~lousho_sync.agent.Agent` or a function returning one, as
``module:attribute`` (the current directory is importable, as with ``python -m``). A
function is called with ``store=`` the store ``--store`` opened, when ``--store`` is given,
else with no argument; an Agent object brings its own store (``--store`` is then refused:
the two could differ). Reading (``list``, ``show``) needs only a store; deciding needs the
app, since approving runs the tool and both decisions ask the model to go on.
"""

from __future__ import annotations

import datetime
import getpass
import importlib
import json
import os
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from .agent import Agent
from .approvals import page
from .errors import ApprovalExpiredError, ConfigError
from .records import ApprovalRecord
from .results import ExecutionResult

__all__ = [
    "APP_ENV",
    "age_text",
    "approvals_command",
    "load_app",
    "record_row",
    "when_text",
]

APP_ENV = "LOUSHO_APP"


def load_app(spec: str, store: Any | None) -> Agent:
    """The agent ``spec`` (``module:attribute``) names: an Agent, or a function called with
    ``store=store`` (or nothing when ``store`` is None) that returns one. ConfigError
    naming what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--app {spec!r} must be MODULE:ATTRIBUTE (e.g. myapp.agents:agent)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the app sits beside you
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"--app {spec!r}: {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if isinstance(target, Agent):
        if store is not None:
            raise ConfigError(
                f"--app {spec!r} is an Agent with its own store: leave out --store, or make "
                f"{attr!r} a function taking store= to use the one --store names"
            )
        return target
    if not callable(target):
        raise ConfigError(f"--app {spec!r} is a {type(target).__name__}, not an Agent or a "
                          "function returning one")
    try:
        agent = target(store=store) if store is not None else target()
    except ConfigError:
        raise
    except Exception as exc:  # a function that is not an agent factory, or one that failed
        how = f"{attr}(store=...)" if store is not None else f"{attr}()"
        raise ConfigError(f"--app {spec!r}: calling {how} failed: {type(exc).__name__}: "
                          f"{exc} (it should be an Agent, or a function returning one)") from exc
    if not isinstance(agent, Agent):
        raise ConfigError(f"--app {spec!r} returned a {type(agent).__name__}, not an Agent "
                          "(lousho_sync.create_agent(...))")
    return agent


def when_text(t: float | None) -> str:
    """``t`` as ``YYYY-MM-DD HH:MM:SS UTC`` ("-" for None)."""
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age_text(seconds: float) -> str:
    """A duration as a person says it: ``42s``, ``5m``, ``3h``, ``2d``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def record_row(record: ApprovalRecord) -> dict[str, Any]:
    """What ``list --json`` and ``show --json`` print of a record."""
    return {
        "id": record.id,
        "session_id": record.session_id,
        "tool": record.call.name,
        "arguments": dict(record.call.arguments),
        "call_id": record.call.id,
        "status": record.status,
        "reason": record.reason,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "resolved_at": record.resolved_at,
        "resolved_by": record.resolved_by,
    }


def _one_line(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(records: Iterable[ApprovalRecord], now: float) -> str:
    rows = [("ID", "SESSION", "TOOL", "AGE", "EXPIRES IN", "ARGUMENTS")]
    for r in records:
        expires = "never" if r.expires_at is None else age_text(r.expires_at - now)
        rows.append((r.id, r.session_id or "-", r.call.name, age_text(now - r.created_at),
                     expires, _one_line(json.dumps(dict(r.call.arguments)), 60)))
    if len(rows) == 1:
        return "no approval is pending\n"
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5] + "\n"
        for row in rows
    )


def _answer(result: ExecutionResult | None) -> str:
    if result is None:
        return "(the turn it paused is gone: nothing continued)\n"
    if result.finish_reason == "awaiting-approval":
        return f"(the turn still waits on approvals: {', '.join(result.approval_ids)})\n"
    return f"{result.text}\n"


def approvals_command(args: Any, store: Any, agent: Agent | None, out: TextIO) -> int:
    """Run ``lousho approvals <action>``; returns the exit code (errors raise)."""
    approvals = agent.approval_store if agent is not None else store.approvals
    if args.action == "list":
        records: list[ApprovalRecord] = []
        cursor = None
        while True:  # every pending approval, newest first
            got = page(approvals, session_prefix=args.session_prefix, limit=1000,
                       cursor=cursor)
            records += got.items
            if got.next_cursor is None:
                break
            cursor = got.next_cursor
        if args.json:
            out.write(json.dumps([record_row(r) for r in records], indent=2) + "\n")
        else:
            out.write(_table(records, time.time()))
        return 0
    from .approvals import current
    from .errors import ApprovalNotFoundError

    if args.action == "show":
        record = current(approvals, args.id)
        if record is None:
            raise ApprovalNotFoundError(f"no approval has id {args.id!r}", approval_id=args.id)
        row = record_row(record)
        if args.json:
            out.write(json.dumps(row, indent=2) + "\n")
            return 0
        for key, value in row.items():
            if key in ("created_at", "expires_at", "resolved_at"):
                value = when_text(value)
            elif key == "arguments":
                value = json.dumps(value, indent=2)
            out.write(f"{key}: {'-' if value is None else value}\n")
        return 0
    if agent is None:
        raise ConfigError(
            f"lousho approvals {args.action} needs --app MODULE:ATTR (or ${APP_ENV}): the "
            "agent whose model and tools continue the turn once it is decided"
        )
    by = args.by if args.by is not None else _login()
    approved = args.action == "approve"
    try:
        result = agent.approvals.resolve(id=args.id, approved=approved, reason=args.reason,
                                         by=by)
    except ApprovalExpiredError as exc:
        if exc.result is not None:
            out.write(_answer(exc.result))
        raise
    decided = "approved" if approved else "denied"
    if args.json:
        out.write(json.dumps({"id": args.id, "status": decided, "by": by,
                              "finish_reason": None if result is None else result.finish_reason,
                              "text": None if result is None else result.text}) + "\n")
    else:
        out.write(f"{decided} {args.id} (by {by}); the turn went on:\n")
        out.write(_answer(result))
    return 0


def _login() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no login name (a container without $USER): nobody is named
        return None
