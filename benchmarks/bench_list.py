"""``store.sessions.list()`` on 10,000 sessions, on every store: it must not load transcripts.

    python benchmarks/bench_list.py [--sessions N] [--stores memory,sqlite,encrypted-sqlite,...]

Each store gets N sessions (default 10,000) of 10 messages and a title. Printed per store:
the first page (limit 100) and a walk through every session (pages of 1,000), in ms; the
first page with 100 sessions stored, against it with N (flat: it does not grow with the
catalog); and against the baselines measured in the same run on the same data: a bare
query of the same page (SQLite, PostgreSQL: ``SELECT … ORDER BY updated_at DESC, id LIMIT
101``; Redis: ``ZREVRANGE … WITHSCORES`` plus one pipelined read of each row) and the naive
list a store without a catalog needs (load each transcript of the page). Redis: ``--redis``,
else ``LOUSHO_TEST_REDIS_URL``, else a redis-server of our own; PostgreSQL:
``LOUSHO_TEST_POSTGRES_URL`` (skipped without it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_redis import redis_server
from lousho_sync.messages import Message

TRANSCRIPT = [Message("user" if i % 2 == 0 else "assistant", f"message {i} " * 20)
              for i in range(10)]


def median_ms(fn: Callable[[], object], runs: int) -> float:
    """The median wall time of ``fn`` over ``runs`` calls, in ms (after one warm-up)."""
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def fill(store: Any, n: int, start: int = 0) -> None:
    for i in range(start, n):
        store.sessions.create(f"s{i:05d}", TRANSCRIPT, metadata={"title": f"chat {i}"})


def walk(store: Any) -> int:
    count, after = 0, None
    while True:
        page = store.sessions.list(limit=1000, after=after)
        count += len(page)
        if page.next is None:
            return count
        after = page.next


@contextmanager
def opened(kind: str, root: Path, redis_url: str | None) -> Iterator[tuple[Any, Any]]:
    """The store of ``kind`` and its bare-page baseline function (None: no baseline)."""
    if kind == "memory":
        from lousho_sync.stores.memory import memory_store

        yield memory_store(), None
    elif kind == "files":
        from lousho_sync.stores.files import FileStore

        yield FileStore(root / "files"), None
    elif kind == "sqlite":
        import sqlite3

        from lousho_sync.sqlite import SqliteStore

        with SqliteStore(root / "list.db", synchronous="normal") as store:
            conn = sqlite3.connect(root / "list.db")

            def bare() -> object:
                return conn.execute("SELECT id, length, created_at, updated_at, metadata FROM "
                                    "sessions ORDER BY updated_at DESC, id LIMIT 101").fetchall()

            yield store, bare
            conn.close()
    elif kind == "encrypted-sqlite":
        from lousho_sync import EncryptedStore
        from lousho_sync.sqlite import SqliteStore

        inner = SqliteStore(root / "list.db", synchronous="normal")
        with EncryptedStore(inner, keys=[EncryptedStore.generate_key()]) as store:
            yield store, None
    elif kind == "redis":
        import redis

        from lousho_sync.redis import RedisStore

        assert redis_url is not None
        prefix = f"bench-list-{os.getpid()}:"
        raw = redis.Redis.from_url(redis_url)
        with RedisStore(redis_url, prefix=prefix) as store:

            def bare_redis() -> object:
                ids = raw.zrevrange(prefix + "sessions", 0, 100, withscores=True)
                pipe = raw.pipeline(transaction=False)
                for member, _ in ids:
                    sid = member.decode()
                    pipe.llen(f"{prefix}session:{sid}")
                    pipe.hgetall(f"{prefix}session-info:{sid}")
                return pipe.execute()

            yield store, bare_redis
        keys = list(raw.scan_iter(prefix + "*", count=1000))
        for i in range(0, len(keys), 1000):
            raw.delete(*keys[i:i + 1000])
    else:
        import psycopg

        from lousho_sync.postgres import PostgresStore

        url = os.environ["LOUSHO_TEST_POSTGRES_URL"]
        schema = f"bench_list_{os.getpid()}"
        with PostgresStore(url, schema=schema) as store, psycopg.connect(url) as conn:

            def bare_pg() -> object:
                rows = conn.execute(
                    f"SELECT id, length, created_at, updated_at, metadata FROM {schema}.sessions"
                    " ORDER BY updated_at DESC, id LIMIT 101").fetchall()
                conn.commit()
                return rows

            yield store, bare_pg
        with psycopg.connect(url, autocommit=True) as raw_pg:
            raw_pg.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def bench(kind: str, n: int, redis_url: str | None) -> None:
    root = Path(tempfile.mkdtemp(prefix="lousho-bench-list-"))
    try:
        with opened(kind, root, redis_url) as (store, bare):
            fill(store, 100)
            small = median_ms(lambda: store.sessions.list(limit=100), 30)
            t = time.perf_counter()
            fill(store, n, 100)
            filled_s = time.perf_counter() - t
            page = median_ms(lambda: store.sessions.list(limit=100), 30)
            assert walk(store) == n
            whole = median_ms(lambda: walk(store), 3)

            def naive() -> object:
                return [store.sessions.load(i.id) for i in store.sessions.list(limit=100)]

            loaded = median_ms(naive, 10)
            line = (f"{kind:16} {n} sessions (filled in {filled_s:.1f} s): first page "
                    f"{page:.2f} ms (with 100 stored: {small:.2f} ms, x{page / small:.2f}); "
                    f"all {n} in pages of 1000: {whole:.0f} ms; loading the page's transcripts "
                    f"too: {loaded:.2f} ms (x{loaded / page:.1f})")
            if bare is not None:
                floor = median_ms(bare, 30)
                line += f"; bare page query {floor:.2f} ms, ratio {page / floor:.2f}"
            print(line, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--stores", default="memory,sqlite,encrypted-sqlite,files,redis,postgres")
    parser.add_argument("--redis", default=None, help="a Redis URL (default: see above)")
    args = parser.parse_args()
    kinds = args.stores.split(",")
    with redis_server(args.redis) if "redis" in kinds else _none() as url:
        for kind in kinds:
            if kind == "postgres" and not os.environ.get("LOUSHO_TEST_POSTGRES_URL"):
                print("postgres: skipped (set LOUSHO_TEST_POSTGRES_URL)")
                continue
            bench(kind, args.sessions, url)


@contextmanager
def _none() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
