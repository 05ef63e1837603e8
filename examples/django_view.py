"""A Django view: one durable session per user, answers streamed as server-sent events
with StreamingHttpResponse.

    POST /chat/<user>   {"message": "..."}  ->  text/event-stream:
                        data: {"text": "..."}            one per text delta
                        event: done / data: {...}        finish_reason, session_id, messages
    GET  /chat/<user>                       ->  {"session_id": ..., "messages": [...]}

<user> is any key (an e-mail, "tenant:42", unicode): session_id_for() maps it to a valid
session id. A client that disconnects mid-stream aborts its turn: the transcript stays as
it was. The model is scripted (offline); set LOUSHO_MODEL=openai/gpt-4o-mini for a real one.
This one file is a whole Django project (settings, URLs, views); in yours, the two views go
in views.py and the agent in a module of its own.

Run:   python examples/django_view.py    (serves on 127.0.0.1 and calls itself over HTTP)
Serve: LOUSHO_DB=./chat.db python examples/django_view.py runserver 127.0.0.1:8000
       LOUSHO_DB=./chat.db gunicorn -w 4 --chdir examples django_view:application
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
from collections.abc import Iterator, Mapping
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
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from lousho_sync import (
    LoushoError,
    ModelRequest,
    ScriptedProvider,
    Step,
    create_agent,
    session_id_for,
)
from lousho_sync.sqlite import SqliteStore

POSTGRES_ENGINES = ("django.db.backends.postgresql", "django.db.backends.postgresql_psycopg2")
DJANGO_ONLY_OPTIONS = {"isolation_level", "pool", "server_side_binding", "assume_role",
                       "cursor_factory", "context", "prepare_threshold"}


def model(req: ModelRequest) -> Step:
    """The offline stand-in for a model: counts the user's messages, a few words at a time;
    asked for a story, it goes on for a long while (long enough to hang up in the middle)."""
    users = [m.text for m in req.messages if m.role == "user"]
    if "story" in users[-1]:
        return Step(chunks=["Once upon a time"] + [" and then"] * 20_000 + ["."])
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


def sse(data: object, event: str | None = None) -> str:
    """One server-sent event."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def message_of(body: bytes) -> str | None:
    """The ``"message"`` of a JSON request body: a non-empty str, else None (a 400)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    text = doc.get("message") if isinstance(doc, dict) else None
    return text if isinstance(text, str) and text else None


BAD_REQUEST = {"error": 'send a JSON object with a non-empty "message" string'}


@csrf_exempt
def chat(request: HttpRequest, user: str) -> HttpResponse:
    """POST: one streamed turn of the user's session; GET: its transcript."""
    session = agent.session(id=session_id_for(user))
    if request.method == "GET":
        return JsonResponse({"session_id": session.id, "messages": [
            {"role": m.role, "text": m.text} for m in session.messages]})
    text = message_of(request.body)
    if text is None:
        return JsonResponse(BAD_REQUEST, status=400)
    try:
        run = session.stream(text)
    except LoushoError as exc:  # e.g. its turn waits for an approval (a store without
        return JsonResponse({"error": str(exc), "code": exc.code}, status=409)  # checkpoints)

    def events() -> Iterator[str]:
        # A client that hangs up makes the server close this generator: the loop stops,
        # and leaving it aborts the turn (nothing of it is saved).
        try:
            for event in run:
                if event.type == "text.delta":
                    yield sse({"text": event.text})
                elif event.type == "run.done":
                    yield sse({"finish_reason": event.finish_reason, "session_id": session.id,
                               "messages": len(session.messages)}, "done")
        except LoushoError as exc:  # e.g. SessionAwaitingApprovalError: told, not raised
            yield sse({"error": str(exc), "code": exc.code}, "error")

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


urlpatterns = [path("chat/<path:user>", chat)]
application = get_wsgi_application()


def read_stream(port: int, user: str, message: str) -> str:
    """A client: POST a message, print the answer as it streams in."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", f"/chat/{quote(user)}", json.dumps({"message": message}),
                 {"Content-Type": "application/json"})
    text = ""
    for line in conn.getresponse():
        if line.startswith(b"data: ") and "text" in (data := json.loads(line[6:])):
            text += data["text"]
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
            print(read_stream(port, "tenant:7/ali", message))
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
