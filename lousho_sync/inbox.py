"""The approvals inbox: a small web app over a store (``lousho serve``), and the same app as a
WSGI callable to mount in Flask, Django or any WSGI server (:func:`inbox_app`).

Pages, rendered on the server with a little plain JavaScript and no external asset: the
sessions catalog (page by page, with metadata, filtered by id prefix), one session (its
transcript, its pending turn, its running turn live through server-sent events from
``GET /sessions/<id>/events``), and the inbox (pending approvals of every session, each with
approve and deny and a reason).

Security is part of it. Every request needs the token: a browser brings it once as
``?token=...`` and gets it back as an HttpOnly, SameSite=Strict cookie (then the URL is
cleaned by a redirect); a script sends ``Authorization: Bearer <token>``. Without it: 401.
Every POST carries the CSRF token the pages put in their forms (without it: 403). Every piece
of transcript, argument and metadata text is HTML-escaped; every response says
``Content-Security-Policy: default-src 'self'``. Deciding is resolve-once: of two operators
who click at once, one wins and the other is told who decided.

Deciding needs an agent (its model and tools continue the turn, in this process); given only
a store, the app shows everything and decides nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import logging
import secrets
import socketserver
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ._cli_approvals import age_text, when_text
from .agent import Agent, create_agent
from .errors import (
    ApprovalAlreadyResolvedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    ConfigError,
    InvalidEventIdError,
    InvalidSessionIdError,
    LoushoError,
)
from .events import RunEvent
from .ids import validate_session_id
from .messages import Message
from .providers.scripted import ScriptedProvider
from .records import ApprovalRecord, session_key
from .session import Session
from .sse import HEADERS as SSE_HEADERS
from .sse import sse_stream
from .stores.base import supports_catalog

__all__ = ["COOKIE", "TOKEN_ENV", "InboxApp", "inbox_app", "make_inbox_server", "new_token"]

_log = logging.getLogger(__name__)

COOKIE = "lousho_inbox"
TOKEN_ENV = "LOUSHO_SERVE_TOKEN"
PAGE_SIZE = 50
_MAX_BODY = 64 * 1024
_HEADERS = [
    ("Content-Security-Policy", "default-src 'self'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]

StartResponse = Callable[..., Any]


def _e(value: object) -> str:
    """HTML-escaped text (quotes too: safe in attributes)."""
    return html.escape(str(value), quote=True)


def _json(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


class _Reply(Exception):
    """A finished response raised from deep in a handler (status, body, extra headers)."""

    def __init__(self, status: str, body: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = list(headers)


class _Stream(Exception):
    """A streamed response (server-sent events) raised from a handler."""

    def __init__(self, frames: Iterator[str]) -> None:
        super().__init__("stream")
        self.frames = frames


class _Streamed:
    """The WSGI body of an event stream: frames as bytes, written one by one (wsgiref
    flushes each). ``close()`` (the server calls it when the browser leaves: the next write
    fails) closes the frames, which stops reading the turn; the turn goes on."""

    def __init__(self, frames: Iterator[str]) -> None:
        self._frames = frames

    def __iter__(self) -> Iterator[bytes]:
        for frame in self._frames:
            yield frame.encode("utf-8")

    def close(self) -> None:
        close = getattr(self._frames, "close", None)
        if close is not None:
            close()


class _ReadOnly:
    """A session's ``attach`` without takeover: watching a turn never drives it."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def attach(self, turn_id: str | None = None, *, after: int = -1) -> Iterable[RunEvent]:
        return self._session.attach(turn_id, after=after, takeover=False)


