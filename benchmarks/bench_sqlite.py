"""SqliteStore per-turn cost, load time and file size.

    python benchmarks/bench_sqlite.py [--dir DIR] [--turns N]

Per-turn cost is one ``sessions.append`` of a user and an assistant message (JSON encoding
included) with 10 turns (20 messages), 200 turns (400 messages), 1,000 and 10,000 messages
already in the transcript, at ``synchronous="full"`` and ``"normal"``, printed in µs and as
a ratio to the floor (goal: at most 1.3x at 10 and at 200 turns). The floor, measured in
the same run on the same disk, is a plain ``sqlite3`` loop inserting the same two
pre-encoded rows and committing, in WAL mode at the same ``synchronous``. Files go to
``--dir`` (default: a temporary directory on the disk under test) and are deleted
afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from lousho_sync.codec import dumps_message
from lousho_sync.messages import Message
from lousho_sync.sqlite import SqliteStore

USER = Message("user", "Can you summarise the quarterly numbers for the north region? " * 2)
ASSISTANT = Message(
    "assistant",
    "Here is the summary of the north region for the quarter: revenue grew 4% on the "
    "previous quarter, driven by the two new accounts; costs were flat; the margin "
    "improved by one point. The main risk is the delayed renewal of the largest contract, "
    "which the account team expects to close next month. " * 2,
)
TURN = [USER, ASSISTANT]
SIZES = (20, 400, 1_000, 10_000)


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


Turn = Callable[[int], None]


def _time_each(fn: Turn, count: int) -> list[float]:
    out = []
    for i in range(count):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def _interleaved(fns: list[Turn], count: int) -> list[list[float]]:
    """Time ``count`` calls of each function, round-robin, so disk noise hits all alike."""
    out: list[list[float]] = [[] for _ in fns]
    for i in range(count):
        for k in range(len(fns)):
            j = (i + k) % len(fns)
            start = time.perf_counter()
            fns[j](i)
            out[j].append(time.perf_counter() - start)
    return out


def floor_turn(directory: Path, synchronous: str) -> tuple[Turn, sqlite3.Connection]:
    """A plain sqlite3 INSERT (the same two rows, pre-encoded) + COMMIT, in WAL mode."""
    path = directory / f"floor-{synchronous}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
    conn.execute("CREATE TABLE t (session_key INTEGER, seq INTEGER, json TEXT)")
    rows = [dumps_message(m) for m in TURN]

    def turn(i: int) -> None:
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO t VALUES (1, ?, ?)", [(2 * i, rows[0]), (2 * i + 1, rows[1])])
        conn.execute("COMMIT")

    return turn, conn


def append_turn(store: SqliteStore, size: int, turns: int) -> Turn:
    """One append with ``size`` messages already stored, round-robin over up to 10,000 //
    ``size`` sessions so each barely grows during the run (10 -> at most 16 messages,
    1,000 and 10,000 by under 10%)."""
    sessions = max(1, min(turns, 10_000 // size))
    ids = [f"n{size}-{k}" for k in range(sessions)]
    prefill = [USER, ASSISTANT] * (size // 2)
    lengths = {}
    for sid in ids:
        store.sessions.save(sid, prefill)
        lengths[sid] = len(prefill)

    def turn(i: int) -> None:
        sid = ids[i % sessions]
        store.sessions.append(sid, TURN, expected_length=lengths[sid])
        lengths[sid] += 2

    return turn


def _checkpoint(path: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def load_ms(store: SqliteStore, path: Path) -> tuple[float, float]:
    """Median load of the 10,000-message session, and a plain SELECT of its rows."""
    sid = "load-10k"
    store.sessions.save(sid, [USER, ASSISTANT] * 5_000)
    loads = []
    for _ in range(7):
        start = time.perf_counter()
        messages = store.sessions.load(sid)
        loads.append(time.perf_counter() - start)
        assert messages is not None and len(messages) == 10_000
    conn = sqlite3.connect(path)
    selects = []
    for _ in range(7):
        start = time.perf_counter()
        conn.execute(
            "SELECT id, json FROM messages WHERE id >= ?2 * ("
            "SELECT key FROM sessions WHERE id = ?1) AND id < ?2 * (1 + ("
            "SELECT key FROM sessions WHERE id = ?1)) ORDER BY id",
            (sid, 1 << 32),
        ).fetchall()
        selects.append(time.perf_counter() - start)
    conn.close()
    return statistics.median(loads) * 1e3, statistics.median(selects) * 1e3


def size_per_1000(directory: Path) -> tuple[float, float]:
    """File bytes per 1,000 messages after 5,000 turns, and the JSON payload per 1,000."""
    path = directory / "size.db"
    with SqliteStore(path, synchronous="normal") as store:
        for i in range(5_000):
            store.sessions.append("size", TURN, expected_length=2 * i)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    payload = sum(len(dumps_message(m)) for m in TURN) * 5_000
    return os.path.getsize(path) / 10, payload / 10


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    parser.add_argument("--turns", type=int, default=0, help="appends per cell")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="lousho-bench-", dir=args.dir))
    try:

        def encode_turn(i: int) -> None:
            for m in TURN:
                dumps_message(m)

        encode = _median_us(_time_each(encode_turn, 2_000))
        print(f"files in {directory}; encoding the two messages: {encode:.1f} µs\n")
        print(
            f"{'synchronous':<12}{'floor':>9}"
            + "".join(f"{n:>10,}" for n in SIZES)
            + "  late/early"
        )
        synchronous: Literal["full", "normal"]
        for synchronous in ("full", "normal"):
            turns = args.turns or (400 if synchronous == "full" else 3_000)
            path = directory / f"store-{synchronous}.db"
            with SqliteStore(path, synchronous=synchronous) as store:
                floor, conn = floor_turn(directory, synchronous)
                fns = [floor] + [append_turn(store, n, turns) for n in SIZES]
                _checkpoint(store.path)  # start from an empty WAL: time turns, not prefill
                _interleaved(fns, 20)  # warm up
                floor_us, *cells = [_median_us(t) for t in _interleaved(fns, turns)]
                conn.close()
                if synchronous == "normal":
                    load, select = load_ms(store, path)
            row = "".join(f"{c:>10.1f}" for c in cells)
            print(f"{synchronous:<12}{floor_us:>9.1f}{row}  {cells[-1] / cells[0]:>10.2f}")
            ratios = "".join(f"{c / floor_us:>9.2f}x" for c in cells)
            print(f"{'  / floor':<12}{'':>9}{ratios}")
        print("(median µs per turn: one append of a user + an assistant message; columns are"
              " messages already stored)\n")
        print(f"load of a 10,000-message session: {load:.1f} ms (plain SELECT: {select:.1f} ms)")
        per_1000, payload = size_per_1000(directory)
        print(
            f"file size per 1,000 messages: {per_1000 / 1024:.1f} KiB "
            f"(JSON payload {payload / 1024:.1f} KiB)"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
