"""The framework's own cost per turn, on ScriptedProvider with zero latency.

    python benchmarks/bench_overhead.py [--reps N] [--conversations N]

Rows: a plain one-step ``agent.send()`` turn; a turn with one tool call (two model steps
and the tool); and a session conversation in memory, per turn early (turns 1-10) and late
(turns 191-200), with the late/early ratio. Medians of ``time.perf_counter_ns`` after a
warm-up. The provider's request log is cleared between turns (outside the timing).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

from lousho_sync.agent import Agent, create_agent
from lousho_sync.providers.base import ModelRequest
from lousho_sync.providers.scripted import ScriptedProvider, Step
from lousho_sync.tools import tool

TURNS = 200
WINDOW = 10


@tool
def get_weather(city: str) -> str:
    """Return the current weather in a city."""
    return "Sunny, 21 degrees C"


def _tool_then_answer(request: ModelRequest) -> Step | str:
    if request.messages[-1].role == "user":
        return Step(tool_calls=[("get_weather", {"city": "Paris"})])
    return "done"


def _median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000


def time_calls(fn: Callable[[], object], provider: ScriptedProvider, reps: int) -> list[int]:
    """``reps`` timings of ``fn()`` in ns, after ``reps // 10`` untimed calls."""
    for _ in range(max(1, reps // 10)):
        fn()
        provider.requests.clear()
    gc.collect()
    out = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - start)
        provider.requests.clear()
    return out


def conversation_turns(agent: Agent, provider: ScriptedProvider, n: int) -> list[list[int]]:
    """``n`` in-memory conversations of TURNS turns; the timings of each turn."""
    warm = agent.session(id="warm")
    for _ in range(20):
        warm.send("hello")
        provider.requests.clear()
    out = []
    for c in range(n):
        session = agent.session(id=f"conv-{c}")
        gc.collect()
        times = []
        for turn in range(TURNS):
            text = f"turn {turn}: what changed since the last review?"
            start = time.perf_counter_ns()
            session.send(text)
            times.append(time.perf_counter_ns() - start)
            provider.requests.clear()
        out.append(times)
    return out


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=5_000, help="timed single turns per row")
    parser.add_argument("--conversations", type=int, default=20)
    args = parser.parse_args()

    plain = ScriptedProvider(default="ok")
    plain_agent = create_agent(provider=plain)
    tooled = ScriptedProvider(default=_tool_then_answer)
    tool_agent = create_agent(provider=tooled, tools=[get_weather])

    one_step = _median_us(time_calls(lambda: plain_agent.send("hello"), plain, args.reps))
    with_tool = _median_us(time_calls(lambda: tool_agent.send("hello"), tooled, args.reps))
    convs = conversation_turns(plain_agent, plain, args.conversations)
    early = _median_us([t for times in convs for t in times[:WINDOW]])
    late = _median_us([t for times in convs for t in times[-WINDOW:]])

    print(f"{'turn':<44}{'median µs':>10}")
    print(f"{'agent.send(), one model step':<44}{one_step:>10.1f}")
    print(f"{'agent.send(), one tool call (2 steps)':<44}{with_tool:>10.1f}")
    print(f"{'session.send() in memory, turns 1-10':<44}{early:>10.1f}")
    print(f"{f'session.send() in memory, turns {TURNS - WINDOW + 1}-{TURNS}':<44}{late:>10.1f}")
    print(f"late/early: {late / early:.2f}")
    print(
        f"({args.reps:,} single turns per row; {args.conversations} conversations of "
        f"{TURNS} turns)"
    )


if __name__ == "__main__":
    main()
