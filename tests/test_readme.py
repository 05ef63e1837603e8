"""Every ``python`` block of README.md runs as written, imports included, each in a fresh
interpreter in an empty directory, offline: model strings ("openai/...") reach a fake
OpenAI-format server on 127.0.0.1 through OPENAI_BASE_URL. What a block says it prints, it
prints. The ``lousho`` commands of "Moving from SQLite" run against a real SQLite file and
PostgreSQL server (the ``postgres_url`` fixture). A README that drifts from the code fails
here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _http_server import FakeServer, Recorded, Reply, fixture_reply

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
WAIT = 60.0


def python_blocks() -> list[tuple[str, str]]:
    """The python blocks; fences of other languages are skipped whole."""
    found: list[tuple[str, str]] = []
    heading, lang, code = "", None, []
    for line in README.read_text().splitlines():
        if lang is not None:
            if line.startswith("```"):
                if lang == "python":
                    found.append((heading, "\n".join(code) + "\n"))
                lang = None
            else:
                code.append(line)
        elif line.startswith("## "):
            heading = line[3:].strip()
        elif line.startswith("```"):
            lang, code = line[3:].strip(), []
    return found


PYTHON_BLOCKS = python_blocks()

FLASK_CHECK = '''
# --- added by tests/test_readme.py: call the app as a client would ---
import json as _json

from lousho_sync import ProviderError as _ProviderError, Step as _Step


def _frames(_r):
    assert _r.status_code == 200 and _r.mimetype == "text/event-stream", _r.data
    _out = []
    for _block in _r.get_data(as_text=True).split("\\n\\n"):
        _lines = dict(_l.split(": ", 1) for _l in _block.splitlines() if not _l.startswith(":"))
        if "data" in _lines:
            _out.append((_lines["id"], _lines["event"], _json.loads(_lines["data"])))
    return _out


_client = app.test_client()
for _user in ("ali@example.com", "a.b", "tenant:42/x"):
    _r = _client.post(f"/chat/{_user}", json={"message": "Hi"})
    assert _r.status_code == 202, _r.data
    _turn = _r.get_json()["turn_id"]
    _events = _frames(_client.get(f"/chat/{_user}/events?turn={_turn}"))
    assert [_i for _i, _, _ in _events] == [f"{_turn}:{_d['seq']}" for _, _, _d in _events]
    assert "".join(_d["text"] for _, _t, _d in _events if _t == "text.delta") == \\
        "Hello from lousho."
    assert _events[-1][1] == "run.done" and _events[-1][2]["finish_reason"] == "stop"
    # a reconnect with Last-Event-ID goes on after that event
    _again = _frames(_client.get(f"/chat/{_user}/events?turn={_turn}",
                                 headers={"Last-Event-ID": _events[1][0]}))
    assert _again == _events[2:], (_again, _events)
    _doc = _client.get(f"/chat/{_user}").get_json()
    assert [m["role"] for m in _doc["messages"]][-2:] == ["user", "assistant"], _doc
    assert _doc["turn"] is None
# a bad Last-Event-ID: 400; a session without turns: 404
_r = _client.get("/chat/ali@example.com/events", headers={"Last-Event-ID": "garbage"})
assert _r.status_code == 400 and _r.get_json()["code"] == "LOUSHO_INVALID_EVENT_ID", _r.data
assert _client.get("/chat/nobody-here/events").status_code == 404
# a request without a "message" (or not JSON at all): 400, nothing stored
for _bad in ({"text": "Hi"}, {"message": 5}, {"message": ""}, [1, 2]):
    _r = _client.post("/chat/bad-request", json=_bad)
    assert _r.status_code == 400 and "message" in _r.get_json()["error"], (_bad, _r.data)
_r = _client.post("/chat/bad-request", data="not json", content_type="text/plain")
assert _r.status_code == 400, _r.data
assert _client.get("/chat/bad-request").get_json()["messages"] == []
# a turn that fails (a LoushoError): the stream says so in an error event, the app lives on
from lousho_sync import tool as _tool

@_tool(needs_approval=True)
def _pay(amount: int) -> str:
    """Pay."""
    return "paid"

agent = create_agent(provider=ScriptedProvider([_Step(error=_ProviderError("model down")),
                                                _Step(tool_calls=[("_pay", {"amount": 1})])]),
                     tools=[_pay], store=SqliteStore("./.lousho/agent.db"))
_r = _client.post("/chat/failing", json={"message": "Hi"})
assert _r.status_code == 202, _r.data
_events = _frames(_client.get(f"/chat/failing/events?turn={_r.get_json()['turn_id']}"))
assert _events[-2][1] == "error", _events
assert _events[-2][2]["error"]["code"] == "LOUSHO_PROVIDER_ERROR"
assert _events[-1][1] == "run.done" and _events[-1][2]["finish_reason"] == "error"
# a session whose turn waits for an approval: told with the error's code (a 409 when
# start() refuses at once, an error event when the durable turn finds it)
_waiting = agent.session(id=session_id_for("waiting"))
_waiting.discard_pending()  # from an earlier run of this block
_waiting.send("pay")
_r = _client.post("/chat/waiting", json={"message": "Hi"})
if _r.status_code == 409:
    _code = _r.get_json()["code"]
else:
    _events = _frames(_client.get(f"/chat/waiting/events?turn={_r.get_json()['turn_id']}"))
    _code = _events[-2][2]["error"]["code"]
assert _code == "LOUSHO_SESSION_AWAITING_APPROVAL", _r.data
print("flask app ok")
'''

# what each section's blocks print (substrings of stdout, in order)
EXPECTED: dict[str, list[str]] = {
    "Quick start: a script": ["Hello there", "Hello!\nStreamed in pieces.\nAnd so on.\n"],
    "Reading a transcript": ["user: What is 2 + 3?\nassistant: calls add({'a': 2, 'b': 3})\n"
                             "tool: 5\nassistant: The sum is 5.\n"],
    "Tools": ["{'type': 'integer', 'minimum': 1, 'maximum': 8, 'default': 2}\n"
              "invalid arguments for tool 'book': argument 'guest.seats': must be <= 8, got 9\n"
              "booked 2 seats for Ann on Friday\n"],
    "Streaming an answer over HTTP (server-sent events)": ["flask app ok"],
    "Turns that outlive their connection": [
        "The answer survives the client.\nrun.done None\nThe answer survives the client.\n"],
    "Session ids from user keys": ["ali-example-com-9d86ec2b59bb107bf110722c\n"
                                   "tenant-42-4b5d4625d71bf87fe91c295a\n"],
    "Turn policies": ["busy: HTTP 409\nslow\n"],
    "Durable sessions and crash recovery": ["True\nPendingTurn(status='interrupted'",
                                            "It has shipped.\nNone\n"],
    "Approvals": ["awaiting-approval", "Done: sent 25.00 to Bob.\n",
                  "asked: A-1\nasked: A-2\nasked: B-7\n['A-2', 'A-1'] None\n"
                  "Result: denied by a human: not eligible.\nalice\n"],
    "Listing, metadata, undo and fork": [
        "notes 2 None\ntrip-oslo 6 Oslo in May\nundone: ['Actually, no hotel', 'Noted.']\n"
        "trip-oslo ['Book a flight', 'Noted.']\n4 messages ever committed"],
    "Encrypted stores": ["noted\n"],
    "In an asyncio app": ["Hello there", "Hello there"],
    "Errors": ["LOUSHO_INVALID_SESSION_ID\n"],
}


def openai_fake(rec: Recorded) -> Reply:
    """Any chat completion: streamed when asked to stream."""
    wants_stream = bool(rec.json().get("stream"))
    return fixture_reply("openai_text_stream.sse" if wants_stream else "openai_text.json")


@pytest.fixture(scope="module")
def readme_server() -> object:
    """One fake OpenAI-format server for every block of the module."""
    with FakeServer() as fake:
        fake.default = openai_fake
        yield fake


def test_the_readme_has_python_blocks_for_every_expected_section() -> None:
    headings = {heading for heading, _ in PYTHON_BLOCKS}
    assert set(EXPECTED) <= headings, set(EXPECTED) - headings
    assert len(PYTHON_BLOCKS) >= 10


SECTIONS = list(dict.fromkeys(heading for heading, _ in PYTHON_BLOCKS))


@pytest.mark.parametrize("heading", SECTIONS)
def test_blocks_run_as_written(heading: str, readme_server: FakeServer, tmp_path: Path) -> None:
    """Each block of the section in a fresh interpreter and an empty directory; then what
    the section says its blocks print. A block that wrote files runs again in the same
    directory, as a user runs it again, and must print the same."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "LOUSHO_"))}
    env.update(OPENAI_API_KEY="sk-readme-test-key-0000", OPENAI_BASE_URL=readme_server.url + "/v1",
               PYTHONPATH="")
    stdout = ""
    for n, code in enumerate(code for h, code in PYTHON_BLOCKS if h == heading):
        if "Flask(__name__)" in code:
            code += FLASK_CHECK
        directory = tmp_path / f"block{n}"
        directory.mkdir()
        (directory / "block.py").write_text(code)
        proc = subprocess.run([sys.executable, "block.py"], capture_output=True, text=True,
                              cwd=directory, env=env, timeout=WAIT)
        assert proc.returncode == 0, f"block {n} of {heading!r} failed:\n{proc.stderr}"
        if {p.name for p in directory.iterdir()} != {"block.py"}:  # it wrote files
            again = subprocess.run([sys.executable, "block.py"], capture_output=True,
                                   text=True, cwd=directory, env=env, timeout=WAIT)
            assert again.returncode == 0, (
                f"block {n} of {heading!r} failed when run again:\n{again.stderr}")
            assert again.stdout == proc.stdout, f"block {n} of {heading!r}, run again"
        stdout += proc.stdout
    at = 0
    for text in EXPECTED.get(heading, []):
        found = stdout.find(text, at)
        assert found >= 0, f"{heading}: no {text!r} in {stdout[at:]!r}"
        at = found + len(text)


