"""A child process that sends one message with an idempotency key.

    python tests/idem_child.py KIND DIR SESSION KEY [ROLE]

It prints ``ready``, waits for a line on stdin (so the parent releases several at once),
sends ``"pay 10"`` with the key (the turn calls a tool, so it runs a while) and prints one
JSON line: what its result says. ROLE ``held``: the tool prints ``IN_TOOL`` and waits for
another line on stdin. ROLE ``stream``: the call is ``stream()``; it prints the events read so far
(``{"event": type, "turn_id", "seq"}`` each) once it has read ``tool.call``, and every
event it read with its result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from crash_child import make_store

from lousho_sync import ModelRequest, ScriptedProvider, Step, create_agent, tool
from lousho_sync.codec import message_to_dict

ROLE = sys.argv[5] if len(sys.argv) > 5 else ""


@tool
def pay(amount: int) -> str:
    """Pay."""
    if ROLE == "held":
        print("IN_TOOL", flush=True)
        sys.stdin.readline()
    return f"paid {amount}"


def answer(request: ModelRequest) -> Step | str:
    last = list(request.messages)[-1]
    if last.role == "tool":
        return "done: " + last.text
    return Step(tool_calls=[("pay", {"amount": 10})])


def main() -> None:
    kind, root, sid, key = sys.argv[1:5]
    agent = create_agent(provider=ScriptedProvider(default=answer), tools=[pay],
                         store=make_store(kind, Path(root)))
    session = agent.session(id=sid)
    print("ready", flush=True)
    sys.stdin.readline()
    events: list[dict[str, object]] = []
    if ROLE == "stream":
        run = session.stream("pay 10", idempotency_key=key)
        for e in run:
            events.append({"event": e.type, "turn_id": e.turn_id, "seq": e.seq})
            if e.type == "tool.call":
                print(json.dumps(events), flush=True)
        r = run.result()
    else:
        r = session.send("pay 10", idempotency_key=key)
    print(json.dumps({
        "text": r.text, "run_id": r.run_id, "steps": r.steps, "finish": r.finish_reason,
        "usage": [r.usage.input_tokens, r.usage.output_tokens],
        "messages": [message_to_dict(m) for m in r.messages], "replayed": r.replayed,
        "events": events,
    }), flush=True)


if __name__ == "__main__":
    main()
