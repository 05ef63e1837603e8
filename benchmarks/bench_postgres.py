"""PostgresStore against bare psycopg on the same server, in the same run.

``python -m benchmarks.bench_postgres URL``: append latency (a one-message ``append``)
against a bare ``INSERT`` + ``COMMIT``; loading 10, 1,000 and 10,000 messages against a bare
``SELECT`` of the same rows. Uses (and drops) the schema ``lousho_bench``. Not yet wired into
``benchmarks.run``; turns per second across processes is not measured yet.
"""

from __future__ import annotations

import statistics
import sys
import time

import psycopg

from lousho_sync.messages import Message
from lousho_sync.postgres import PostgresStore

SCHEMA = "lousho_bench"


def _median_ms(fn: object, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as raw:
        raw.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        raw.execute("DROP TABLE IF EXISTS lousho_bench_bare")
        raw.execute("CREATE TABLE lousho_bench_bare (k bigint, seq int, json text,"
                    " PRIMARY KEY (k, seq))")
    store = PostgresStore(url, schema=SCHEMA)
    msg = Message("user", "hello " * 20)
    n = [0]

    def append() -> None:
        store.sessions.append("a", [msg], expected_length=n[0])
        n[0] += 1

    bare = psycopg.connect(url)
    seq = [0]

    def insert() -> None:
        bare.execute("INSERT INTO lousho_bench_bare VALUES (1, %s, %s)", (seq[0], "x" * 140))
        bare.commit()
        seq[0] += 1

    for _ in range(50):
        append()
        insert()
    a, b = _median_ms(append, 500), _median_ms(insert, 500)
    print(f"append: {a:.3f} ms, bare INSERT+COMMIT: {b:.3f} ms, ratio {a / b:.2f}")
    for size in (10, 1000, 10000):
        sid = f"load-{size}"
        store.sessions.save(sid, [msg] * size)
        key = store.sessions.revision(sid)[0]  # type: ignore[index]

        def bare_select(key: int = key) -> None:
            bare.execute(f"SELECT seq, json FROM {SCHEMA}.messages WHERE session_key = %s"
                         " ORDER BY seq", (key,)).fetchall()
            bare.commit()

        runs = 20 if size == 10000 else 100
        lo = _median_ms(lambda sid=sid: store.sessions.load(sid), runs)
        bs = _median_ms(bare_select, runs)
        print(f"load {size}: {lo:.3f} ms, bare SELECT: {bs:.3f} ms, ratio {lo / bs:.2f}")
    bare.close()
    store.close()
    with psycopg.connect(url, autocommit=True) as raw:
        raw.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        raw.execute("DROP TABLE IF EXISTS lousho_bench_bare")


if __name__ == "__main__":
    main(sys.argv[1])
