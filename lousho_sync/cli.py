"""The ``lousho`` command: ``demo``, ``chat``, ``sessions``."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

__all__ = ["main", "open_store"]

DEFAULT_STORE = "./.lousho/agent.db"
DEFAULT_MODEL = "openai/gpt-4o-mini"


def open_store(path: str) -> Any:
    """A built-in store from a path: ``redis://…`` → RedisStore; a directory (or a path
    without a ``.db``/``.sqlite``/``.sqlite3`` suffix) → file stores; otherwise SqliteStore."""
    if path.startswith(("redis://", "rediss://", "unix://")):
        from .redis import RedisStore

        return RedisStore(path)
    p = Path(path)
    if p.is_dir() or p.suffix.lower() not in (".db", ".sqlite", ".sqlite3"):
        from .stores.files import FileStore

        return FileStore(p)
    from .sqlite import SqliteStore

    return SqliteStore(p)


def _duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with s, m, h, d or w (e.g. 7d)")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    return float(m.group(1)) * scale


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lousho`` console script."""
    parser = argparse.ArgumentParser(prog="lousho",
                                     description="lousho: agents whose conversations survive")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="an offline tour: sessions, streaming, tools, crash and "
                          "resume, approvals")
    demo.add_argument("--dir", default=None,
                      help="where the demo's SQLite store goes (default: a temporary directory)")
    chat = sub.add_parser("chat", help="a streaming chat, durable in a store")
    chat.add_argument("--session", default="default", help="session id (default: default)")
    chat.add_argument("--model", default=None,
                      help=f"provider/model (default: $LOUSHO_MODEL or {DEFAULT_MODEL})")
    chat.add_argument("--store", default=DEFAULT_STORE,
                      help=f"store path: .db file, directory or redis:// URL ({DEFAULT_STORE})")
    sessions = sub.add_parser("sessions", help="list, show, delete or prune stored sessions")
    sessions.add_argument("--store", default=DEFAULT_STORE, help="store path")
    ssub = sessions.add_subparsers(dest="action", required=True)
    ssub.add_parser("list", help="session ids")
    show = ssub.add_parser("show", help="a session's transcript")
    show.add_argument("id")
    delete = ssub.add_parser("delete", help="delete a session and its pending turns")
    delete.add_argument("id")
    prune = ssub.add_parser("prune", help="delete what was not updated for a while")
    prune.add_argument("--older-than", required=True, type=_duration, help="e.g. 7d, 12h")
    args = parser.parse_args(argv)
    from .errors import LoushoError

    try:
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args.dir, out=sys.stdout)
        if args.command == "chat":
            return _chat(args, sys.stdin, sys.stdout)
        return _sessions(args, sys.stdout)
    except LoushoError as exc:
        print(f"lousho: error: {exc}", file=sys.stderr)
        return 2


def _model(name: str | None) -> Any:
    import os

    from .providers.registry import resolve_model

    return resolve_model(name or os.environ.get("LOUSHO_MODEL") or DEFAULT_MODEL)


def _chat(args: argparse.Namespace, stdin: TextIO, out: TextIO) -> int:
    from . import create_agent
    from .events import RunDone, TextDelta, ToolCallStart
    from .session import validate_session_id

    validate_session_id(args.session)
    provider = _model(args.model)  # a missing key fails here, naming the variable
    if args.store == DEFAULT_STORE:
        Path(DEFAULT_STORE).parent.mkdir(parents=True, exist_ok=True)
    agent = create_agent(provider=provider, store=open_store(args.store))
    session = agent.session(id=args.session)
    out.write(f"lousho chat — session {session.id!r} ({len(session.messages)} messages), "
              "/history /clear /compact /exit; Ctrl-C aborts a turn\n")
    out.flush()
    while True:
        out.write("you> ")
        out.flush()
        line = stdin.readline()
        if not line:
            out.write("\n")
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/history":
            for m in session.messages:
                what = m.text or ", ".join(f"{c.name}()" for c in m.tool_calls)
                out.write(f"  {m.role}: {what}\n")
            continue
        if text == "/clear":
            session.clear()
            out.write("  (transcript cleared)\n")
            continue
        if text == "/compact":
            before = len(session.messages)
            session.compact()
            out.write(f"  (compacted {before} -> {len(session.messages)} messages)\n")
            continue
        run = session.stream(text)
        previous = signal.signal(signal.SIGINT, lambda *_, r=run: r.abort("Ctrl-C"))
        try:
            out.write("agent> ")
            for event in run:
                if isinstance(event, TextDelta):
                    out.write(event.text)
                    out.flush()
                elif isinstance(event, ToolCallStart):
                    out.write(f"[{event.call.name}] ")
                elif isinstance(event, RunDone):
                    if event.finish_reason == "aborted":
                        out.write("[aborted: the transcript is unchanged]")
                    elif event.finish_reason == "error":
                        out.write("[failed]")
            out.write("\n")
            try:
                run.result()
            except Exception as exc:  # shown, and the chat goes on
                out.write(f"  error: {exc}\n")
        finally:
            signal.signal(signal.SIGINT, previous)
        out.flush()


def _sessions(args: argparse.Namespace, out: TextIO) -> int:
    from .session import validate_session_id

    store = open_store(args.store)
    sessions = store.sessions
    if args.action == "list":
        for sid in sessions.ids():
            out.write(f"{sid}\n")
        return 0
    if args.action == "prune":
        prune = getattr(store, "prune", None)
        if prune is None:
            print(f"lousho: error: the store at {args.store!r} has no prune()", file=sys.stderr)
            return 2
        result = prune(older_than_s=args.older_than)
        out.write(f"pruned {result.sessions} sessions, {result.checkpoints} checkpoints, "
                  f"{result.approvals} approvals\n")
        return 0
    sid = validate_session_id(args.id)
    if args.action == "show":
        messages = sessions.load(sid)
        if messages is None:
            print(f"lousho: error: no session {sid!r} in {args.store!r}", file=sys.stderr)
            return 1
        for m in messages:
            what = m.text or ", ".join(f"{c.name}({dict(c.arguments)})" for c in m.tool_calls)
            out.write(f"{m.role}: {what}\n")
        return 0
    sessions.delete(sid)
    checkpoints = getattr(store, "checkpoints", None)
    if checkpoints is not None:
        for key in checkpoints.keys(f"{sid}.turn-"):
            checkpoints.delete(key)
    out.write(f"deleted {sid}\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
