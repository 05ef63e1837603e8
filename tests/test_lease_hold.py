"""The session lease is held from a turn's first write to its commit: across a resumed turn
and the new turn of the same call (repro_lease_dropped_after_resume.py), and nothing
releases it behind its owner."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import WAIT

from lousho_sync import (
    ProviderError,
    ScriptedProvider,
    Step,
    ToolCall,
    ToolContext,
    create_agent,
    tool,
)
from lousho_sync.stores._lease import make_owner


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    if kind == "redis":
        from lousho_sync.redis import RedisStore

        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix")
        return lambda: RedisStore(url, prefix=prefix)
    from lousho_sync.sqlite import SqliteStore

    return lambda: SqliteStore(tmp_path / "a.db")


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_send_that_resumes_a_pending_turn_keeps_the_lease_for_its_new_turn(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    open_store = _store(kind, tmp_path, request)
    in_lookup = threading.Event()
    release = threading.Event()
    pay_runs: list[str] = []

    def make(store: Any, script: list[Any]) -> Any:
        @tool
        def lookup(q: str) -> str:
            """Slow lookup."""
            in_lookup.set()
            assert release.wait(WAIT)
            return "found " + q

        @tool(on_interrupted="report")
        def pay(amount: int, context: ToolContext) -> str:
            """Pay (must never run twice)."""
            pay_runs.append(context.call.id)
            return f"paid {amount}"

        def answer(req: Any) -> Step:
            last = req.messages[-1]
            if last.role == "user" and last.content == "B":
                return Step(tool_calls=(ToolCall("look-B", "lookup", {"q": "x"}),
                                        ToolCall("pay-B", "pay", {"amount": 5})))
            return Step(text="ok")

        return create_agent(provider=ScriptedProvider(script, default=answer),
                            tools=[lookup, pay], store=store)

    store1 = open_store()
    agent1 = make(store1, [Step(error=ProviderError("boom"))])
    with pytest.raises(ProviderError):
        agent1.session(id="s").send("A")
    # (a failed turn with no progress may leave nothing pending; then nothing is resumed)
    outcome: list[object] = []
    t1 = threading.Thread(target=lambda: outcome.append(agent1.session(id="s").send("B")))
    t1.start()
    assert in_lookup.wait(WAIT)
    rival = open_store()  # another owner, as another process would be
    try:
        got = rival.sessions.acquire_lease("s", owner=make_owner(), ttl_s=30, wait_s=0.0)
        assert not got, "the lease was free while a turn was running its tool"
        agent2 = make(rival, [])
        t2 = threading.Thread(target=lambda: outcome.append(agent2.session(id="s").send("C")))
        t2.start()
        release.set()
        t1.join(WAIT)
        t2.join(WAIT)
        assert not t1.is_alive() and not t2.is_alive()
        messages = store1.sessions.load("s")
        users = [m.content for m in messages if m.role == "user"]
        assert users.count("B") == 1 and users.count("C") == 1
        assert pay_runs == ["pay-B"]
        ids = [c.id for m in messages for c in m.tool_calls]
        assert sorted(ids) == ["look-B", "pay-B"]
    finally:
        release.set()
        rival.close()
        store1.close()

