"""Django views on detached turns: one durable session per user, answers read as server-sent
events (StreamingHttpResponse) that survive dropped connections.

    POST /chat/<user>         {"message": "..."}  ->  202 {"session_id", "turn_id"}
                              (400 without a message; 409 with the code when the session
                              cannot start a turn now)
    GET  /chat/<user>/events  [?turn=<turn_id>]   ->  text/event-stream of the turn (the
                              latest without ?turn), resumed after Last-Event-ID (400 when
                              it is malformed or names another turn; 404 with no turn)
    GET  /chat/<user>         ->  {"session_id", "messages", "turn": running turn or null}
    GET  /                    ->  static/chat.html, the chat page (EventSource)

The turn runs to its end in the process that started it whether or not anyone reads it;
any worker sharing the store streams it. <user> is any key (an e-mail, "tenant:42",
unicode): session_id_for() maps it to a valid session id. The model is scripted (offline);
set LOUSHO_MODEL=openai/gpt-4o-mini for a real one.
This one file is a whole Django project (settings, URLs, views); in yours, the two views go
in views.py and the agent in a module of its own.

Run:   python examples/django_view.py    (serves on 127.0.0.1 and calls itself over HTTP)
Serve: LOUSHO_DB=./chat.db python examples/django_view.py runserver 127.0.0.1:8000
       LOUSHO_DB=./chat.db gunicorn -w 4 --threads 8 --chdir examples django_view:application
       (set LOUSHO_DB so that every worker shares one SQLite file)

On PostgreSQL: when settings.DATABASES["default"] is a PostgreSQL database, the sessions go
there too (PostgresStore, tables in the schema settings.LOUSHO_POSTGRES_SCHEMA, default
"lousho"), shared by every worker and machine: postgres_conninfo() builds the conninfo from
the entry's NAME, USER, PASSWORD, HOST and PORT. Here the settings take them from
POSTGRES_DB, POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_HOST and POSTGRES_PORT:
       POSTGRES_DB=app POSTGRES_USER=app POSTGRES_PASSWORD=... POSTGRES_HOST=db.internal \
           gunicorn -w 4 --chdir examples django_view:application
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import django
from django.conf import settings

if not settings.configured:
    # What a settings.py says. DATABASES: the PostgreSQL database of $POSTGRES_DB (and its
    # user, password, host and port), or none (this example's default: SQLite for lousho).
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ["POSTGRES_DB"],
        "USER": os.environ.get("POSTGRES_USER", ""),
        "PASSWORD": os.environ.get("POSTGRES_PASSWORD", ""),
        "HOST": os.environ.get("POSTGRES_HOST", ""),
        "PORT": os.environ.get("POSTGRES_PORT", ""),
    }} if os.environ.get("POSTGRES_DB") else {}
    settings.configure(DEBUG=False, ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"],
                       SECRET_KEY="example-only", INSTALLED_APPS=[], MIDDLEWARE=[],
                       DATABASES=DATABASES,
                       LOUSHO_POSTGRES_SCHEMA=os.environ.get("LOUSHO_POSTGRES_SCHEMA",
                                                             "lousho"))
    django.setup()

from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.core.wsgi import get_wsgi_application
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from lousho_sync import (
    InvalidEventIdError,
    LoushoError,
    ModelRequest,
    ScriptedProvider,
    Step,
    TurnNotFoundError,
    create_agent,
    session_id_for,
)
from lousho_sync.sqlite import SqliteStore
from lousho_sync.sse import HEADERS, sse_stream

PAGE = Path(__file__).resolve().parent / "static" / "chat.html"

POSTGRES_ENGINES = ("django.db.backends.postgresql", "django.db.backends.postgresql_psycopg2")
DJANGO_ONLY_OPTIONS = {"isolation_level", "pool", "server_side_binding", "assume_role",
                       "cursor_factory", "context", "prepare_threshold"}


def model(req: ModelRequest) -> Step:
    """The offline stand-in for a model: counts the user's messages, a few words at a time."""
    users = [m.text for m in req.messages if m.role == "user"]
    return Step(chunks=[f"{len(users)} message(s) so far;", f" latest: {users[-1]}"])


def database() -> str:
    """$LOUSHO_DB, or a file in a temporary directory of this process (removed at exit)."""
    if os.environ.get("LOUSHO_DB"):
        return os.environ["LOUSHO_DB"]
    tmp = tempfile.TemporaryDirectory(prefix="lousho-django-")
    atexit.register(tmp.cleanup)
    return str(Path(tmp.name) / "agent.db")