class InboxApp:
    """The WSGI application (see the module docstring); build it with :func:`inbox_app`."""

    def __init__(self, agent: Agent, *, token: str, can_decide: bool,
                 page_size: int = PAGE_SIZE, heartbeat_s: float = 15.0) -> None:
        if not isinstance(token, str) or len(token) < 16:
            raise ConfigError("the inbox token must be a str of at least 16 characters "
                              "(secrets.token_urlsafe() makes one)")
        self.agent = agent
        self.can_decide = can_decide
        self.page_size = page_size
        self.heartbeat_s = heartbeat_s
        self._token = token
        self._csrf = hmac.new(token.encode(), b"lousho-inbox-csrf", hashlib.sha256).hexdigest()

    # --- WSGI ------------------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any],
                 start_response: StartResponse) -> Iterable[bytes]:
        try:
            status, body, headers = self._handle(environ)
        except _Stream as stream:
            start_response("200 OK", [*SSE_HEADERS.items(),
                                      *(h for h in _HEADERS if h[0] != "Cache-Control")])
            return _Streamed(stream.frames)
        except _Reply as reply:
            status, body, headers = reply.status, reply.body, reply.headers
        except Exception as exc:  # never a traceback to the browser
            _log.exception("inbox: %s %s failed", environ.get("REQUEST_METHOD"),
                           environ.get("PATH_INFO"))
            status, body, headers = "500 Internal Server Error", self._page(
                "Error", f"<p class=error>{_e(type(exc).__name__)}: {_e(exc)}</p>"), []
        root = str(environ.get("SCRIPT_NAME", "")).rstrip("/")
        if root:  # mounted under a path: every link the pages make goes under it
            for attr in ("href", "action", "src", "data-events"):
                body = body.replace(f'{attr}="/', f'{attr}="{root}/')
            headers = [(k, root + v if k == "Location" and v.startswith("/") else
                        v.replace("Path=/", f"Path={root}/") if k == "Set-Cookie" else v)
                       for k, v in headers]
        data = body.encode("utf-8")
        content_type = next((v for k, v in headers if k == "Content-Type"),
                            "text/html; charset=utf-8")
        out = [(k, v) for k, v in headers if k != "Content-Type"]
        out += [("Content-Type", content_type), ("Content-Length", str(len(data))), *_HEADERS]
        start_response(status, out)
        return [data]

    def _handle(self, environ: dict[str, Any]) -> tuple[str, str, list[tuple[str, str]]]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/") or "/"
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        if path == "/favicon.ico":  # browsers ask unbidden: nothing to show (or to log)
            return "204 No Content", "", []
        given = query.get("token", [None])[0]
        if given is not None and method == "GET":
            if not hmac.compare_digest(given.encode(), self._token.encode()):
                return self._unauthorized()
            rest = {k: v for k, v in query.items() if k != "token"}
            path = "/inbox" if path == "/" else path
            target = path + ("?" + urllib.parse.urlencode(rest, doseq=True) if rest else "")
            cookie = f"{COOKIE}={self._token}; HttpOnly; SameSite=Strict; Path=/"
            return "303 See Other", "", [("Location", target), ("Set-Cookie", cookie)]
        if not self._authorized(environ):
            return self._unauthorized()
        args = {k: v[-1] for k, v in query.items()}
        if method == "POST":
            return self._post(environ, path)
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", self._page("Not allowed", "<p>GET or POST.</p>"), [
                ("Allow", "GET, POST")]
        if path == "/":
            return "303 See Other", "", [("Location", "/inbox")]
        if path == "/static/inbox.js":
            return "200 OK", _JS, [("Content-Type", "text/javascript; charset=utf-8")]
        if path == "/static/inbox.css":
            return "200 OK", _CSS, [("Content-Type", "text/css; charset=utf-8")]
        if path == "/inbox":
            return "200 OK", self._inbox(args), []
        if path == "/sessions":
            return "200 OK", self._sessions(args), []
        if path.startswith("/sessions/") and path.endswith("/events"):
            raise _Stream(self._events(path[len("/sessions/"):-len("/events")], args, environ))
        if path.startswith("/sessions/"):
            return "200 OK", self._session(path[len("/sessions/"):], args), []
        if path.startswith("/approvals/"):
            return "200 OK", self._approval(path[len("/approvals/"):]), []
        return "404 Not Found", self._page("Not found", f"<p>No page {_e(path)}.</p>"), []

    def _authorized(self, environ: Mapping[str, Any]) -> bool:
        token = self._token.encode()
        auth = str(environ.get("HTTP_AUTHORIZATION", ""))
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip().encode(), token):
            return True
        for part in str(environ.get("HTTP_COOKIE", "")).split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and hmac.compare_digest(value.encode(), token):
                return True
        return False

    def _unauthorized(self) -> tuple[str, str, list[tuple[str, str]]]:
        body = self._page("Token needed", "<p>This page needs the token <code>lousho serve</code> "
                          "printed: open the URL it printed (ending in <code>?token=…</code>) "
                          "once, and this browser keeps it.</p>", nav=False)
        return "401 Unauthorized", body, [("WWW-Authenticate", 'Bearer realm="lousho inbox"')]

    # --- layout -----------------------------------------------------------------------------
    def _page(self, title: str, content: str, *, nav: bool = True) -> str:
        links = ('<nav><a href="/inbox">Inbox</a> · <a href="/sessions">Sessions</a>'
                 '<label class=who>your name <input id=operator autocomplete=name '
                 'placeholder="who decides"></label></nav>') if nav else ""
        return (
            "<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>{_e(title)} · lousho</title>"
            '<meta name=viewport content="width=device-width, initial-scale=1">'
            '<link rel=stylesheet href="/static/inbox.css">'
            '<script src="/static/inbox.js" defer></script></head>'
            f"<body>{links}<main><h1>{_e(title)}</h1>{content}</main></body></html>"
        )

    def _decide_form(self, record: ApprovalRecord, back: str) -> str:
        if not self.can_decide:
            return ("<p class=muted>read-only: start <code>lousho serve</code> with "
                    "<code>--app</code> to decide</p>")
        return (
            f'<form method=post action="/approvals/{_e(record.id)}/decide" class=decide>'
            f'<input type=hidden name=csrf value="{_e(self._csrf)}">'
            f'<input type=hidden name=back value="{_e(back)}">'
            '<input type=hidden name=by class=by value="">'
            '<input name=reason placeholder="reason" maxlength=500 aria-label=reason>'
            '<button name=decision value=approve class=approve>Approve</button>'
            '<button name=decision value=deny class=deny>Deny</button></form>'
        )

    def _approval_rows(self, records: Iterable[ApprovalRecord], back: str) -> str:
        now = time.time()
        rows = []
        for r in records:
            expires = ("never" if r.expires_at is None
                       else f"in {age_text(r.expires_at - now)}")
            session = (f'<a href="/sessions/{_e(r.session_id)}">{_e(r.session_id)}</a>'
                       if r.session_id else "<span class=muted>one-shot run</span>")
            rows.append(
                f'<tr id="approval-{_e(r.id)}" data-approval="{_e(r.id)}">'
                f'<td><a href="/approvals/{_e(r.id)}" class=tool>{_e(r.call.name)}</a></td>'
                f"<td><pre class=arguments>{_e(_json(dict(r.call.arguments)))}</pre></td>"
                f"<td>{session}</td>"
                f'<td title="{_e(when_text(r.created_at))}">{age_text(now - r.created_at)}'
                " ago</td>"
                f'<td title="{_e(when_text(r.expires_at))}">{_e(expires)}</td>'
                f"<td>{self._decide_form(r, back)}</td></tr>"
            )
        return ("<table class=approvals><thead><tr><th>Tool</th><th>Arguments</th>"
                "<th>Session</th><th>Asked</th><th>Expires</th><th>Decision</th></tr></thead>"
                f"<tbody>{''.join(rows)}</tbody></table>")

    # --- pages ------------------------------------------------------------------------------
    def _inbox(self, args: Mapping[str, str]) -> str:
        prefix = args.get("session_prefix") or None
        try:
            page = self.agent.approvals.page(session_prefix=prefix, limit=self.page_size,
                                             cursor=args.get("cursor") or None)
        except ConfigError as exc:
            raise _Reply("400 Bad Request", self._page("Bad request", f"<p>{_e(exc)}</p>")) from exc
        search = (
            '<form method=get action="/inbox" class=filter><input name=session_prefix '
            f'placeholder="session id prefix" value="{_e(prefix or "")}">'
            "<button>Filter</button></form>"
        )
        if not page.items:
            body = "<p class=empty>No approval is waiting.</p>"
        else:
            body = self._approval_rows(page.items, "/inbox")
        more = ""
        if page.next_cursor:
            q = {"cursor": page.next_cursor, **({"session_prefix": prefix} if prefix else {})}
            more = f'<p><a href="/inbox?{_e(urllib.parse.urlencode(q))}" rel=next>Older</a></p>'
        return self._page("Inbox", search + body + more)

    def _sessions(self, args: Mapping[str, str]) -> str:
        store = _sessions_store(self.agent)
        if store is None or not supports_catalog(store):
            return self._page("Sessions", "<p>This store keeps no session catalog.</p>")
        prefix = args.get("prefix") or None
        try:
            page = store.list(prefix=prefix, limit=self.page_size, after=args.get("after") or None)
        except (ConfigError, InvalidSessionIdError) as exc:
            raise _Reply("400 Bad Request", self._page("Bad request", f"<p>{_e(exc)}</p>")) from exc
        now = time.time()
        rows = "".join(
            f'<tr><td><a href="/sessions/{_e(i.id)}">{_e(i.id)}</a></td>'
            f"<td>{i.messages}</td>"
            f'<td title="{_e(when_text(i.updated_at))}">{age_text(now - i.updated_at)} ago</td>'
            f"<td><pre class=metadata>{_e(_json(dict(i.metadata))) if i.metadata else ''}"
            "</pre></td></tr>"
            for i in page
        )
        search = (
            '<form method=get action="/sessions" class=filter><input name=prefix '
            f'placeholder="id prefix" value="{_e(prefix or "")}"><button>Filter</button></form>'
        )
        table = ("<table class=sessions><thead><tr><th>Session</th><th>Messages</th>"
                 f"<th>Updated</th><th>Metadata</th></tr></thead><tbody>{rows}</tbody></table>"
                 if rows else "<p class=empty>No session.</p>")
        more = ""
        if page.next:
            q = {"after": page.next, **({"prefix": prefix} if prefix else {})}
            more = f'<p><a href="/sessions?{_e(urllib.parse.urlencode(q))}" rel=next>Older</a></p>'
        return self._page("Sessions", search + table + more)

    def _session(self, sid: str, args: Mapping[str, str]) -> str:
        try:
            validate_session_id(sid)
        except InvalidSessionIdError as exc:
            raise _Reply("404 Not Found", self._page("Not found", f"<p>{_e(exc)}</p>")) from exc
        session = self.agent.session(sid)
        messages = session.load()
        store: Any = session.store
        info = store.info(sid) if supports_catalog(store) else None
        pending = session.pending()
        live, running = self._live(session)
        if not messages and info is None and pending is None and not running:
            raise _Reply("404 Not Found", self._page("Not found",
                                                     f"<p>No session {_e(sid)}.</p>"))
        parts = []
        decided = args.get("decided")
        if decided:
            record = self.agent.approvals.get(decided)
            if record is not None and record.status != "pending":
                who = f" by {record.resolved_by}" if record.resolved_by else ""
                parts.append(f'<p class="notice {_e(record.status)}" id=decided>'
                             f"{_e(record.call.name)} {_e(record.status)}{_e(who)}"
                             f"{_e(': ' + record.reason if record.reason else '')}; "
                             "the turn went on.</p>")
        if info is not None and info.metadata:
            parts.append("<h2>Metadata</h2><table class=metadata>" + "".join(
                f"<tr><th>{_e(k)}</th><td><pre>{_e(_json(v))}</pre></td></tr>"
                for k, v in info.metadata.items()) + "</table>")
        parts.append("<h2>Transcript</h2>" + _transcript(messages))
        parts.append("<h2>Pending turn</h2>")
        if pending is not None and session.checkpoint_store is not None:
            cp = session.checkpoint_store.load(session_key(sid, len(messages)))
            if cp is not None:  # what the unfinished turn holds so far
                parts.append(_transcript((*cp.input, *cp.recorded), "transcript pending"))
        if pending is None:
            parts.append("<p class=muted id=pending>None.</p>")
        elif pending.status == "awaiting-approval":
            waiting = self.agent.approvals.list(sid)
            parts.append("<p id=pending>Waiting for a decision:</p>"
                         + self._approval_rows(waiting, f"/sessions/{sid}"))
        else:
            parts.append("<p id=pending>A turn is unfinished: running in another process, or "
                         f"interrupted (then <code>agent.resume({_e(repr(sid))})</code> "
                         "finishes it).</p>")
        parts.append("<h2>Running turn</h2>" + live)
        return self._page(f"Session {sid}", "".join(parts))

    def _live(self, session: Session) -> tuple[str, bool]:
        """The running turn's live view: an empty list the page's script fills from the
        events endpoint (the text as text), or a line saying no turn is running; and
        whether a turn runs."""
        try:
            turn = session.current_turn()
        except LoushoError as exc:  # a store without an event log
            return f"<p class=muted id=live>No live view: {_e(exc)}</p>", False
        if turn is None or turn.status == "paused":
            return "<p class=muted id=live>No turn is running.</p>", False
        q = urllib.parse.urlencode({"turn": turn.turn_id})
        state = ("Its process died: it waits to be resumed." if turn.status == "interrupted"
                 else "Running…")
        return (f'<div id=live data-events="/sessions/{_e(session.id)}/events?{_e(q)}" '
                f'data-turn="{_e(turn.turn_id)}"><p id=live-state>{_e(state)}</p>'
                '<ol class="transcript live" id=live-steps></ol></div>', True)

    def _events(self, sid: str, args: Mapping[str, str],
                environ: Mapping[str, Any]) -> Iterator[str]:
        """The frames of the session's turn (``?turn=`` or its latest), after the browser's
        ``Last-Event-ID`` when it reconnects; 204 when there is no turn to show."""
        try:
            validate_session_id(sid)
        except InvalidSessionIdError as exc:
            raise _Reply("404 Not Found", self._page("Not found", f"<p>{_e(exc)}</p>")) from exc
        session = self.agent.session(sid)
        last = environ.get("HTTP_LAST_EVENT_ID") or None
        try:
            return sse_stream(_ReadOnly(session), last_event_id=last,
                              turn_id=args.get("turn") or None, heartbeat_s=self.heartbeat_s)
        except InvalidEventIdError as exc:
            raise _Reply("400 Bad Request", self._page("Bad request",
                                                       f"<p>{_e(exc)}</p>")) from exc
        except LoushoError as exc:
            if exc.code != "LOUSHO_TURN_NOT_FOUND":
                raise
            raise _Reply("204 No Content", "") from exc

    def _approval(self, aid: str) -> str:
        record = self.agent.approvals.get(urllib.parse.unquote(aid))
        if record is None:
            raise _Reply("404 Not Found", self._page("Not found",
                                                     f"<p>No approval {_e(aid)}.</p>"))
        rows = [("tool", record.call.name), ("status", record.status),
                ("session", record.session_id or "one-shot run"),
                ("asked", when_text(record.created_at)),
                ("expires", when_text(record.expires_at)),
                ("decided", when_text(record.resolved_at)),
                ("by", record.resolved_by or "-"), ("reason", record.reason or "-")]
        table = "<table class=record>" + "".join(
            f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + (
            f"<tr><th>arguments</th><td><pre class=arguments>"
            f"{_e(_json(dict(record.call.arguments)))}</pre></td></tr></table>")
        form = self._decide_form(record, f"/approvals/{record.id}") \
            if record.status == "pending" else ""
        return self._page(f"Approval {record.id}", table + form)

    # --- deciding ---------------------------------------------------------------------------
    def _post(self, environ: Mapping[str, Any],
              path: str) -> tuple[str, str, list[tuple[str, str]]]:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > _MAX_BODY:
            return "413 Payload Too Large", self._page("Too large", "<p>Too large.</p>"), []
        raw = environ["wsgi.input"].read(length) if length > 0 else b""
        form = {k: v[-1] for k, v in urllib.parse.parse_qs(
            raw.decode("utf-8", "replace"), keep_blank_values=True).items()}
        if not hmac.compare_digest(form.get("csrf", "").encode(), self._csrf.encode()):
            return "403 Forbidden", self._page(
                "Refused", "<p>This form is missing its CSRF token: reload the page and try "
                "again.</p>"), []
        if not (path.startswith("/approvals/") and path.endswith("/decide")):
            return "404 Not Found", self._page("Not found", f"<p>No form {_e(path)}.</p>"), []
        if not self.can_decide:
            return "403 Forbidden", self._page(
                "Read-only", "<p>This inbox was started without an agent: start "
                "<code>lousho serve</code> with <code>--app</code> to decide.</p>"), []
        aid = urllib.parse.unquote(path[len("/approvals/"):-len("/decide")])
        decision = form.get("decision")
        if decision not in ("approve", "deny"):
            return "400 Bad Request", self._page("Bad request",
                                                 "<p>Approve or deny.</p>"), []
        reason = form.get("reason", "").strip()[:500] or None
        by = form.get("by", "").strip()[:200] or None
        try:
            result = self.agent.approvals.resolve(id=aid, approved=decision == "approve",
                                                  reason=reason, by=by)
        except ApprovalExpiredError as exc:
            return "409 Conflict", self._page("Expired", (
                f"<p class=conflict id=outcome>{_e(exc)}</p>"
                + (f"<p>The turn went on: <span class=answer>{_e(exc.result.text)}</span></p>"
                   if exc.result is not None else ""))), []
        except ApprovalAlreadyResolvedError as exc:
            return "409 Conflict", self._page("Already decided", self._already(aid, exc)), []
        except ApprovalNotFoundError as exc:
            return "404 Not Found", self._page("Not found", f"<p>{_e(exc)}</p>"), []
        except LoushoError as exc:
            return "500 Internal Server Error", self._page(
                "The turn failed", f"<p class=error>Decided, but continuing the turn failed: "
                f"{_e(exc)}</p>"), []
        record = self.agent.approvals.get(aid)
        if record is not None and record.session_id:
            target = f"/sessions/{record.session_id}?decided={urllib.parse.quote(aid)}"
        else:
            target = f"/approvals/{urllib.parse.quote(aid)}"
        _log.info("inbox: approval %s %sd by %s (%s)", aid, decision, by,
                  None if result is None else result.finish_reason)
        return "303 See Other", "", [("Location", target)]

    def _already(self, aid: str, exc: ApprovalAlreadyResolvedError) -> str:
        record = self.agent.approvals.get(aid)
        if record is None:
            return f"<p class=conflict id=outcome>{_e(exc)}</p>"
        who = record.resolved_by or "someone (no name given)"
        why = f" (reason: {record.reason})" if record.reason else ""
        return (f"<p class=conflict id=outcome>Already {_e(record.status)} by "
                f"<strong class=decider>{_e(who)}</strong> at {_e(when_text(record.resolved_at))}"
                f"{_e(why)}.</p>"
                + (f'<p><a href="/sessions/{_e(record.session_id)}">See the session</a></p>'
                   if record.session_id else ""))


def _sessions_store(agent: Agent) -> Any:
    store = agent.store
    if store is None:
        return None
    return getattr(store, "sessions", store)


def _transcript(messages: Iterable[Message], css: str = "transcript") -> str:
    items = []
    for m in messages:
        calls = "".join(
            f'<div class=call>calls <b>{_e(c.name)}</b><pre class=arguments>'
            f"{_e(_json(dict(c.arguments)))}</pre></div>" for c in m.tool_calls)
        text = f"<pre class=text>{_e(m.text)}</pre>" if m.text else ""
        error = " error" if m.is_error else ""
        items.append(f'<li class="message {_e(m.role)}{error}"><span class=role>{_e(m.role)}'
                     f"</span>{text}{calls}</li>")
    if not items:
        return "<p class=muted>No message yet.</p>"
    return f"<ol class=\"{css}\">{''.join(items)}</ol>"


def inbox_app(store_or_agent: Any, *, token: str, page_size: int = PAGE_SIZE,
              heartbeat_s: float = 15.0) -> InboxApp:
    """The inbox as a WSGI application over an :class:`~lousho_sync.agent.Agent` (it decides:
    its model and tools continue decided turns) or a store (read-only). ``token`` (at least
    16 characters) is what every request must bring (see the module docstring).
    ``heartbeat_s``: the live view's keep-alive period (a browser that left is noticed at
    the next write)."""
    if isinstance(store_or_agent, Agent):
        return InboxApp(store_or_agent, token=token, can_decide=True, page_size=page_size,
                        heartbeat_s=heartbeat_s)
    reader = create_agent(provider=ScriptedProvider(default=""), store=store_or_agent)
    return InboxApp(reader, token=token, can_decide=False, page_size=page_size,
                    heartbeat_s=heartbeat_s)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("inbox: " + format, *args)


def make_inbox_server(app: InboxApp, host: str = "127.0.0.1", port: int = 8765) -> WSGIServer:
    """A threaded ``wsgiref`` server of ``app`` bound to ``host:port`` (port 0: any free
    one; ``server.server_port`` says which). Call ``serve_forever()``; ``shutdown()`` stops
    it from another thread."""
    return make_server(host, port, app, server_class=_ThreadingServer,
                       handler_class=_QuietHandler)


def new_token() -> str:
    """A fresh random token for the inbox."""
    return secrets.token_urlsafe(24)


_JS = """\
// lousho inbox: remember who decides, and send it with each decision.
(function () {
  "use strict";
  var KEY = "lousho-operator";
  function ready(fn) {
    if (document.readyState !== "loading") { fn(); } else {
      document.addEventListener("DOMContentLoaded", fn);
    }
  }
  // The running turn, live: its events from the server (text is put in as text, never
  // as HTML); step.reset drops what the step showed; run.done ends the view.
  function live(box) {
    if (!box || !box.getAttribute("data-events") || !window.EventSource) { return; }
    var state = document.getElementById("live-state");
    var list = document.getElementById("live-steps");
    var steps = {};
    var current = 0;
    var source = new EventSource(box.getAttribute("data-events"));
    function say(text) { state.textContent = text; }
    function step(n) {
      if (!steps[n]) {
        var li = document.createElement("li");
        li.className = "message assistant";
        li.setAttribute("data-step", String(n));
        list.appendChild(li);
        steps[n] = li;
      }
      return steps[n];
    }
    function on(type, fn) {
      source.addEventListener(type, function (e) { if (e.data) { fn(JSON.parse(e.data)); } });
    }
    function block(tag, css, text) {
      var el = document.createElement(tag);
      el.className = css;
      el.textContent = text;
      return el;
    }
    on("run.start", function () { say("Running…"); });
    on("step.start", function (d) { current = d.step; step(current); });
    on("step.reset", function (d) {
      if (steps[d.step]) { steps[d.step].remove(); delete steps[d.step]; }
    });
    on("text.delta", function (d) {
      var li = step(current);
      var last = li.lastElementChild;
      if (!last || last.className !== "text") { last = li.appendChild(block("pre", "text", "")); }
      last.appendChild(document.createTextNode(d.text));
    });
    on("tool.call", function (d) {
      var call = block("div", "call", "calls ");
      call.appendChild(block("b", "tool", d.call.name));
      call.appendChild(block("pre", "arguments", JSON.stringify(d.call.arguments, null, 2)));
      step(current).appendChild(call);
    });
    on("tool.result", function (d) {
      step(current).appendChild(block("pre", d.is_error ? "result error" : "result", d.result));
    });
    on("approval.requested", function (d) {
      say("Waiting for a decision on " + d.call.name + ": reload the page to decide.");
    });
    on("error", function (d) { say("The turn failed: " + (d.error && d.error.message)); });
    on("run.done", function (d) {
      source.close();
      if (d.finish_reason !== "awaiting-approval") {
        say("The turn ended (" + d.finish_reason + "). Reload the page to see it in the " +
            "transcript.");
      }
      box.setAttribute("data-done", d.finish_reason);
    });
    source.addEventListener("error", function (e) {
      if (!e.data && source.readyState === EventSource.CLOSED &&
          !box.getAttribute("data-done")) {
        say("The live view was cut: reload the page.");
      }
    });
  }

  ready(function () {
    var who = document.getElementById("operator");
    var name = "";
    try { name = window.localStorage.getItem(KEY) || ""; } catch (e) { name = ""; }
    if (who) {
      who.value = name;
      who.addEventListener("input", function () {
        try { window.localStorage.setItem(KEY, who.value); } catch (e) { /* private mode */ }
      });
    }
    var forms = document.querySelectorAll("form.decide");
    Array.prototype.forEach.call(forms, function (form) {
      form.addEventListener("submit", function () {
        var by = form.querySelector("input.by");
        if (by && who) { by.value = who.value; }
        window.setTimeout(function () {
          Array.prototype.forEach.call(form.querySelectorAll("button"), function (b) {
            b.disabled = true;
          });
        }, 0);
      });
    });
    live(document.getElementById("live"));
    document.documentElement.setAttribute("data-inbox-ready", "1");
  });
})();
"""

_CSS = """\
body { font: 15px/1.4 system-ui, sans-serif; margin: 0; color: #222; }
nav { background: #1f2937; color: #fff; padding: .6em 1em; }
nav a { color: #fff; margin-right: 1em; }
nav .who { float: right; font-size: .9em; }
main { padding: 1em 1.5em; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; border-bottom: 1px solid #ddd; padding: .4em; }
pre { margin: 0; white-space: pre-wrap; word-break: break-word; font-size: .9em; }
.muted, .empty { color: #666; }
.transcript { list-style: none; padding: 0; }
.message { border-left: 3px solid #ccc; margin: .5em 0; padding: .3em .8em; }
.message.user { border-color: #2563eb; }
.message.assistant { border-color: #16a34a; }
.message.tool { border-color: #a16207; }
.message.error { border-color: #dc2626; }
.role { font-weight: 600; font-size: .85em; text-transform: uppercase; color: #555; }
form.decide input[name=reason] { width: 12em; }
button.approve { background: #16a34a; color: #fff; border: 0; padding: .3em .8em; }
button.deny { background: #dc2626; color: #fff; border: 0; padding: .3em .8em; }
.notice { background: #ecfdf5; padding: .5em 1em; }
.call b, .result { font-size: .9em; }
.conflict, .error { background: #fef2f2; padding: .5em 1em; }
"""
