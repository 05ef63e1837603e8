"""The chaos soak of issue 33: a session whose every turn calls a tool, against a model
server that answers 30% of requests with 429/500/503 and cuts 16% of streams after their
first chunk — and, in the outage variants, a store made unavailable for short spells (the
SQLite file made read-only, the Redis and PostgreSQL servers stopped and started), starting
while a tool runs or while the model answers.

The caller does what the errors tell it: a question whose error says nothing was kept
(``pending`` False, or ``turn == "resumed"``) is sent again; one kept pending is finished by
the next call. At the end every user message in the store was returned to the caller
exactly once — directly, as ``result.resumed`` or as ``error.resumed`` — and none is stored
twice.

``LOUSHO_SOAK_SEED`` replays a run. The questions and the PostgreSQL outages come from
``LOUSHO_STRESS`` (``tests/_stress.py``: 40 questions by default, 120 in CI's storm step, 500
with ``long``; the PostgreSQL soak asks at most 40 (100 with ``long``) and has 1 outage (3
with ``long``): a call made while its server is down fails only after the store's
connection retries); ``LOUSHO_SOAK_TURNS`` and ``LOUSHO_SOAK_PG_SPELLS`` set them alone."""

from __future__ import annotations

import collections
import json
import os
import random
import shlex
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from _http_server import FakeServer, Recorded, Reply, json_reply, sse_reply
from _stress import PG_SOAK_TURNS, SOAK_PG_SPELLS, SOAK_TURNS
from test_kept_turns import RedisServer

from lousho_sync import LoushoError, OpenAIProvider, ToolCall, create_agent, tool
from lousho_sync.sqlite import SqliteStore

KEY = "sk-test-chaos-soak"
TURNS = SOAK_TURNS

