"""A durable session whose tool needs a human's approval, resolved after a "restart".

Run: python examples/approvals.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from lousho_sync import ModelRequest, ScriptedProvider, Step, create_agent, tool
from lousho_sync.sqlite import SqliteStore


@tool(needs_approval=lambda amount, to: amount > 100)
def transfer(amount: float, to: str) -> str:
    """Send money; more than 100 needs a human's approval."""
    return f"sent {amount:.2f} to {to}"


def model(request: ModelRequest) -> Step | str:
    last = list(request.messages)[-1]
    if last.role == "tool":
        return f"Result: {last.text}"
    return Step(tool_calls=[("transfer", {"amount": 250.0, "to": "Bob"})])


def make_agent(db: Path):  # type: ignore[no-untyped-def]
    return create_agent(provider=ScriptedProvider(default=model), tools=[transfer],
                        store=SqliteStore(db))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "agent.db"
        paused = make_agent(db).session(id="acct-7").send("Pay Bob 250.")
        print(f"{paused.finish_reason}: approval {paused.approval_id}")

        # later, in another process (a new agent over the same file):
        agent = make_agent(db)
        for record in agent.approvals.list():
            print(f"pending: {record.call.name}({dict(record.call.arguments)})")
        done = agent.approvals.resolve(id=paused.approval_id, approved=True)
        print(done.text)
        print(f"{len(agent.session(id='acct-7').messages)} messages stored")


if __name__ == "__main__":
    main()
