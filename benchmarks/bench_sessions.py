"""Per-turn cost of ``session.send`` with MemorySessionStore and FileSessionStore, by
transcript length.

    python benchmarks/bench_sessions.py [--dir DIR] [--samples N]

Each cell is the median µs of a ``session.send`` turn (ScriptedProvider, zero latency) when
the transcript already holds 10, 1,000 or 10,000 messages (pre-filled with
``store.save(id, messages)``). The turns go round-robin over enough sessions that each grows
by at most 10 messages or 10% (10 -> 20, 1,000 -> 1,100, 10,000 -> 11,000); every session's
first turn (which loads the transcript) is untimed. FileSessionStore files go to ``--dir``
(default: a temporary directory) and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lousho_sync.agent import create_agent
from lousho_sync.messages import Message
from lousho_sync.providers.scripted import ScriptedProvider
from lousho_sync.session import Session
from lousho_sync.stores.files import FileSessionStore
from lousho_sync.stores.memory import MemorySessionStore

USER = Message("user", "Can you summarise the quarterly numbers for the north region? " * 2)
ASSISTANT = Message(
    "assistant",
    "Here is the summary of the north region for the quarter: revenue grew 4% on the "
    "previous quarter, driven by the two new accounts; costs were flat; the margin "
    "improved by one point. The main risk is the delayed renewal of the largest contract, "
    "which the account team expects to close next month.",
)
SIZES = (10, 1_000, 10_000)


def measure(store: Any, size: int, samples: int) -> float:
    """Median µs of a turn with ``size`` messages already stored (``samples`` turns)."""
    per_session = max(1, min(size // 20, samples))  # each turn adds 2 messages
    sessions = max(1, -(-samples // per_session))
    provider = ScriptedProvider(default=ASSISTANT.text)
    agent = create_agent(provider=provider, store=store)
    prefill = [USER, ASSISTANT] * (size // 2)
    live: list[Session] = []
    for k in range(sessions):
        sid = f"n{size}-{k}"
        store.save(sid, prefill)
        session = agent.session(id=sid)
        session.send(USER.text)  # loads the transcript: untimed
        live.append(session)
    provider.requests.clear()
    gc.collect()
    times = []
    for i in range(sessions * per_session):
        session = live[i % sessions]
        start = time.perf_counter_ns()
        session.send(USER.text)
        times.append(time.perf_counter_ns() - start)
        provider.requests.clear()
    return statistics.median(times) / 1000


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    parser.add_argument("--samples", type=int, default=300, help="timed turns per cell")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="lousho-bench-sessions-", dir=args.dir))
    try:
        rows: list[tuple[str, list[float]]] = []
        memory = [measure(MemorySessionStore(), n, args.samples) for n in SIZES]
        rows.append(("MemorySessionStore", memory))
        files = [
            measure(FileSessionStore(directory / f"n{n}"), n, args.samples) for n in SIZES
        ]
        rows.append(("FileSessionStore", files))
        print(
            f"{'store':<20}" + "".join(f"{f'{n:,} msgs':>13}" for n in SIZES)
            + f"{'1,000/10':>10}{'10,000/10':>11}"
        )
        for name, cells in rows:
            print(
                f"{name:<20}" + "".join(f"{c:>13.1f}" for c in cells)
                + f"{cells[1] / cells[0]:>10.2f}{cells[2] / cells[0]:>11.2f}"
            )
        print(f"(median µs per session.send turn, {args.samples} turns per cell)")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
