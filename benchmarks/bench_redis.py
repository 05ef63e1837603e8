"""RedisStore per-turn cost next to SqliteStore, in the same run.

    python benchmarks/bench_redis.py [--url URL] [--dir DIR] [--turns N]

Per-turn cost is one ``sessions.append`` of a user and an assistant message (JSON encoding
included) with 10 and 10,000 messages already in the transcript, for RedisStore and for
SqliteStore at ``synchronous="full"`` and ``"normal"``. The Redis floor is a bare
redis-py ``RPUSH`` of the same two pre-encoded messages (one round trip, no check). Also
printed: loading a 10,000-message session from each store.

The Redis server: ``--url``, else ``LOUSHO_TEST_REDIS_URL``, else a ``redis-server``
started here on a free loopback port (``--save '' --appendonly no``, like the tests: no
disk in the Redis figures; a persistent deployment adds its ``appendfsync`` cost). Keys go
under a fresh prefix and are deleted afterwards; SQLite files go to ``--dir`` (default: a
temporary directory) and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from lousho_sync.codec import dumps_message
from lousho_sync.messages import Message
from lousho_sync.redis import RedisStore
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
SIZES = (10, 10_000)

Turn = Callable[[int], None]


@contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    """``url`` or LOUSHO_TEST_REDIS_URL, or a redis-server of our own while the block runs."""
    url = url or os.environ.get("LOUSHO_TEST_REDIS_URL")
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("no redis-server on PATH: pass --url or install redis-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly",
         "no", "--daemonize", "no"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until its log says it accepts connections
            if "Ready to accept connections" in line:
                break
        else:
            raise SystemExit("redis-server did not start")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _interleaved(fns: list[Turn], count: int) -> list[list[float]]:
    """Time ``count`` calls of each function, round-robin, so noise hits all alike."""
    out: list[list[float]] = [[] for _ in fns]
    for i in range(count):
        for k in range(len(fns)):
            j = (i + k) % len(fns)
            start = time.perf_counter()
            fns[j](i)
            out[j].append(time.perf_counter() - start)
    return out


def append_turn(store: Any, size: int, turns: int) -> Turn:
    """One append with ``size`` messages already stored, round-robin over up to
    10,000 // ``size`` sessions so each barely grows during the run."""
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


def floor_turn(client: redis.Redis, prefix: str) -> Turn:
    """A bare RPUSH of the two pre-encoded messages."""
    rows = [dumps_message(m) for m in TURN]
    key = prefix + "floor"

    def turn(i: int) -> None:
        client.rpush(key, *rows)

    return turn


def load_ms(store: Any) -> float:
    """Median load of a 10,000-message session."""
    store.sessions.save("load-10k", [USER, ASSISTANT] * 5_000)
    samples = []
    for _ in range(7):
        start = time.perf_counter()
        messages = store.sessions.load("load-10k")
        samples.append(time.perf_counter() - start)
        assert messages is not None and len(messages) == 10_000
    return statistics.median(samples) * 1e3


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=None, help="Redis URL (default: start a server)")
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite files go")
    parser.add_argument("--turns", type=int, default=2_000, help="appends per cell")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="lousho-bench-", dir=args.dir))
    prefix = f"lousho-bench:{uuid.uuid4().hex[:8]}:"
    with redis_server(args.url) as url:
        client = redis.Redis.from_url(url)
        try:
            rows: list[tuple[str, list[float], float]] = []
            with RedisStore(url, prefix=prefix) as store:
                fns = [floor_turn(client, prefix)] + [
                    append_turn(store, n, args.turns) for n in SIZES
                ]
                _interleaved(fns, 50)  # warm up
                floor, *cells = [statistics.median(t) * 1e6 for t in _interleaved(fns, args.turns)]
                rows.append(("RedisStore", cells, load_ms(store)))
            for sync in ("full", "normal"):
                turns = min(args.turns, 400) if sync == "full" else args.turns
                path = directory / f"store-{sync}.db"
                with SqliteStore(path, synchronous=sync) as sql:
                    fns = [append_turn(sql, n, turns) for n in SIZES]
                    _interleaved(fns, 20)
                    cells = [statistics.median(t) * 1e6 for t in _interleaved(fns, turns)]
                    rows.append((f"SqliteStore ({sync})", cells, load_ms(sql)))
            print(f"Redis at {RedisStore(url).address}; bare RPUSH of the turn: {floor:.1f} µs\n")
            print(f"{'store':<22}" + "".join(f"{n:>12,}" for n in SIZES) + "  load 10k (ms)")
            for name, cells, load in rows:
                print(f"{name:<22}" + "".join(f"{c:>12.1f}" for c in cells) + f"{load:>15.1f}")
            print("(median µs per turn: one append of a user + an assistant message, with 10 "
                  "and 10,000 messages stored)")
        finally:
            keys = list(client.scan_iter(match=prefix + "*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
