"""A Django view: one durable session per user, in a SQLite file.

Run: python examples/django_view.py   (configures a minimal Django and calls the view)
"""

from __future__ import annotations

import json
import os
import tempfile

import django
from django.conf import settings

if not settings.configured:
    settings.configure(DEBUG=True, ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"],
                       SECRET_KEY="example-only")
    django.setup()

from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from lousho_sync import ModelRequest, ScriptedProvider, create_agent
from lousho_sync.sqlite import SqliteStore


def model(req: ModelRequest) -> str:
    users = [m.text for m in req.messages if m.role == "user"]
    return f"{len(users)} message(s) so far; latest: {users[-1]}"


DB = os.environ.get("LOUSHO_DB", os.path.join(tempfile.gettempdir(), "lousho-django.db"))
agent = create_agent(provider=ScriptedProvider(default=model), store=SqliteStore(DB))


@csrf_exempt
def chat(request: HttpRequest, user_id: str) -> JsonResponse:
    """POST {"message": ...}: one turn of the user's session (turns queue in call order)."""
    body = json.loads(request.body)
    result = agent.session(id=user_id).send(body["message"])
    return JsonResponse({"text": result.text})


urlpatterns = [path("chat/<str:user_id>", chat)]


def main() -> None:
    client = Client()
    for text in ("Hi there", "Still here"):
        response = client.post("/chat/ali", data=json.dumps({"message": text}),
                               content_type="application/json")
        print(response.json()["text"])


if __name__ == "__main__":
    main()
