"""A durable agent for crash tests, used by a child process and by the test that resumes.

    python tests/crash_child.py KIND DIR MODE

KIND is ``files``, ``sqlite``, ``redis``, ``postgres`` or ``encrypted-sqlite`` (an
EncryptedStore over the SQLite store; its key in ``LOUSHO_TEST_ENCRYPTION_KEY``). MODE
``step`` prints each event of one turn and waits for a line on stdin before going on (so the
parent can SIGKILL it at an exact point); ``tool``, ``after-result`` and ``stream`` block at
that point and print BLOCKED.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from lousho_sync import (  # noqa: E402
    Agent,
    AgentStore,
    Message,
    ModelDone,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ModelToolCallDelta,
    Signal,
    ToolCall,
    ToolContext,
    Usage,
    create_agent,
    tool,
)

SESSION = "s1"
FINAL_CHUNKS = ("fin", "ish", "ed")


def _log(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _block() -> None:
    print("BLOCKED", flush=True)
    threading.Event().wait(3600)


class CrashProvider:
    """Stateless: the answer depends on how many tool results the turn has."""

    def __init__(self, root: Path, block: str | None) -> None:
        self.root = root
        self.block = block

    def complete(self, request: ModelRequest, *, signal: Signal) -> ModelResponse:
        for event in self.stream(request, signal=signal):
            if isinstance(event, ModelDone):
                return event.response
        raise AssertionError("no ModelDone")

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        msgs = list(request.messages)
        results = 0
        for m in reversed(msgs):
            if m.role == "user":
                break
            if m.role == "tool":
                results += 1
        step = results + 1
        _log(self.root / "provider.log", str(step))
        if step == 2 and self.block == "after-result":
            _block()
        if step <= 2:
            call = ToolCall(f"work-{step}", "work", {"n": step})
            yield ModelToolCallDelta(0, call.id, call.name, json.dumps({"n": step}))
            yield ModelDone(ModelResponse(Message("assistant", "", tool_calls=(call,),
                                                  usage=Usage(10, 2)), "tool_calls", "scripted"))
            return
        for i, chunk in enumerate(FINAL_CHUNKS):
            yield ModelTextDelta(chunk)
            if i == 0 and self.block == "stream":
                _block()
        yield ModelDone(ModelResponse(Message("assistant", "".join(FINAL_CHUNKS),
                                              usage=Usage(10, 3)), "stop", "scripted"))


def make_store(kind: str, root: Path) -> Any:
    """The durable store of ``kind`` under ``root``."""
    if kind.startswith("encrypted-"):  # the key comes through the environment, never argv
        from lousho_sync.stores.encrypted import EncryptedStore

        return EncryptedStore(make_store(kind.removeprefix("encrypted-"), root),
                              keys=[os.environ["LOUSHO_TEST_ENCRYPTION_KEY"]])
    if kind == "redis":
        import hashlib

        from lousho_sync.redis import RedisStore

        tag = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]
        return RedisStore(os.environ["LOUSHO_TEST_REDIS_URL"], prefix=f"lousho-test:{tag}:")
    if kind == "sqlite":
        from lousho_sync.sqlite import SqliteStore

        return SqliteStore(root / "agent.db")
    if kind == "postgres":  # a schema of the test's own, one per root (the fixture drops them)
        import hashlib

        from lousho_sync.postgres import PostgresStore

        tag = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:8]
        return PostgresStore(os.environ["LOUSHO_TEST_POSTGRES_URL"],
                             schema=f"{os.environ['LOUSHO_TEST_POSTGRES_SCHEMA']}_{tag}")
    from lousho_sync.stores.files import (
        FileSessionStore,
        FileStorage,
        LocalStorageCheckpointStore,
        StorageServiceApprovalStore,
    )

    storage = FileStorage(root / "state")
    return AgentStore(
        sessions=FileSessionStore(root / "sessions"),
        checkpoints=LocalStorageCheckpointStore(storage),
        approvals=StorageServiceApprovalStore(storage),
    )


def make_agent(kind: str, root: Path, block: str | None = None) -> Agent:
    """The crash-test agent over a durable store."""

    @tool
    def work(n: int, ctx: ToolContext) -> str:
        """Do step n (logs start and end)."""
        _log(root / "tools.log", f"start {ctx.call.id}")
        if block == "tool" and n == 1:
            _block()
        _log(root / "tools.log", f"end {ctx.call.id}")
        return f"did {n}"

    return create_agent(provider=CrashProvider(root, block), tools=[work],
                        store=make_store(kind, root))


def main() -> None:
    kind, root_s, mode = sys.argv[1:4]
    root = Path(root_s)
    block = None if mode == "step" else mode
    session = make_agent(kind, root, block).session(id=SESSION)
    run = session.stream("go")
    for event in run:
        print(f"EVENT {event.type}", flush=True)
        if mode == "step" and not sys.stdin.readline():
            return
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
