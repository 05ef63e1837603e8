"""Detached turns and the event log (issue 29).

    python benchmarks/bench_events.py [--events 200] [--readers 100]

* **latency, produced → reader in another process**, p50 and p99 per store: a detached turn
  whose model stamps each text delta with the wall clock, read by ``attach()`` in a child
  process (memory: a reader thread of the same process, the only kind of reader it has);
  once with each event written at once (``event_interval_s=0``) and once with the default
  coalescing (50 ms), where Redis and PostgreSQL readers, which watch the turn, get the
  deltas that wait for their write from the live tail (``event_live_interval_s``);
* **store writes** of a streamed 1,000-delta turn on SQLite (model at full speed, and paced
  1 ms a delta), default coalescing;
* **framework time** of a ``start()``-ed turn read to its end against ``stream()`` of the
  same turn (1,000 deltas, scripted model, no delay; every store; 40 of each, the two
  interleaved; the ratio of the medians, the median of each pair's ratio — a pair's two
  runs are next to each other in time, so a host whose speed drifts slows both alike —
  and the ratio of the minimums); with a new store each run, then with one store for all
  runs;
* **100 readers** of one turn in one process (attached threads, memory and SQLite).

Redis: ``LOUSHO_TEST_REDIS_URL`` or a ``redis-server`` of its own; PostgreSQL:
``LOUSHO_TEST_POSTGRES_URL`` (skipped without one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lousho_sync import (  # noqa: E402
    Message,
    ModelDone,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ScriptedProvider,
    Signal,
    Step,
    create_agent,
    memory_store,
)
from lousho_sync.stores._events import event_ops_of  # noqa: E402


class Clock:
    """Streams ``n`` deltas, each its wall-clock time, ``pace_s`` apart, after ``gate``."""

    model = "clock"

    def __init__(self, n: int, pace_s: float, gate: threading.Event) -> None:
        self.n, self.pace_s, self.gate = n, pace_s, gate

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        self.gate.wait()
        for _ in range(self.n):
            signal.wait(self.pace_s)
            yield ModelTextDelta(f"{time.time():.6f};")
        yield ModelDone(ModelResponse(Message("assistant", "done"), "stop", self.model))

    def complete(self, request: ModelRequest, *, signal: Signal) -> ModelResponse:
        return ModelResponse(Message("assistant", "done"), "stop", self.model)


def make(kind: str, where: str) -> Any:
    if kind == "memory":
        return memory_store()
    if kind == "sqlite":
        from lousho_sync.sqlite import SqliteStore
        return SqliteStore(Path(where) / "bench.db")
    if kind == "files":
        from lousho_sync import AgentStore
        from lousho_sync.stores.files import (
            FileSessionStore,
            FileStorage,
            LocalStorageCheckpointStore,
        )
        return AgentStore(sessions=FileSessionStore(Path(where) / "sessions"),
                          checkpoints=LocalStorageCheckpointStore(FileStorage(
                              Path(where) / "state")))
    if kind == "redis":
        from lousho_sync.redis import RedisStore
        url, prefix = where.split("|")
        return RedisStore(url, prefix=prefix)
    from lousho_sync.postgres import PostgresStore
    url, schema = where.split("|")
    return PostgresStore(url, schema=schema)


def read_stamps(events: Any) -> list[float]:
    """The lag (ms) of each stamped delta when read."""
    lags = []
    for event in events:
        if event.type == "text.delta":
            arrived = time.time()
            lags += [(arrived - float(s)) * 1000 for s in event.text.split(";") if s]
    return lags


def reader_main(kind: str, where: str, turn: str) -> None:
    session = create_agent(provider=ScriptedProvider(default="x"),
                           store=make(kind, where)).session(id="bench")
    run = session.attach(turn, after=-1, takeover=False)
    print("READY", flush=True)
    print(json.dumps(read_stamps(run)), flush=True)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def latency(kind: str, where: str, n: int, interval: float) -> tuple[float, float]:
    gate = threading.Event()
    agent = create_agent(provider=Clock(n, 0.005, gate), store=make(kind, where))
    session = agent.session(id="bench")
    session.event_interval_s = interval
    run = session.start("go")
    if kind == "memory":
        lags: list[float] = []
        reader = threading.Thread(
            target=lambda: lags.extend(read_stamps(session.attach(run.turn_id))))
        reader.start()
        gate.set()
        reader.join()
    else:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--reader", kind, where, run.turn_id],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        gate.set()
        lags = json.loads(proc.stdout.readline())
        proc.wait()
    run.result()
    return pct(lags, 0.5), pct(lags, 0.99)


def writes(kind: str, where: str, pace_s: float) -> tuple[int, int]:
    store = make(kind, where)
    ops = event_ops_of(store.sessions if hasattr(store, "sessions") else store)
    count = [0]
    append = ops.append

    def counting(*a: Any, **kw: Any) -> None:
        count[0] += 1
        append(*a, **kw)

    ops.append = counting  # type: ignore[method-assign]
    gate = threading.Event()
    gate.set()
    agent = create_agent(provider=Clock(1000, pace_s, gate), store=store)
    run = agent.session(id=f"w{uuid.uuid4().hex[:6]}").start("go")
    events = sum(1 for _ in run)
    return count[0], events


PAIRS = 40
"""Runs of each in the framework rows, a ``stream()`` and a ``start()`` side by side."""


def framework(kind: str, where: str, *, warm: bool = False) -> tuple[list[float], list[float]]:
    """Times (ms) of ``stream()`` and of a ``start()``-ed turn read to its end, interleaved;
    a new store each run (its connections and set-up in the time), or ``warm``: one store
    for every run (a long-lived application's)."""
    kept: list[Any] = []

    def once(detached: bool) -> float:
        store = kept[0] if kept else make(kind, where)
        if warm and not kept:
            kept.append(store)
        agent = create_agent(provider=ScriptedProvider([Step(chunks=["x"] * 1000)]),
                             store=store)
        session = agent.session(id=f"f{uuid.uuid4().hex[:6]}")
        t = time.perf_counter()
        run = session.start("go") if detached else session.stream("go")
        for _ in run:
            pass
        elapsed = time.perf_counter() - t
        run.result()
        close = getattr(store, "close", None)
        if close is not None and not warm:
            close()  # (PostgreSQL: a store's pool and listener are connections)
        return elapsed * 1000

    once(False), once(True)  # warm up
    streams, starts = [], []
    for _ in range(PAIRS):  # interleaved: a loaded host slows both alike
        streams.append(once(False))
        starts.append(once(True))
    close = getattr(kept[0], "close", None) if kept else None
    if close is not None:
        close()
    return streams, starts


def many_readers(kind: str, where: str, readers: int) -> tuple[float, bool]:
    gate = threading.Event()
    agent = create_agent(provider=Clock(1000, 0.001, gate), store=make(kind, where))
    session = agent.session(id=f"r{uuid.uuid4().hex[:6]}")
    run = session.start("go")
    got: list[list[tuple[str, int]]] = []
    lock = threading.Lock()

    def read() -> None:
        seen = [(e.type, e.seq) for e in session.attach(run.turn_id)]
        with lock:
            got.append(seen)

    threads = [threading.Thread(target=read) for _ in range(readers)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    gate.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return elapsed * 1000, all(g == got[0] for g in got) and len(got) == readers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--readers", type=int, default=100)
    parser.add_argument("--reader", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        reader_main(*args.reader)
        return
    from bench_redis import redis_server

    with tempfile.TemporaryDirectory() as tmp, redis_server(None) as redis_url:
        kinds = {"memory": "", "sqlite": tmp, "files": tmp,
                 "redis": f"{redis_url}|lousho-bench-events:{uuid.uuid4().hex[:8]}:"}
        pg = os.environ.get("LOUSHO_TEST_POSTGRES_URL")
        if pg:
            kinds["postgres"] = f"{pg}|bench_events_{uuid.uuid4().hex[:8]}"
        print("latency produced -> reader (another process; memory: another thread), ms")
        for kind, where in kinds.items():
            for interval in (0.0, 0.05):
                p50, p99 = latency(kind, where, args.events, interval)
                print(f"  {kind:8} interval {interval * 1000:>3.0f} ms: p50 {p50:7.2f}  "
                      f"p99 {p99:7.2f}")
        for pace in (0.0, 0.001):
            n, events = writes("sqlite", tmp, pace)
            print(f"store writes, 1,000-delta turn on SQLite, model {pace * 1000:g} ms a "
                  f"delta: {n} writes for {events} events")
        for warm in (False, True):
            for kind in kinds:
                streams, starts = framework(kind, kinds[kind], warm=warm)
                stream, started = statistics.median(streams), statistics.median(starts)
                pairs = statistics.median(b / a for a, b in zip(streams, starts, strict=True))
                print(f"framework time, 1,000 deltas, {kind}"
                      f"{' (one store for all runs)' if warm else ''}: stream() {stream:.1f} "
                      f"ms, start() {started:.1f} ms, median {started / stream:.2f}x, "
                      f"median of pairs {pairs:.2f}x, min {min(starts) / min(streams):.2f}x")
        for kind in ("memory", "sqlite"):
            ms, same = many_readers(kind, kinds[kind], args.readers)
            print(f"{args.readers} readers of one 1,000-delta turn, {kind}: {ms:.0f} ms, "
                  f"identical: {same}")


if __name__ == "__main__":
    main()
