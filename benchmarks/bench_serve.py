"""``lousho serve`` against a SQLite store of 10,000 sessions: how long the first sessions
page and the inbox page take over HTTP.

    python benchmarks/bench_serve.py [--sessions N] [--pending 1000,10000]

The store gets N sessions (default 10,000) of 10 messages and a title; then, for each count
in ``--pending``, that many sessions get a turn paused on an approval (the pending ones are
written straight into the store, with a checkpoint, as a paused turn leaves them). ``lousho
serve --app benchmarks.bench_serve:make_agent`` runs as a child process on 127.0.0.1; each
page is fetched with the token over a new connection: the first request after start (cold),
then the median of 20. Printed in ms: ``/sessions`` (the first page of 50), ``/inbox`` (the
first 50 pending, newest first, across all sessions) and one ``/sessions/ID`` page.
"""

from __future__ import annotations

import argparse
import http.client
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lousho_sync import Agent, ScriptedProvider, create_agent, tool  # noqa: E402
from lousho_sync.messages import Message, ToolCall  # noqa: E402
from lousho_sync.records import ApprovalRecord, Checkpoint  # noqa: E402

TOKEN = "bench-serve-token-0123456789"
TRANSCRIPT = [Message("user" if i % 2 == 0 else "assistant", f"message {i} " * 20)
              for i in range(10)]


@tool(needs_approval=True)
def pay(amount: int, to: str) -> str:
    """Send money."""
    return f"paid {amount} to {to}"


def make_agent(store: Any = None) -> Agent:
    """The served app: a scripted model and one tool that needs approval."""
    return create_agent(provider=ScriptedProvider(default="ok"), tools=[pay], store=store)


def fill(db: Path, sessions: int, pending: int) -> None:
    from lousho_sync.sqlite import SqliteStore

    with SqliteStore(db, synchronous="normal") as store:
        for i in range(sessions):
            store.sessions.create(f"s{i:05d}", TRANSCRIPT, metadata={"title": f"chat {i}"})
        now = time.time()
        for i in range(pending):
            sid = f"s{i:05d}"
            key = f"{sid}.turn-10"
            call = ToolCall(f"call-{i}", "pay", {"amount": i, "to": f"payee {i}"})
            aid = f"ap-{i:05d}"
            store.checkpoints.save(key, Checkpoint(
                key=key, session_id=sid, run_id=f"run-{i}", turn_index=10,
                input=(Message("user", "pay"),),
                recorded=(Message("assistant", "", tool_calls=(call,)),),
                pending_approval_ids=(aid,), status="awaiting-approval"))
            store.approvals.create(ApprovalRecord(
                id=aid, session_id=sid, checkpoint_key=key, call=call,
                created_at=now - pending + i, expires_at=now + 86400))


def get(port: int, path: str) -> float:
    """One GET over a new connection; its wall time in ms (the status must be 200)."""
    t = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, (path, r.status, body[:300])
    finally:
        conn.close()
    return (time.perf_counter() - t) * 1000


def serve(db: Path) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "LOUSHO_SERVE_TOKEN": TOKEN,
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lousho_sync", "serve", "--store", str(db), "--port", "0",
         "--app", "benchmarks.bench_serve:make_agent"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline().strip() if ready else ""
    if not line.startswith("lousho serve: listening on "):
        proc.kill()
        raise SystemExit(f"lousho serve did not start: {line} {proc.stderr and proc.stderr.read()}")
    return proc, int(line.rsplit(":", 1)[1].strip("/"))


def bench(sessions: int, pending: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="lousho-bench-serve-"))
    try:
        db = root / "serve.db"
        t = time.perf_counter()
        fill(db, sessions, pending)
        filled = time.perf_counter() - t
        proc, port = serve(db)
        try:
            paths = {"sessions page": "/sessions", "inbox page": "/inbox",
                     "one session": "/sessions/s00000"}
            cold = {name: get(port, path) for name, path in paths.items()}
            warm = {name: statistics.median(get(port, path) for _ in range(20))
                    for name, path in paths.items()}
        finally:
            proc.terminate()
            proc.communicate(timeout=60)
        cells = "; ".join(f"{name} first {cold[name]:.1f} ms, median {warm[name]:.1f} ms"
                          for name in paths)
        print(f"{sessions} sessions, {pending} pending (filled in {filled:.1f} s): {cells}",
              flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--pending", default="100,1000,10000",
                        help="pending approvals to try, comma-separated (each at most N)")
    args = parser.parse_args()
    for pending in (int(p) for p in args.pending.split(",")):
        bench(args.sessions, min(pending, args.sessions))


if __name__ == "__main__":
    main()
