"""The ``lousho`` command: ``demo``, ``chat``, ``sessions`` (``list``, ``show``, ``delete``,
``prune``, ``copy``), ``approvals`` (``list``, ``show``, ``approve``, ``deny``).

Exit codes: 0 done, 1 a runtime failure (a store problem, a missing session, too many turns
to undo, a failed turn that ends the command, an API key the provider refused), 2 a usage
error (bad arguments, an invalid session id, a missing API key, an unknown or empty model),
130 interrupted (Ctrl-C), 141 stdout closed early (``lousho demo | head -1``: quietly).
Every problem is one line on stderr, without a traceback; with ``--json`` that line is a
JSON object ``{"error": {"code": ..., "message": ..., "exit_code": ...}}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from ._cli_store import (
    StoreProblem,
    copy_sessions,
    listed_sessions,
    open_store,
    probe_writable,
    sessions_table,
    shown,
    stored_session_ids,
)
from .stores.base import capabilities_of

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PIPE_CLOSED",
    "EXIT_USAGE",
    "SCRIPTED_MODEL",
    "main",
    "open_store",
]

DEFAULT_STORE = "./.lousho/agent.db"
DEFAULT_MODEL = "openai/gpt-4o-mini"
SCRIPTED_MODEL = "scripted"
"""``--model scripted``: an offline model that answers from a script (no key, no network)."""
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a reader that left


class _Failure(Exception):
    """A runtime failure reported as one line with exit code 1."""

    code = "LOUSHO_CLI_FAILURE"


class _NotFound(_Failure):
    code = "LOUSHO_SESSION_NOT_FOUND"


def _count(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``low`` (a usage error otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}, got {text!r}")
        return value

    return parse


def _duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with s, m, h, d or w (e.g. 7d)")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    return float(m.group(1)) * scale


class _JsonErrors(argparse.ArgumentParser):
    """An argument parser whose usage errors are the JSON error line (``--json`` given)."""

    def error(self, message: str) -> NoReturn:
        _error(f"{self.prog}: {message}", code="LOUSHO_CLI_USAGE", exit_code=EXIT_USAGE,
               as_json=True)
        sys.exit(EXIT_USAGE)


def _parser(json_errors: bool = False) -> argparse.ArgumentParser:
    from . import __version__

    parser = (_JsonErrors if json_errors else argparse.ArgumentParser)(
        prog="lousho", description="lousho: agents whose conversations survive",
        epilog="exit codes: 0 ok, 1 runtime failure, 2 usage error, 130 interrupted")
    parser.add_argument("--version", action="version", version=f"lousho {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="an offline tour: sessions, streaming, tools, crash and "
                          "resume, approvals")
    demo.add_argument("--dir", default=None,
                      help="where the demo's SQLite store goes (default: a temporary directory)")
    store_help = (f"a .db/.sqlite file, a directory (file stores; a new one needs a trailing "
                  f"/), a redis:// URL or a postgresql:// URL (?schema=NAME picks the "
                  f"schema; default lousho) (default: {DEFAULT_STORE})")
    chat = sub.add_parser("chat", help="a streaming chat, durable in a store")
    chat.add_argument("--session", default="default", help="session id (default: default)")
    chat.add_argument("--model", default=None,
                      help=f"provider/model, or {SCRIPTED_MODEL} for an offline scripted "
                      f"model (default: $LOUSHO_MODEL or {DEFAULT_MODEL})")
    chat.add_argument("--store", default=DEFAULT_STORE, help=store_help)
    sessions = sub.add_parser("sessions", help="list, show, undo, fork, delete, prune or "
                                               "copy stored sessions")
    sessions.add_argument("--store", default=DEFAULT_STORE, help=store_help)
    ssub = sessions.add_subparsers(dest="action", required=True)
    listing = ssub.add_parser("list", help="sessions, newest first: id, messages, last update "
                                           "and title (also those with only a pending turn)")
    listing.add_argument("--prefix", default=None, help="only ids starting with this")
    show = ssub.add_parser("show", help="a session's transcript")
    show.add_argument("id")
    undo = ssub.add_parser("undo", help="remove the last N turns of a session (default 1)")
    undo.add_argument("id")
    undo.add_argument("turns", nargs="?", type=_count(1), default=1)
    fork = ssub.add_parser("fork", help="copy a session to a new id (a new UUID unless given)")
    fork.add_argument("id")
    fork.add_argument("new_id", nargs="?", default=None)
    fork.add_argument("--at-turn", type=_count(0), default=None,
                      help="copy only the first N turns (default: all)")
    delete = ssub.add_parser("delete", help="delete a session and its pending turn")
    delete.add_argument("id")
    prune = ssub.add_parser("prune", help="delete what was not updated for a while")
    prune.add_argument("--older-than", required=True, type=_duration, help="e.g. 7d, 12h")
    prune.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    copy = ssub.add_parser(
        "copy", help="copy sessions to another store (never overwrites one there)",
        description="Copy transcripts (with their metadata and compaction history when both "
        "stores keep them) from one store to another. A session that exists in the "
        "destination is refused, never overwritten (delete it there first to copy it again); "
        "the others are still copied, and the exit code is 1. Pending turns and approvals "
        "are never copied: finish or discard them in the source first.")
    copy.add_argument("--from", dest="source", default=None,
                      help="the store to copy from (default: --store)")
    copy.add_argument("--to", dest="target", required=True,
                      help="the store to copy to (a new .db file or directory is created)")
    copy.add_argument("--prefix", default=None, help="only the sessions whose id starts so")
    copy.add_argument("ids", nargs="*", metavar="ID", help="only these sessions")
    for p in (listing, show, undo, fork, delete, prune, copy):
        p.add_argument("--json", action="store_true", help="print JSON")
    _approvals_parser(sub, store_help)
    serve = sub.add_parser(
        "serve", help="the approvals inbox and sessions as web pages (token-protected)",
        description="Serve the inbox (pending approvals of every session, approve or deny "
        "with a reason), the sessions catalog and each session's transcript. Every request "
        "needs the token: it is printed at start (or taken from --token or "
        "$LOUSHO_SERVE_TOKEN); open the printed URL once and the browser keeps it in a "
        "cookie. Deciding needs --app (the agent whose model and tools continue the turn); "
        "without it the pages are read-only.")
    serve.add_argument("--store", default=None, help=store_help.replace(
        "(default: ", "(default: the --app agent's store, else "))
    serve.add_argument("--app", default=None, help="MODULE:ATTR of the Agent (or a function "
                       "taking store=) that continues decided turns (default: $LOUSHO_APP)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="the address to bind (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=int, default=8765, help="default: 8765 (0: any free)")
    serve.add_argument("--token", default=None,
                       help="the token requests must bring (default: $LOUSHO_SERVE_TOKEN, "
                       "else a new random one, printed)")
    return parser


def _approvals_parser(sub: Any, store_help: str) -> None:
    app_help = ("MODULE:ATTR of the Agent (or a function taking store= that returns one) "
                "whose model and tools continue a decided turn; needed to approve or deny "
                "(default: $LOUSHO_APP)")
    approvals = sub.add_parser(
        "approvals", help="list, show, approve or deny approval requests across sessions",
        description="Approval requests of every session. Deciding continues the paused turn "
        "in this process (its tool runs on approve) and prints its answer, so approve and "
        "deny need --app: the agent with the model and tools.")
    approvals.add_argument("--store", default=None, help=store_help.replace(
        "(default: ", "(default: the --app agent's store, else "))
    approvals.add_argument("--app", default=None, help=app_help)
    asub = approvals.add_subparsers(dest="action", required=True)
    listing = asub.add_parser("list", help="pending requests, newest first")
    listing.add_argument("--session-prefix", default=None,
                         help="only sessions whose id starts with this")
    show = asub.add_parser("show", help="one request: tool, arguments, session, times, "
                                        "decision")
    show.add_argument("id")
    decide = []
    for action in ("approve", "deny"):
        p = asub.add_parser(action, help=f"{action} a request; the turn goes on here and "
                                         "its answer is printed")
        p.add_argument("id")
        p.add_argument("--reason", default=None, help="why (kept with the decision)")
        p.add_argument("--by", default=None,
                       help="who decides (kept as resolved_by; default: your login name)")
        decide.append(p)
    for p in (listing, show, *decide):
        p.add_argument("--json", action="store_true", help="print JSON")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lousho`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser(json_errors="--json" in argv).parse_args(argv)
    notices = _Notices()
    log = logging.getLogger("lousho_sync")
    saved = log.propagate
    log.addHandler(notices)
    log.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.showwarning = notices.warning
            code = _main(args)
            sys.stdout.flush()  # a reader that left shows here, not at interpreter exit
            return code
    except BrokenPipeError:
        return _reader_left()
    finally:
        log.removeHandler(notices)
        log.propagate = saved


def _reader_left() -> int:
    """stdout's reader left (``lousho demo | head -1``): stop quietly, as ``cat`` does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush says nothing
    os.close(devnull)
    return EXIT_PIPE_CLOSED