def test_the_tools_section_names_the_extra_that_brings_annotated_types() -> None:
    import tomllib

    text = section("Tools")
    assert "import annotated_types" in text
    extra = re.search(r"pip install 'lousho\[(\w+)\]'`\s+brings[^.;]*`annotated_types`", text)
    assert extra is not None, "the Tools section does not say which extra brings it"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(dep.startswith(("pydantic", "annotated-types")) for dep in extras[extra[1]])


def test_the_test_command_is_the_one_ci_runs() -> None:
    command = "pip install -e '.[test]' && pytest"
    assert f"```sh\n{command}\n```" in README.read_text()
    assert f"\n{command}\n" in (ROOT / ".ci" / "run").read_text()


def test_every_file_the_readme_names_is_in_the_repository() -> None:
    text = README.read_text()
    assert "../" not in text and "shared/" not in text
    named = set(re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text))  # markdown links
    named |= set(re.findall(r"`((?:examples|docs|tests|benchmarks|lousho_sync)/[\w./-]+)`",
                            text))
    named |= {m for m in re.findall(r"`([A-Z]+\.md|LICENSE)`", text)}
    assert named, "the README names no file?"
    missing = sorted(n for n in named if not (ROOT / n.rstrip("/")).exists())
    assert missing == []


def section(heading: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_the_moving_from_sqlite_commands_run_as_written(
    postgres_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    """The ``lousho`` lines of "Moving from SQLite", against a real SQLite file and a real
    PostgreSQL server (its URL, with this test's own schema, for the one in the README)."""
    import shlex

    from lousho_sync import ScriptedProvider, create_agent
    from lousho_sync.postgres import PostgresStore
    from lousho_sync.sqlite import SqliteStore

    text = section("Moving from SQLite")
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    commands = [line for block in blocks for line in block.splitlines()
                if line.startswith("lousho ")]
    assert len(commands) == 2, commands
    readme_url = "postgresql://app:secret@db.internal:5432/app"
    assert all(readme_url in c for c in commands)
    url = postgres_url + ("&" if "?" in postgres_url else "?") + f"schema={postgres_schema}"
    with SqliteStore(tmp_path / "chat.db") as sqlite:
        agent = create_agent(provider=ScriptedProvider(default="ok"), store=sqlite)
        for sid in ("ali", "bo"):
            agent.session(id=sid).send("hi")
        expected = {sid: sqlite.sessions.load(sid) for sid in ("ali", "bo")}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    outputs = []
    for command in commands:
        args = shlex.split(command.replace(readme_url, url))[1:]
        proc = subprocess.run([sys.executable, "-m", "lousho_sync", *args], cwd=tmp_path,
                              capture_output=True, text=True, env=env, timeout=WAIT)
        assert proc.returncode == 0, (command, proc.stderr)
        outputs.append(proc.stdout)
    assert outputs[0].splitlines()[-1].startswith("copied 2 of 2 sessions")
    assert sorted(line.split()[0] for line in outputs[1].splitlines()[1:]) == ["ali", "bo"]
    with PostgresStore(postgres_url, schema=postgres_schema) as pg:
        assert {sid: pg.sessions.load(sid) for sid in ("ali", "bo")} == expected
