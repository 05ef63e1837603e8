"""A whole plain turn on SqliteStore against the bare fsync'd write it must make.

    python benchmarks/bench_turn_sqlite.py [--dir DIR] [--turns N]

A plain turn is ``session.send(...)`` with a ScriptedProvider (no latency, no tool) on a
``SqliteStore(synchronous="full")``: the lease, the ``running`` checkpoint and the commit of
the user and the assistant message. The floor, timed in the same run on the same disk,
alternating with the turns, is a plain ``sqlite3`` INSERT of the same two rows (pre-encoded)
and a COMMIT in WAL mode at ``synchronous=FULL``: the least a durable turn can cost. Prints
the medians in µs and their ratio (goal: at most 1.5x). Files go to ``--dir`` (default: a
temporary directory) and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from lousho_sync import create_agent
from lousho_sync.codec import dumps_message
from lousho_sync.messages import Message
from lousho_sync.providers.scripted import ScriptedProvider
from lousho_sync.sqlite import SqliteStore

QUESTION = "Can you summarise the quarterly numbers for the north region? " * 2
ANSWER = (
    "Here is the summary of the north region for the quarter: revenue grew 4% on the "
    "previous quarter, driven by the two new accounts; costs were flat; the margin "
    "improved by one point. " * 2
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    parser.add_argument("--turns", type=int, default=300, help="turns (and floor writes)")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        floor_conn = sqlite3.connect(directory / "floor.db", isolation_level=None)
        floor_conn.execute("PRAGMA journal_mode = WAL")
        floor_conn.execute("PRAGMA synchronous = FULL")
        floor_conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, json TEXT)")
        rows = [dumps_message(Message("user", QUESTION)),
                dumps_message(Message("assistant", ANSWER))]
        with SqliteStore(directory / "turns.db", synchronous="full") as store:
            agent = create_agent(provider=ScriptedProvider(default=ANSWER), store=store)
            session = agent.session("bench")
            session.send(QUESTION)  # warm up: the session exists
            turns: list[float] = []
            floors: list[float] = []
            for i in range(args.turns):
                start = time.perf_counter()
                session.send(QUESTION)
                turns.append(time.perf_counter() - start)
                start = time.perf_counter()
                floor_conn.execute("BEGIN")
                floor_conn.executemany("INSERT INTO t (json) VALUES (?)", [(r,) for r in rows])
                floor_conn.execute("COMMIT")
                floors.append(time.perf_counter() - start)
                if i % 100 == 99:  # keep the session short, as a real one between prunes
                    session = agent.session(f"bench-{i}")
        floor_conn.close()
        turn_us = statistics.median(turns) * 1e6
        floor_us = statistics.median(floors) * 1e6
        print(f"{'plain turn, synchronous=full':<34}{turn_us:>10.1f} µs")
        print(f"{'bare INSERT of 2 rows + COMMIT':<34}{floor_us:>10.1f} µs")
        print(f"{'ratio (goal <= 1.5)':<34}{turn_us / floor_us:>10.2f}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
