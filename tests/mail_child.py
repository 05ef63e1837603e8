"""Child processes for the session mailbox (turn policies across processes).

    python tests/mail_child.py ROLE KIND DIR

ROLE ``owner``: sends ``"A"``; the model calls ``hold``, which prints ``IN_TOOL`` and
blocks until the turn is offered input from another call (``queue``) or is aborted; the
next model call answers ``"saw: <user messages>"``; ROLE ``startowner`` is ``owner`` with
``start()`` (a detached turn, in the event log). ROLE ``steerowner`` sends ``"A"``
and its first model call hangs (printing ``IN_CALL``) until it is aborted. ROLE
``queue``/``steer``/``rollback`` sends ``"B"`` under that policy; ROLE ``abort`` calls
``abort_turn()``; ROLE ``attachabort`` attaches to the running turn and calls
``run.abort()``; ROLE ``keyqueue`` sends ``"B"`` under ``"queue"`` with the
idempotency key ``"req-1"`` (``keyrollback``: under ``"rollback"``; it prints ``FOUND``
when it meets the running turn of its key); ROLE ``keyowner`` sends ``"A"`` with that key
under ``"rollback"``, and its ``hold`` returns when a line comes on stdin; ROLE
``streamqueue`` streams ``"B"`` under ``"queue"`` (its events are in the JSON line). Each
prints ``ready``, waits for a line on stdin, then prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from crash_child import make_store

from lousho_sync import ModelRequest, ScriptedProvider, Step, create_agent, tool


class _Announced(threading.Event):
    """A gate never opened that says ``IN_CALL`` when the model call first waits on it."""

    told = False

    def wait(self, timeout: float | None = None) -> bool:
        if not self.told:
            self.told = True
            print("IN_CALL", flush=True)
        return super().wait(timeout)

SESSION = "mailbox"
WAIT_S = 60.0


def main() -> None:
    role, kind, root = sys.argv[1:]
    holder: dict[str, Any] = {}

    @tool
    def hold() -> str:
        """Wait for another call's input (or an abort)."""
        control = holder["session"]._state.current.control  # the running turn's control
        control.signal.add_callback(control.offered.set)  # wake on an abort too
        print("IN_TOOL", flush=True)
        if role == "keyowner":
            sys.stdin.readline()
        else:
            control.offered.wait(WAIT_S)
        return "held"

    def answer(request: ModelRequest) -> Step | str:
        msgs = list(request.messages)
        if msgs[-1].role == "user" and msgs[-1].text == "A" \
                and role in ("owner", "startowner", "keyowner", "endowner"):
            return Step(tool_calls=[("hold", {})])
        return "saw: " + ",".join(m.text for m in msgs if m.role == "user")

    if role == "holder":
        hold_lease(kind, root)
        return
    if role == "endowner":  # say when the joined turn is committed, go on after a line
        import lousho_sync._mailbox as mailbox

        end_join_log = mailbox.end_join_log

        def ending(*args: Any) -> None:
            print("ENDING", flush=True)
            sys.stdin.readline()
            end_join_log(*args)

        mailbox.end_join_log = ending  # type: ignore[assignment]
    if role.startswith(("line:", "rollback:")):  # say when the mail is in the mailbox
        import lousho_sync._mailbox as mailbox

        posted_input, posted_abort = mailbox.post_input, mailbox.post_abort

        def post_input(*args: Any, **kw: Any) -> None:
            posted_input(*args, **kw)
            print("POSTED", flush=True)

        def post_abort(*args: Any, **kw: Any) -> str:
            mail_id = posted_abort(*args, **kw)
            print("POSTED", flush=True)
            return mail_id

        mailbox.post_input = post_input  # type: ignore[assignment]
        mailbox.post_abort = post_abort  # type: ignore[assignment]
    policy = role if role in ("queue", "steer", "rollback") else "wait"
    if role in ("keyqueue", "streamqueue"):
        policy = "queue"
    if role in ("keyrollback", "keyowner"):
        policy = "rollback"
    if role == "keyrollback":  # say when the running turn of its key is met
        import lousho_sync.turns as turns

        found_turn = turns.keyed_turn

        def keyed_turn(*args: Any) -> Any:
            head = found_turn(*args)
            if head is not None:
                print("FOUND", flush=True)
            return head

        turns.keyed_turn = keyed_turn  # type: ignore[assignment]
    if ":" in role:
        policy = "rollback" if role.startswith("rollback:") else "queue"
    script = [Step(text="never", gate=_Announced())] if role == "steerowner" else []
    agent = create_agent(provider=ScriptedProvider(script, default=answer), tools=[hold],
                         store=make_store(kind, Path(root)))
    session = holder["session"] = agent.session(id=SESSION, turn_policy=policy)  # type: ignore[arg-type]
    print("ready", flush=True)
    sys.stdin.readline()
    if role == "abort":
        print(json.dumps({"asked": session.abort_turn("stop it")}), flush=True)
        return
    if role == "attachabort":
        run = session.attach()
        run.abort("stop it")
        print(json.dumps({"finish": run.result(timeout=WAIT_S).finish_reason}), flush=True)
        return
    events: list[dict[str, Any]] = []
    if role == "startowner":
        r = session.start("A").result()
    elif role == "streamqueue":
        run = session.stream("B")
        events = [{"type": e.type, "run_id": e.run_id, "seq": e.seq,
                   "text": getattr(e, "text", None),
                   "input": [m.text for m in getattr(e, "input", ())]} for e in run]
        r = run.result()
    elif ":" in role:
        r = session.send(role.partition(":")[2])
    elif role in ("keyqueue", "keyrollback"):
        r = session.send("B", idempotency_key="req-1")
    elif role == "keyowner":
        r = session.send("A", idempotency_key="req-1")
    else:
        r = session.send("A" if role.endswith("owner") else "B")
    print(json.dumps({"text": r.text, "finish": r.finish_reason, "run_id": r.run_id,
                      "joined": r.joined, "replayed": r.replayed,
                      "messages": [m.text for m in r.messages], "events": events}),
          flush=True)


def hold_lease(kind: str, root: str) -> None:
    from lousho_sync.stores._lease import make_owner

    store = make_store(kind, Path(root))
    owner = make_owner()
    print("ready", flush=True)
    sys.stdin.readline()
    assert store.sessions.acquire_lease(SESSION, owner=owner, ttl_s=WAIT_S, wait_s=0)
    print("HELD", flush=True)
    sys.stdin.readline()
    store.sessions.release_lease(SESSION, owner=owner)
    print(json.dumps({"released": True}), flush=True)


if __name__ == "__main__":
    main()
