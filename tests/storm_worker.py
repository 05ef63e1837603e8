"""A kill-storm worker: turns on shared sessions, each calling a plain tool and an
``on_interrupted="report"`` tool, until it is killed.

    python tests/storm_worker.py KIND LOCATION WORKER SEED [TTL]

KIND is ``files``, ``sqlite``, ``redis``, ``postgres`` or ``encrypted-sqlite`` (LOCATION a
directory, or ``<url>|<prefix>`` / ``<url>|<schema>``; the key of ``encrypted-…`` in
``LOUSHO_TEST_ENCRYPTION_KEY``).
The worker first resumes every session (a restarted worker finishes what its predecessor
left), then sends turns forever. It appends to ``<log dir>/effects-<WORKER>.log``:
``sent UID`` before a send, ``returned UID`` after it returned, and the tools write
``plain CALL_ID`` / ``pay CALL_ID`` when they run. Each line is one ``os.write`` of an
O_APPEND file, so a SIGKILL never leaves half a line.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from lousho_sync import (  # noqa: E402
    AgentStore,
    ModelRequest,
    ScriptedProvider,
    Step,
    ToolCall,
    ToolContext,
    create_agent,
    tool,
)

SESSIONS = ("storm-a", "storm-b", "storm-c")
WORK_S = 0.01


class Log:
    """One O_APPEND file; every line is written by a single ``os.write``."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, text: str) -> None:
        os.write(self.fd, (text + "\n").encode())


def make_store(kind: str, location: str) -> Any:
    """The shared store of ``kind`` at ``location``."""
    if kind.startswith("encrypted-"):  # the key comes through the environment, never argv
        from lousho_sync.stores.encrypted import EncryptedStore

        return EncryptedStore(make_store(kind.removeprefix("encrypted-"), location),
                              keys=[os.environ["LOUSHO_TEST_ENCRYPTION_KEY"]])
    if kind == "redis":
        from lousho_sync.redis import RedisStore

        url, _, prefix = location.partition("|")
        return RedisStore(url, prefix=prefix)
    if kind == "postgres":
        from lousho_sync.postgres import PostgresStore

        url, _, schema = location.partition("|")
        return PostgresStore(url, schema=schema)
    if kind == "sqlite":
        from lousho_sync.sqlite import SqliteStore

        return SqliteStore(Path(location) / "agent.db")
    from lousho_sync.stores.files import (
        FileSessionStore,
        FileStorage,
        LocalStorageCheckpointStore,
        StorageServiceApprovalStore,
    )

    storage = FileStorage(Path(location) / "state")
    return AgentStore(
        sessions=FileSessionStore(Path(location) / "sessions"),
        checkpoints=LocalStorageCheckpointStore(storage),
        approvals=StorageServiceApprovalStore(storage),
    )


def answer(request: ModelRequest) -> Step:
    """Deterministic: a user message ``UID`` gets the calls ``plain-UID`` and ``pay-UID``;
    their results get the answer ``done UID``."""
    last = request.messages[-1]
    if last.role == "user":
        uid = last.text
        return Step(tool_calls=(ToolCall(f"plain-{uid}", "plain", {"uid": uid}),
                                ToolCall(f"pay-{uid}", "pay", {"uid": uid})))
    uid = (last.tool_call_id or "").partition("-")[2]
    return Step(text=f"done {uid}")


def make_agent(kind: str, location: str, log: Log) -> Any:
    """The storm agent over the shared store."""

    @tool
    def plain(uid: str, context: ToolContext) -> str:
        """A tool that may run again after a crash."""
        log.line(f"plain {context.call.id}")
        time.sleep(WORK_S)  # a tool's work: widens the windows a kill or a rival can hit
        return f"plain ok {uid}"

    @tool(on_interrupted="report")
    def pay(uid: str, context: ToolContext) -> str:
        """A tool that must never run twice."""
        log.line(f"pay {context.call.id}")
        return f"paid {uid}"

    return create_agent(provider=ScriptedProvider(default=answer), tools=[plain, pay],
                        store=make_store(kind, location))


def main() -> None:
    kind, location, worker, seed = sys.argv[1:5]
    ttl = float(sys.argv[5]) if len(sys.argv) > 5 else 5.0
    logdir = Path(os.environ["LOUSHO_STORM_LOGS"])
    log = Log(logdir / f"effects-{worker}.log")
    agent = make_agent(kind, location, log)
    rng = random.Random(f"{seed}:{worker}:{os.getpid()}")
    for sid in SESSIONS:
        agent.session(id=sid, lease_ttl_s=ttl).resume()
    print("READY", flush=True)
    n = 0
    while True:
        n += 1
        uid = f"w{worker}p{os.getpid()}n{n}"
        session = agent.session(id=rng.choice(SESSIONS), lease_ttl_s=ttl)
        log.line(f"sent {uid}")
        session.send(uid)
        log.line(f"returned {uid}")


if __name__ == "__main__":
    main()
