"""lousho_aio: wall time of N concurrent sessions, and the cost of streaming events.

    python benchmarks/bench_aio.py [--delay 0.2] [--sizes 1,100,1000] [--events 20000]

Concurrency: N in-memory sessions each do one turn at once (``asyncio.gather``) against a
``ScriptedProvider`` whose every call takes ``--delay`` seconds (``Step(delay_s=...)``), so
the ideal wall time is one delay whatever N. Each size is run twice: "cold" includes
starting the pool's threads, "warm" reuses them.

Streaming: one run of ``--events`` text deltas read three ways — the sync iterator (the
floor), ``async for`` over an :class:`AsyncAgentRun` (the event pump), and a naive loop
doing one executor hop per event (the design the pump replaced).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import lousho_aio
from lousho_sync.agent import create_agent as create_sync_agent
from lousho_sync.events import RunEvent
from lousho_sync.providers.scripted import ScriptedProvider, Step


async def _sessions(n: int, delay: float) -> float:
    agent = lousho_aio.create_agent(provider=ScriptedProvider(default=Step(text="ok",
                                                                           delay_s=delay)))
    sessions = [agent.session() for _ in range(n)]
    start = time.perf_counter()
    results = await asyncio.gather(*(s.send("hi") for s in sessions))
    wall = time.perf_counter() - start
    assert all(r.text == "ok" for r in results)
    return wall


def _chunks(n: int) -> Step:
    return Step(chunks=["x"] * n)


def _stream_sync(n: int) -> float:
    run = create_sync_agent(provider=ScriptedProvider(default=_chunks(n))).stream("go")
    start = time.perf_counter()
    count = sum(1 for _ in run)
    assert count == n + 4
    return time.perf_counter() - start


async def _stream_pump(n: int) -> float:
    run = lousho_aio.create_agent(provider=ScriptedProvider(default=_chunks(n))).stream("go")
    start = time.perf_counter()
    count = 0
    async for _ in run:
        count += 1
    assert count == n + 4
    return time.perf_counter() - start


async def _stream_hop_per_event(n: int) -> float:
    run = create_sync_agent(provider=ScriptedProvider(default=_chunks(n))).stream("go")
    loop = asyncio.get_running_loop()
    it: Iterator[RunEvent] = iter(run)
    end = object()
    count = 0
    with ThreadPoolExecutor(max_workers=4) as pool:
        start = time.perf_counter()
        while await loop.run_in_executor(pool, next, it, end) is not end:
            count += 1
        wall = time.perf_counter() - start
    assert count == n + 4
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    print(f"pool: max_workers={lousho_aio.max_workers()} (LOUSHO_AIO_THREADS or "
          f"configure()); provider delay {args.delay * 1000:.0f} ms per call\n")
    print(f"{'sessions':>9} {'cold wall s':>12} {'warm wall s':>12} {'turns/s':>9} "
          f"{'overhead ms':>12}")
    for n in sizes:
        cold = asyncio.run(_sessions(n, args.delay))
        warm = asyncio.run(_sessions(n, args.delay))
        print(f"{n:>9} {cold:>12.3f} {warm:>12.3f} {n / warm:>9.0f} "
              f"{(warm - args.delay) * 1000:>12.1f}")

    n = args.events
    print(f"\nstreaming {n} text deltas (+4 other events) from one run")
    print(f"{'reader':>28} {'wall s':>8} {'us/event':>9}")
    rows = [
        ("sync iterator (floor)", _stream_sync(n)),
        ("AsyncAgentRun (pump)", asyncio.run(_stream_pump(n))),
        ("one executor hop per event", asyncio.run(_stream_hop_per_event(n))),
    ]
    for name, wall in rows:
        print(f"{name:>28} {wall:>8.3f} {wall / (n + 4) * 1e6:>9.1f}")


if __name__ == "__main__":
    main()
