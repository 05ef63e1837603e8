"""PostgresStore against bare psycopg on the same server, in the same run, and turns per
second across processes.

    python benchmarks/bench_postgres.py [--url URL] [--seconds S] [--processes N]

1. Append latency: a one-message ``append``, against a bare ``INSERT`` + ``COMMIT`` on one
   connection (median of 500 each, the two timed in alternation).
2. Load: ``sessions.load`` of 10, 1,000 and 10,000 user messages, and of 10,000 of a mixed
   transcript (user, an assistant tool call with usage, its result, an answer), against a
   bare ``SELECT`` of the same rows (median, in alternation).
3. Turns per second: ``--processes`` (default 4) real subprocesses, each with its own
   PostgresStore and an agent on a ScriptedProvider (zero model latency), run
   ``session.send`` turns for ``--seconds`` (default 5) over 1, 10 and 100 sessions (every
   process cycles over all the sessions from its own starting point, so with 1 session the
   four take turns on one lease). Committed turns are counted in PostgreSQL afterwards (the
   stored messages / 2, checked against what the processes report) and divided by the wall
   time from the start signal to the last process done. For reference, the same with one
   process over 100 sessions (what one process does alone on this machine).

The server: ``--url``, else ``LOUSHO_TEST_POSTGRES_URL``; without one the benchmark says it
was skipped. Everything goes to schemas of this run's own (``lousho_bench_<random>``…),
dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lousho_sync.agent import create_agent  # noqa: E402
from lousho_sync.messages import Message, ToolCall, Usage  # noqa: E402
from lousho_sync.postgres import PostgresStore  # noqa: E402
from lousho_sync.providers.scripted import ScriptedProvider  # noqa: E402

SESSIONS = (1, 10, 100)
ANSWER = "Here is the summary of the north region for the quarter: revenue grew 4%."


def _paired_ms(a: Callable[[], object], b: Callable[[], object], n: int) -> tuple[float, float]:
    """Medians of ``a`` and ``b`` timed in alternation (which goes first alternates too),
    so a slow stretch of the machine weighs on both alike."""
    ta: list[float] = []
    tb: list[float] = []
    for i in range(n):
        for fn, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return statistics.median(ta) * 1000, statistics.median(tb) * 1000


def _drop(url: str, *schemas: str) -> None:
    with psycopg.connect(url, autocommit=True) as raw:
        for name in schemas:
            raw.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def latency(url: str, schema: str) -> None:
    """Append against a bare INSERT+COMMIT; load against a bare SELECT."""
    bare_schema = f"{schema}_bare"
    table = sql.SQL("{}.bare").format(sql.Identifier(bare_schema))
    with psycopg.connect(url, autocommit=True) as raw:
        raw.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(bare_schema)))
        raw.execute(sql.SQL("CREATE TABLE {} (k bigint, seq int, json text,"
                            " PRIMARY KEY (k, seq))").format(table))
    store = PostgresStore(url, schema=schema)
    msg = Message("user", "hello " * 20)
    n = [0]

    def append() -> None:
        store.sessions.append("a", [msg], expected_length=n[0])
        n[0] += 1

    bare = psycopg.connect(url)
    seq = [0]
    insert_sql = sql.SQL("INSERT INTO {} VALUES (1, %s, %s)").format(table)

    def insert() -> None:
        bare.execute(insert_sql, (seq[0], "x" * 140))
        bare.commit()
        seq[0] += 1

    for _ in range(50):
        append()
        insert()
    a, b = _paired_ms(append, insert, 500)
    print(f"append: {a:.3f} ms, bare INSERT+COMMIT: {b:.3f} ms, ratio {a / b:.2f}")
    select_sql = sql.SQL("SELECT seq, json FROM {}.messages WHERE session_key = %s"
                         " ORDER BY seq").format(sql.Identifier(schema))
    turn = [msg, Message("assistant", "", (ToolCall("c1", "lookup", {"q": "north"}),),
                         usage=Usage(120, 30, 0.0004)),
            Message("tool", '{"revenue": 4}', tool_call_id="c1"),
            Message("assistant", ANSWER, usage=Usage(180, 25, 0.0005))]
    for size, shape in ((10, "user"), (1000, "user"), (10000, "user"), (10000, "mixed")):
        sid = f"load-{size}-{shape}"
        store.sessions.save(sid, [msg] * size if shape == "user" else (turn * size)[:size])
        key = store.sessions.revision(sid)[0]  # type: ignore[index]

        def bare_select(key: int = key) -> None:
            bare.execute(select_sql, (key,)).fetchall()
            bare.commit()

        runs = 40 if size == 10000 else 200
        lo, bs = _paired_ms(lambda sid=sid: store.sessions.load(sid),  # type: ignore[misc]
                            bare_select, runs)
        print(f"load {size} ({shape} messages): {lo:.3f} ms, bare SELECT: {bs:.3f} ms,"
              f" ratio {lo / bs:.2f}")
    bare.close()
    store.close()


def worker(url: str, schema: str, sessions: int, index: int, processes: int,
           seconds: float) -> None:
    """One process of the turns benchmark: READY, wait for a line, run turns for
    ``seconds``, print ``{"turns": n}``."""
    store = PostgresStore(url, schema=schema, max_size=2)
    agent = create_agent(provider=ScriptedProvider(default=ANSWER), store=store)
    ids = [f"t{k}" for k in range(sessions)]
    start = index * sessions // processes
    order = ids[start:] + ids[:start]
    live = [agent.session(id=sid) for sid in order]
    for session in live:
        session.pending()  # loads what is stored now: not timed
    print("READY", flush=True)
    sys.stdin.readline()
    done, k = 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        live[k % len(live)].send(f"question {index}-{k}")
        done += 1
        k += 1
    print(json.dumps({"turns": done}), flush=True)
    store.close()


def turns_per_second(url: str, schema: str, sessions: int, processes: int,
                     seconds: float) -> tuple[float, int, float]:
    """(turns/s, committed turns, wall seconds) for ``sessions`` sessions."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--worker", url, schema, str(sessions), str(i),
         str(processes), str(seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        for i in range(processes)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "READY"
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    reported = 0
    for p in procs:
        assert p.stdout is not None
        reported += json.loads(p.stdout.readline())["turns"]
    wall = time.perf_counter() - t0
    for p in procs:
        p.wait(60)
        assert p.returncode == 0, f"a worker exited {p.returncode}"
    with psycopg.connect(url, autocommit=True) as raw:
        row = raw.execute(sql.SQL("SELECT coalesce(sum(length), 0) FROM {}.sessions").format(
            sql.Identifier(schema))).fetchone()
    committed = int(row[0]) // 2 if row else 0
    assert committed == reported, (committed, reported)
    return committed / wall, committed, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=None, help="default: $LOUSHO_TEST_POSTGRES_URL")
    parser.add_argument("--seconds", type=float, default=5.0, help="per turns measurement")
    parser.add_argument("--processes", type=int, default=4)
    args = parser.parse_args(argv)
    url = args.url or os.environ.get("LOUSHO_TEST_POSTGRES_URL")
    if not url:
        print("skipped: no PostgreSQL server (pass --url or set LOUSHO_TEST_POSTGRES_URL)")
        return 0
    base = f"lousho_bench_{uuid.uuid4().hex[:8]}"
    schemas = [base, f"{base}_bare", f"{base}_one"] + [f"{base}_t{n}" for n in SESSIONS]
    try:
        latency(url, base)
        for n in SESSIONS:
            rate, committed, wall = turns_per_second(url, f"{base}_t{n}", n, args.processes,
                                                     args.seconds)
            print(f"turns/s, {n} session(s) across {args.processes} processes: {rate:.0f} "
                  f"({committed} committed turns in {wall:.2f} s)")
        rate, committed, wall = turns_per_second(url, f"{base}_one", 100, 1, args.seconds)
        print(f"turns/s, 100 sessions in 1 process (reference): {rate:.0f} ({committed} "
              f"committed turns in {wall:.2f} s; {os.cpu_count()} CPUs here, the server "
              "included)")
    finally:
        _drop(url, *schemas)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        url, schema, n, i, procs, secs = sys.argv[2:8]
        worker(url, schema, int(n), int(i), int(procs), float(secs))
    else:
        sys.exit(main())
