"""A script: a session that remembers, a tool, and streamed events.

Run: python examples/quickstart.py   (offline: a scripted model stands in for a real one)
"""

from __future__ import annotations

from lousho_sync import ModelRequest, ScriptedProvider, Step, create_agent, tool


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"18°C and sunny in {city}"


def model(request: ModelRequest) -> Step | str:
    """Replace with provider=OpenAIProvider(...) or model="openai/gpt-4o-mini"."""
    last = list(request.messages)[-1]
    if last.role == "tool":
        return f"It is {last.text}."
    if "weather" in last.text:
        return Step(tool_calls=[("get_weather", {"city": "Rome"})])
    users = [m.text for m in request.messages if m.role == "user"]
    return f"You have said {len(users)} thing(s); the first was {users[0]!r}."


def main() -> None:
    agent = create_agent(instructions="Be brief.", provider=ScriptedProvider(default=model),
                         tools=[get_weather])
    session = agent.session(id="user-42")
    print(session.send("My name is Ali.").text)
    print(session.send("What did I say first?").text)
    for event in session.stream("What is the weather in Rome?"):
        if event.type == "tool.call":
            print(f"[calling {event.call.name}]")
        elif event.type == "text.delta":
            print(event.text)
    print(f"{len(session.messages)} messages in the transcript")


if __name__ == "__main__":
    main()