class _Notices(logging.Handler):
    """Warnings and WARNING logs as ``lousho: warning: ...`` lines on stderr, each once
    (a library warning is often both a warning and a log record)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._seen: set[str] = set()

    def say(self, text: str) -> None:
        line = " ".join(text.split())
        if line not in self._seen:
            self._seen.add(line)
            print(f"lousho: warning: {line}", file=sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.say(record.getMessage())

    def warning(self, message: Warning | str, category: type[Warning], filename: str,
                lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
        self.say(str(message))


def _main(args: argparse.Namespace) -> int:
    from ._cli_chat import ChatEnded
    from .errors import ConfigError, InvalidSessionIdError, LoushoError

    as_json = bool(getattr(args, "json", False))
    try:
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args.dir, out=sys.stdout)
        if args.command == "chat":
            return _chat(args, sys.stdin, sys.stdout)
        if args.command == "approvals":
            return _approvals(args, sys.stdout)
        if args.command == "serve":
            return _serve(args, sys.stdout)
        return _sessions(args, sys.stdin, sys.stdout)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise  # main() stops quietly
    except (InvalidSessionIdError, ConfigError) as exc:
        _error(str(exc), code=exc.code, exit_code=EXIT_USAGE, as_json=as_json)
        return EXIT_USAGE
    except (StoreProblem, _Failure, ChatEnded, LoushoError, OSError) as exc:
        code = getattr(exc, "code", None) or ("LOUSHO_CLI_STORE" if isinstance(
            exc, StoreProblem) else "LOUSHO_CLI_FAILURE")
        _error(str(exc), code=code, exit_code=EXIT_FAILURE, as_json=as_json)
        return EXIT_FAILURE


def _error(text: str, *, code: str = "LOUSHO_CLI_FAILURE", exit_code: int = EXIT_FAILURE,
           as_json: bool = False) -> None:
    """One line on stderr: ``lousho: error: ...``, or with ``--json`` a JSON object."""
    line = " ".join(text.split())
    if as_json:
        print(json.dumps({"error": {"code": code, "message": line, "exit_code": exit_code}}),
              file=sys.stderr)
    else:
        print(f"lousho: error: {line}", file=sys.stderr)


def _model(name: str | None) -> Any:
    from .errors import ConfigError
    from .providers.registry import resolve_model

    if name is not None and not name.strip():
        raise ConfigError(f"--model {name!r} names no model: give provider/model (e.g. "
                          f"{DEFAULT_MODEL}), or {SCRIPTED_MODEL} for an offline model")
    chosen = name or os.environ.get("LOUSHO_MODEL") or DEFAULT_MODEL
    if chosen == SCRIPTED_MODEL:
        from ._cli_chat import scripted_model

        return scripted_model()
    return resolve_model(chosen)


def _agent(store: Any, provider: Any = None) -> Any:
    from . import create_agent
    from .providers.scripted import ScriptedProvider

    return create_agent(provider=provider or ScriptedProvider(default=""), store=store)


def _chat(args: argparse.Namespace, stdin: TextIO, out: TextIO) -> int:
    from ._cli_chat import chat_loop
    from .session import validate_session_id

    validate_session_id(args.session)
    provider = _model(args.model)  # a missing key fails here, naming the variable
    if args.store == DEFAULT_STORE:
        Path(DEFAULT_STORE).parent.mkdir(parents=True, exist_ok=True)
    store = open_store(args.store, create=True)
    probe_writable(store, args.store, args.session)
    session = _agent(store, provider).session(id=args.session)
    try:
        session.pending()  # reads the transcript and the checkpoints now
    except Exception as exc:
        raise StoreProblem(f"cannot read session {args.session!r} from the store "
                           f"{shown(args.store)!r}: {exc}") from exc
    return chat_loop(session, stdin, out)


def _app_and_store(store_arg: str | None, app_arg: str | None) -> tuple[Any, Any]:
    """(agent or None, store) of ``--store`` and ``--app`` (or $LOUSHO_APP)."""
    import os

    from ._cli_approvals import APP_ENV, load_app

    app = app_arg or os.environ.get(APP_ENV) or None
    store = None
    if store_arg is not None or app is None:
        store = open_store(store_arg or DEFAULT_STORE, create=False)
    agent = load_app(app, store) if app is not None else None
    return agent, store


def _approvals(args: argparse.Namespace, out: TextIO) -> int:
    from ._cli_approvals import approvals_command

    agent, store = _app_and_store(args.store, args.app)
    try:
        return approvals_command(args, store, agent, out)
    finally:
        if store is not None:
            _close(store)


def _serve(args: argparse.Namespace, out: TextIO) -> int:
    import os

    from .errors import ConfigError
    from .inbox import TOKEN_ENV, inbox_app, make_inbox_server, new_token

    agent, store = _app_and_store(args.store, args.app)
    given = args.token or os.environ.get(TOKEN_ENV) or None
    if given is not None and len(given) < 16:
        raise ConfigError(f"the serve token must be at least 16 characters (--token or "
                          f"${TOKEN_ENV}); leave both out for a random one")
    token = given or new_token()
    app = inbox_app(agent if agent is not None else store, token=token)
    try:
        server = make_inbox_server(app, args.host, args.port)
    except OSError as exc:
        raise _Failure(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{port}/"
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"lousho: warning: serving on {args.host}: anyone who can reach it and has the "
              "token can decide; put TLS in front of it", file=sys.stderr)
    if agent is None:
        print("lousho: warning: no --app: the pages are read-only (deciding needs the agent "
              "whose model and tools continue the turn)", file=sys.stderr)
    out.write(f"lousho serve: listening on {url}\n")
    if given is None:
        out.write(f"open {url}?token={token} once; the browser keeps the token in a cookie\n")
    else:
        out.write(f"open {url}?token=<your token> once; the browser keeps it in a cookie\n")
    out.flush()
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if store is not None:
            _close(store)
    return EXIT_OK


def _session_info(session: Any) -> dict[str, Any]:
    pending = session.pending()
    return {"id": session.id, "messages": len(session.messages),
            "pending": None if pending is None else pending.status}


def _sessions(args: argparse.Namespace, stdin: TextIO, out: TextIO) -> int:
    from .session import validate_session_id

    if args.action == "copy":
        return _copy(args, out)
    store = open_store(args.store, create=False)
    agent = _agent(store)
    if args.action == "list":
        rows = listed_sessions(store, agent, args.prefix)
        if args.json:
            out.write(json.dumps(rows, indent=2) + "\n")
        elif rows:
            out.write(sessions_table(rows))
        else:
            which = "" if args.prefix is None else f" whose id starts with {args.prefix!r}"
            out.write(f"no sessions{which} in {shown(args.store)}\n")
        return EXIT_OK
    if args.action == "prune":
        return _prune(args, store, stdin, out)
    sid = validate_session_id(args.id)
    if sid not in stored_session_ids(store):
        raise _NotFound(f"no session {sid!r} in the store {shown(args.store)!r}")
    session = agent.session(id=sid)
    if args.action == "undo":
        removed = _data(lambda: session.undo(args.turns))
        done = {"undone": sid, "turns": args.turns, "removed": len(removed),
                "messages": len(session.messages)}
        out.write(json.dumps(done) + "\n" if args.json else
                  f"removed {args.turns} turn(s), {len(removed)} messages, from {sid} "
                  f"({len(session.messages)} left)\n")
        return EXIT_OK
    if args.action == "fork":
        if args.new_id is not None:
            validate_session_id(args.new_id)
        fork = _data(lambda: session.fork(args.new_id, at_turn=args.at_turn))
        done = {"forked": sid, "into": fork.id, "messages": len(fork.messages)}
        out.write(json.dumps(done) + "\n" if args.json else
                  f"forked {sid} into {fork.id} ({len(fork.messages)} messages)\n")
        return EXIT_OK
    if args.action == "show":
        return _show(args, store, session, out)
    session.delete()
    out.write(json.dumps({"deleted": sid}) + "\n" if args.json else f"deleted {sid}\n")
    return EXIT_OK


def _data(op: Any) -> Any:
    """Run a session operation; its ConfigError (too many turns to undo, a turn past the
    end) is about the stored data, not the command line: exit code 1."""
    from .errors import ConfigError

    try:
        return op()
    except ConfigError as exc:
        raise _Failure(str(exc)) from exc


def _as_json(m: Any) -> dict[str, Any]:
    return {"role": m.role, "text": m.text,
            "tool_calls": [{"name": c.name, "arguments": dict(c.arguments)}
                           for c in m.tool_calls]}


def _as_line(m: Any) -> str:
    what = m.text or ", ".join(f"{c.name}({dict(c.arguments)})" for c in m.tool_calls)
    return f"{m.role}: {what}"


def _show(args: argparse.Namespace, store: Any, session: Any, out: TextIO) -> int:
    """The transcript, then the pending turn: its status and the messages it holds so far
    (its input, the model answers and tool results recorded before it stopped)."""
    from .records import session_key

    info = _session_info(session)
    pending_turn: list[Any] = []
    checkpoints = getattr(store, "checkpoints", None)
    if info["pending"] and checkpoints is not None:
        cp = checkpoints.load(session_key(session.id, len(session.messages)))
        if cp is not None:
            pending_turn = [*cp.input, *cp.recorded]
    if args.json:
        out.write(json.dumps({**info, "transcript": [_as_json(m) for m in session.messages],
                              "pending_turn": [_as_json(m) for m in pending_turn]},
                             indent=2) + "\n")
        return EXIT_OK
    for m in session.messages:
        out.write(_as_line(m) + "\n")
    if info["pending"] == "awaiting-approval":
        out.write(f"-- a pending turn, waiting for approval {session.pending().approval_id} "
                  "(not in the transcript until it finishes):\n")
    elif info["pending"]:
        out.write(f"-- a pending turn, interrupted (not in the transcript until it finishes: "
                  f"`lousho chat --store {shown(args.store)} --session {session.id}`, then "
                  "/retry finishes it, /discard drops it):\n")
        for m in pending_turn:
            out.write(f"   {_as_line(m)}\n")
    return EXIT_OK


def _same_store(a: str, b: str) -> bool:
    if "://" in a or "://" in b:
        return a == b
    return Path(a).resolve() == Path(b).resolve()


def _copy(args: argparse.Namespace, out: TextIO) -> int:
    from .errors import ConfigError
    from .session import validate_session_id

    source = args.source or args.store
    if args.ids and args.prefix is not None:
        raise ConfigError("give session ids or --prefix, not both")
    if _same_store(source, args.target):
        raise ConfigError(f"--from and --to name the same store {shown(source)!r}")
    wanted = [validate_session_id(sid) for sid in args.ids]
    src = open_store(source, create=False)
    try:
        dst = open_store(args.target, create=True)
        try:
            return _copy_between(args, source, src, dst, wanted, out)
        finally:
            _close(dst)
    finally:
        _close(src)


def _close(store: Any) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        close()


def _copy_between(args: argparse.Namespace, source: str, src: Any, dst: Any,
                  wanted: list[str], out: TextIO) -> int:
    if wanted:
        ids = list(dict.fromkeys(wanted))
    else:
        ids = [sid for sid in stored_session_ids(src)
               if args.prefix is None or sid.startswith(args.prefix)]
    report = copy_sessions(src, dst, ids)
    for sid in report.pending_left:
        print(f"lousho: warning: session {sid!r} has a pending turn in {shown(source)}: it was "
              "not copied (pending turns never are); to bring it, finish it there (`lousho chat "
              f"--store {shown(source)} --session {sid}`, then /retry or /discard), delete "
              f"{sid!r} from {shown(args.target)} and copy it again", file=sys.stderr)
    for sid in report.catalog_dropped:
        print(f"lousho: warning: {shown(args.target)} keeps no session metadata or compaction "
              f"history: only the transcript of {sid!r} was copied", file=sys.stderr)
    for sid, why in report.refused:
        _error(f"session {sid!r} not copied: {why}")
    if args.json:
        out.write(json.dumps({
            "copied": [{"id": sid, "messages": n} for sid, n in report.copied],
            "refused": [{"id": sid, "reason": why} for sid, why in report.refused],
            "pending_not_copied": report.pending_left}, indent=2) + "\n")
    else:
        for sid, n in report.copied:
            out.write(f"copied {sid} ({n} messages)\n")
        refused = f"; {len(report.refused)} refused" if report.refused else ""
        out.write(f"copied {len(report.copied)} of {len(ids)} sessions from {shown(source)} "
                  f"to {shown(args.target)}{refused}\n")
    return EXIT_FAILURE if report.refused else EXIT_OK


def _prune(args: argparse.Namespace, store: Any, stdin: TextIO, out: TextIO) -> int:
    if not capabilities_of(store).prune:
        raise _Failure(f"the store at {shown(args.store)!r} has no prune()")
    prune = store.prune
    if not args.yes:
        sys.stderr.write(f"delete every session, checkpoint and resolved approval not updated "
                         f"in the last {args.older_than:g} s from {shown(args.store)}? [y/N] ")
        sys.stderr.flush()
        answer = stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            raise _Failure("nothing pruned (answer y to confirm, or pass --yes)")
    result = prune(older_than_s=args.older_than)
    counts = {"sessions": result.sessions, "checkpoints": result.checkpoints,
              "approvals": result.approvals}
    if args.json:
        out.write(json.dumps({"pruned": counts}) + "\n")
    else:
        out.write(f"pruned {result.sessions} sessions, {result.checkpoints} checkpoints, "
                  f"{result.approvals} approvals\n")
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