def postgres_conninfo(entry: Mapping[str, Any]) -> str:
    """A libpq conninfo for a DATABASES entry: its NAME, USER, PASSWORD, HOST and PORT (the
    empty ones left to libpq's defaults and PG* variables), and the OPTIONS that are libpq
    parameters (sslmode, sslrootcert, ...)."""
    from psycopg.conninfo import make_conninfo

    params = {"dbname": entry.get("NAME"), "user": entry.get("USER"),
              "password": entry.get("PASSWORD"), "host": entry.get("HOST"),
              "port": entry.get("PORT")}
    for key, value in (entry.get("OPTIONS") or {}).items():
        if key not in DJANGO_ONLY_OPTIONS and isinstance(value, (str, int)):
            params[key] = value
    return make_conninfo(**{k: str(v) for k, v in params.items() if v not in (None, "")})


def store() -> Any:
    """PostgresStore in the project's PostgreSQL database when it has one, else SQLite."""
    default = settings.DATABASES.get("default", {})
    if default.get("ENGINE") in POSTGRES_ENGINES:
        from lousho_sync.postgres import PostgresStore

        pg = PostgresStore(postgres_conninfo(default), schema=settings.LOUSHO_POSTGRES_SCHEMA)
        atexit.register(pg.close)
        return pg
    return SqliteStore(database())


agent = create_agent(
    **({"model": os.environ["LOUSHO_MODEL"]} if os.environ.get("LOUSHO_MODEL")
       else {"provider": ScriptedProvider(default=model)}),
    store=store(),
)


def message_of(body: bytes) -> str | None:
    """The ``"message"`` of a JSON request body: a non-empty str, else None (a 400)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    text = doc.get("message") if isinstance(doc, dict) else None
    return text if isinstance(text, str) and text else None


BAD_REQUEST = {"error": 'send a JSON object with a non-empty "message" string'}


def page(request: HttpRequest) -> HttpResponse:
    return FileResponse(PAGE.open("rb"), content_type="text/html")


@csrf_exempt
def chat(request: HttpRequest, user: str) -> HttpResponse:
    """POST: start a turn of the user's session; GET: its transcript and running turn."""
    session = agent.session(id=session_id_for(user))
    if request.method == "GET":
        turn = session.current_turn()
        return JsonResponse({"session_id": session.id, "messages": [
            {"role": m.role, "text": m.text} for m in session.messages],
            "turn": None if turn is None else {"turn_id": turn.turn_id,
                                               "status": turn.status}})
    text = message_of(request.body)
    if text is None:
        return JsonResponse(BAD_REQUEST, status=400)
    try:
        run = session.start(text)  # runs to its end here, whoever reads it
    except LoushoError as exc:  # e.g. its turn waits for an approval
        return JsonResponse({"error": str(exc), "code": exc.code}, status=409)
    return JsonResponse({"session_id": session.id, "turn_id": run.turn_id}, status=202)


def events(request: HttpRequest, user: str) -> HttpResponse:
    """The turn's events as server-sent events, resumed after Last-Event-ID."""
    session = agent.session(id=session_id_for(user))
    try:
        frames = sse_stream(session, turn_id=request.GET.get("turn"),
                            last_event_id=request.headers.get("Last-Event-ID"))
    except InvalidEventIdError as exc:  # a bad or foreign Last-Event-ID
        return JsonResponse({"error": str(exc), "code": exc.code}, status=400)
    except TurnNotFoundError as exc:
        return JsonResponse({"error": str(exc), "code": exc.code}, status=404)
    # a client that hangs up closes the generator: the turn goes on
    return StreamingHttpResponse(frames, headers=HEADERS)


urlpatterns = [path("", page), path("chat/<path:user>/events", events),
               path("chat/<path:user>", chat)]
application = get_wsgi_application()


def send(port: int, user: str, message: str) -> str:
    """A client: POST a message (202 and the turn's id), then read the turn's events and
    return the answer's text."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", f"/chat/{quote(user)}", json.dumps({"message": message}),
                 {"Content-Type": "application/json"})
    started = conn.getresponse()
    assert started.status == 202, started.read()
    turn_id = json.loads(started.read())["turn_id"]
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/chat/{quote(user)}/events?turn={turn_id}")
    text, kind = "", ""
    for line in conn.getresponse():
        if line.startswith(b"event: "):
            kind = line[7:].decode().strip()
        elif line.startswith(b"data: ") and kind == "text.delta":
            text += json.loads(line[6:])["text"]
    conn.close()
    return text


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler)  # runserver's server
    server.set_app(application)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for message in ("Hi there", "Still here"):
            print(send(port, "tenant:7/ali", message))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", f"/chat/{quote('tenant:7/ali')}")
        history = json.loads(conn.getresponse().read())
        print(f"{len(history['messages'])} messages in session {history['session_id']}")
    finally:
        server.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 1:  # runserver and the other management commands
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
    else:
        main()
