"""A worker of the mailbox kill storm (tests/test_mail_storm.py).

    python tests/mail_storm_worker.py KIND ROOT WORKER LEASE_TTL_S

Sends ``<worker>-<pid>-<n>`` on session ``storm`` with ``turn_policy="queue"`` (a turn calls
one tool), forever; after each ``send()`` returns, appends the label (and whether it joined
another process's turn) to ``ROOT/returned-<worker>.txt``; prints ``up`` once its first
``send()`` returned.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from crash_child import make_store

from lousho_sync import ModelRequest, ScriptedProvider, Step, create_agent, tool


@tool
def work(n: int) -> str:
    """Do some work (20 ms: long enough for other processes' input to join the turn)."""
    time.sleep(0.02)
    return str(n)


def answer(request: ModelRequest) -> Step | str:
    last = list(request.messages)[-1]
    if last.role == "user":
        return Step(tool_calls=[("work", {"n": 20_000})])
    return "done"


def main() -> None:
    kind, root, worker, ttl = sys.argv[1:]
    agent = create_agent(provider=ScriptedProvider(default=answer), tools=[work],
                         store=make_store(kind, Path(root)))
    session = agent.session(id="storm", turn_policy="queue", lease_ttl_s=float(ttl))
    out = Path(root) / f"returned-{worker}.txt"
    n = 0
    while True:
        label = f"{worker}-{os.getpid()}-{n}"
        r = session.send(label)
        with out.open("a") as f:
            f.write(f"{label} {int(r.joined)}\n")
        if n == 0:
            print("up", flush=True)
        n += 1


if __name__ == "__main__":
    main()