pytestmark = pytest.mark.stress


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    return "data: " + json.dumps({
        "id": "chatcmpl-soak", "object": "chat.completion.chunk", "created": 1,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"


def _tool_call(question: str) -> list[str]:
    call = {"index": 0, "id": f"call_{question}", "type": "function",
            "function": {"name": "note", "arguments": json.dumps({"q": question})}}
    return [_chunk({"role": "assistant", "content": None, "tool_calls": [call]}),
            _chunk({}, "tool_calls"), "data: [DONE]\n\n"]


def _answer(question: str) -> list[str]:
    return [_chunk({"role": "assistant", "content": f"re: {question}"}), _chunk({}, "stop"),
            "data: [DONE]\n\n"]


class Outage:
    """Makes the store unavailable (``begin``) and available again (``end``)."""

    def __init__(self, begin: Any, end: Any, max_spells: int = 1000) -> None:
        self._begin, self._end = begin, end
        self.max_spells = max_spells
        self.active = False
        self.over = False
        self.spells = 0
        self.lock = threading.Lock()

    def begin(self) -> None:
        with self.lock:
            if not self.active and not self.over and self.spells < self.max_spells:
                self._begin()
                self.active = True
                self.spells += 1

    def end(self) -> None:
        with self.lock:
            if self.active:
                self._end()
                self.active = False

    def finish(self) -> None:
        """Ends the spell in progress; no spell begins after it."""
        with self.lock:
            self.over = True
        self.end()


def _sqlite_read_only(db: Path) -> Outage:
    """chattr +i on the database and its WAL: writes through open descriptors fail too."""
    if shutil.which("chattr") is None:
        pytest.skip("no chattr: the SQLite outage makes the file immutable with chattr +i")

    def files() -> list[str]:
        return [str(p) for p in (db, Path(f"{db}-wal")) if p.exists()]

    def flip(flag: str) -> None:
        out = subprocess.run(["chattr", flag, *files()], capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip(f"chattr {flag} is not allowed here: {out.stderr.strip()}")

    probe = db.parent / "probe"
    probe.write_text("x")
    flip_probe = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True)
    if flip_probe.returncode != 0:
        pytest.skip(f"chattr +i is not allowed here: {flip_probe.stderr.strip()}")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    return Outage(lambda: flip("+i"), lambda: flip("-i"))


def _postgres_ctl(action: list[str]) -> list[str]:
    ctl = os.environ.get("LOUSHO_TEST_POSTGRES_CTL")
    if not ctl:
        pytest.skip("LOUSHO_TEST_POSTGRES_CTL is not set: the soak stops and starts the "
                    "server only when told how")
    command = [*shlex.split(ctl), *action]
    if os.geteuid() == 0:  # pg_ctl refuses root: run it as the server's owner
        command = ["runuser", "-u", "postgres", "--", *command]
    return command


def _postgres_outage() -> Outage:
    """Stops the server (``-m immediate``) and starts it again with the options it ran
    with (its ``postmaster.opts``: port, socket directory)."""
    ctl = shlex.split(os.environ.get("LOUSHO_TEST_POSTGRES_CTL") or "")
    data = ctl[ctl.index("-D") + 1] if "-D" in ctl else None
    if data is None:
        pytest.skip("LOUSHO_TEST_POSTGRES_CTL names no data directory (-D)")
    opts = shlex.split(Path(data, "postmaster.opts").read_text())[1:]
    at = opts.index("-D") if "-D" in opts else -1
    if at >= 0:
        del opts[at:at + 2]

    def run(action: list[str]) -> None:
        subprocess.run(_postgres_ctl(action), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                       timeout=120)

    # a call fails only after the store's connection retries (about 27 s): few spells
    return Outage(lambda: run(["stop", "-m", "immediate", "-w"]),
                  lambda: run(["start", "-w", "-t", "60", "-o", shlex.join(opts)]),
                  max_spells=SOAK_PG_SPELLS)


def _soak(
    server: FakeServer, store: Any, outage: Outage | None, seed: int, turns: int = TURNS
) -> dict[str, int]:
    rng = random.Random(seed)
    tally: collections.Counter[str] = collections.Counter()

    @tool
    def note(q: str) -> str:
        """Notes the question."""
        # the store goes away while the tool runs; past half the questions without an
        # outage yet, at this tool run (so that a short soak always has one)
        if outage is not None and (rng.random() < 0.10
                                   or (outage.spells == 0 and tally["asked"] > turns // 2)):
            outage.begin()
            tally["outage while a tool ran"] += 1
        return f"noted {q}"

    def chaos(rec: Recorded) -> Reply:
        roll = rng.random()
        if roll < 0.30:
            status = rng.choice((429, 500, 503))
            return json_reply({"error": {"message": "chaos", "type": "server_error"}}, status)
        messages = rec.json()["messages"]
        last = messages[-1]
        question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        chunks = _tool_call(question) if last["role"] == "user" else _answer(question)
        if roll < 0.46:
            return sse_reply("".join(chunks[:1]), cut=True)
        if outage is not None and last["role"] == "tool" and rng.random() < 0.05:
            outage.begin()  # the store goes away while the model answers
            tally["outage while the model answered"] += 1
        return sse_reply("".join(chunks))

    server.default = chaos
    returned: collections.Counter[str] = collections.Counter()

    def got(result: Any) -> None:
        if result is None:
            return
        users = [m.text for m in result.messages if m.role == "user"]
        assert len(users) == 1, users
        returned[users[0]] += 1
        got(result.resumed)

    with OpenAIProvider("gpt-4o-mini", api_key=KEY, base_url=server.url + "/v1",
                        backoff_s=0.0005, max_retries=0) as provider:  # faults reach the turn
        session = create_agent(provider=provider, store=store, tools=[note]).session(id="soak")
        failures_in_spell = 0
        for i in range(turns):
            question = f"q{i}"
            tally["asked"] += 1
            for _ in range(6):
                if outage is not None and outage.active and failures_in_spell >= 2:
                    outage.end()
                    failures_in_spell = 0
                try:
                    result = session.send(question)
                except LoushoError as exc:
                    failures_in_spell += 1
                    tally[f"{exc.code} pending={exc.pending} turn={exc.turn}"] += 1
                    got(exc.resumed)
                    if exc.pending and exc.turn == "own":
                        break  # kept: the next call finishes it
                    continue  # not kept: send it again
                got(result)
                tally["returned"] += 1
                break
            else:
                tally["given up"] += 1
        if outage is not None:  # a tool run by the resumes below must not stop the store
            outage.finish()
        for _ in range(20):  # finish what pends
            try:
                if session.pending() is None:
                    break
                got(session.resume())
            except LoushoError as exc:
                got(exc.resumed)
        assert session.pending() is None
        stored = [m.text for m in session.load() if m.role == "user"]
    counts = collections.Counter(stored)
    twice = sorted(q for q, n in counts.items() if n > 1)
    assert not twice, f"seed {seed}: stored twice: {twice}"
    unreturned = sorted(set(stored) - set(returned))
    assert not unreturned, f"seed {seed}: stored but never returned: {unreturned}"
    again = sorted(q for q, n in returned.items() if n > 1)
    assert not again, f"seed {seed}: returned twice: {again}"
    assert set(returned) <= set(stored), f"seed {seed}: returned but not stored"
    assert len(stored) > turns // 4, f"seed {seed}: too little got through: {tally}"
    tally["stored"] = len(stored)
    if outage is not None:
        tally["spells"] = outage.spells
        assert outage.spells > 0
    print(f"chaos soak seed {seed} (LOUSHO_SOAK_SEED={seed} replays): {dict(tally)}")
    return dict(tally)


def _seed() -> int:
    return int(os.environ.get("LOUSHO_SOAK_SEED") or random.randrange(2**32))


@pytest.mark.timeout(600)
def test_a_chaos_soak_with_tools_returns_each_stored_question_once(
    server: FakeServer, tmp_path: Path
) -> None:
    with SqliteStore(tmp_path / "soak.db") as store:
        _soak(server, store, None, _seed())


@pytest.mark.timeout(600)
def test_the_soak_with_the_sqlite_file_read_only_for_spells(
    server: FakeServer, tmp_path: Path
) -> None:
    db = tmp_path / "soak.db"
    outage = _sqlite_read_only(db)
    try:
        with SqliteStore(db) as store:
            _soak(server, store, outage, _seed())
    finally:
        outage.end()


@pytest.mark.timeout(600)
def test_the_soak_with_the_redis_server_stopped_for_spells(
    server: FakeServer, tmp_path: Path
) -> None:
    from lousho_sync.redis import RedisStore

    redis = RedisServer(tmp_path)
    redis.start()
    try:
        outage = Outage(redis.kill, redis.start)
        with RedisStore(redis.url, prefix="soak:") as store:
            _soak(server, store, outage, _seed())
    finally:
        redis.kill()


@pytest.mark.timeout(900)
def test_the_soak_with_the_postgres_server_stopped_for_spells(
    server: FakeServer, postgres_url: str, postgres_schema: str
) -> None:
    from lousho_sync.postgres import PostgresStore

    outage = _postgres_outage()
    try:
        with PostgresStore(postgres_url, schema=postgres_schema,
                           connect_timeout_s=2.0) as store:
            _soak(server, store, outage, _seed(), turns=PG_SOAK_TURNS)
    finally:
        outage.end()


def test_the_soak_tool_call_shape() -> None:  # the scripted stream is one well-formed call
    call = json.loads(_tool_call("q1")[0][len("data: "):])["choices"][0]["delta"]
    assert call["tool_calls"][0]["function"] == {"name": "note", "arguments": '{"q": "q1"}'}
    assert ToolCall("call_q1", "note", {"q": "q1"}).arguments == {"q": "q1"}
