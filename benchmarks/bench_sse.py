"""Server-sent events: how many frames per second ``lousho_sync.sse`` sustains for one turn
and for 100 concurrent readers in one process.

    python benchmarks/bench_sse.py [--deltas 5000] [--readers 100]

A turn of ``--deltas`` text deltas (scripted model, no delay) is framed:

* ``frames/s, framing only``: ``sse_frames`` over the turn's recorded events (JSON encoding
  and framing, no heartbeat thread), one reader;
* ``frames/s, framing + heartbeat pump``: the same with ``heartbeat_s=15`` (the source read in
  a pump thread, as a view does);
* ``frames/s, sse_stream, 1 reader``: when the session has ``start``/``attach`` (detached
  turns), a turn on a SQLite store read back with ``sse_stream`` after it ended (the event
  log read, JSON, framing);
* ``frames/s, N readers``: N threads each reading the same turn at once (sum over readers).

The logged turn's frame count is printed (the retry hint counts as one frame).

Each figure is the median of 3 runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lousho_sync import ScriptedProvider, Session, Step, create_agent  # noqa: E402
from lousho_sync.events import RunEvent  # noqa: E402
from lousho_sync.sse import sse_frames, sse_stream  # noqa: E402


def _script(deltas: int) -> list[Step]:
    return [Step(text="x" * deltas, chunks=[f"w{i} " for i in range(deltas)])]


def recorded_turn(deltas: int) -> list[RunEvent]:
    run = create_agent(provider=ScriptedProvider(_script(deltas))).session("bench").stream("go")
    return list(run)


def _rate(read: Callable[[], int]) -> float:
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        n = read()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def _concurrent(read: Callable[[], int], readers: int) -> float:
    def once() -> int:
        counts = [0] * readers
        barrier = threading.Barrier(readers)

        def reader(i: int) -> None:
            barrier.wait()
            counts[i] = read()

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts)

    return _rate(once)


def _count(frames: Iterable[str]) -> int:
    return sum(1 for _ in frames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deltas", type=int, default=5000)
    parser.add_argument("--readers", type=int, default=100)
    args = parser.parse_args()
    events = recorded_turn(args.deltas)
    print(f"one turn: {len(events)} events ({args.deltas} text deltas)")
    plain = _rate(lambda: _count(sse_frames(events, heartbeat_s=None)))
    print(f"frames/s, framing only, 1 reader:            {plain:>10,.0f}")
    pumped = _rate(lambda: _count(sse_frames(events, heartbeat_s=15.0)))
    print(f"frames/s, framing + heartbeat pump, 1 reader: {pumped:>9,.0f}")
    many = _concurrent(lambda: _count(sse_frames(events, heartbeat_s=15.0)), args.readers)
    print(f"frames/s, framing + pump, {args.readers} readers (sum): {many:>9,.0f}")
    if not hasattr(Session, "attach"):
        print("sse_stream over session.attach(): skipped (this tree has no detached turns)")
        return
    from lousho_sync.sqlite import SqliteStore

    with tempfile.TemporaryDirectory() as tmp, SqliteStore(Path(tmp) / "b.db") as store:
        agent = create_agent(provider=ScriptedProvider(_script(args.deltas)), store=store)
        session = agent.session("bench")
        started = session.start("go")
        turn_id = started.turn_id
        started.result()
        per_read = _count(sse_stream(session, turn_id=turn_id))
        print(f"the logged turn reads as {per_read} frames")
        one = _rate(lambda: _count(sse_stream(session, turn_id=turn_id)))
        print(f"frames/s, sse_stream (SQLite log), 1 reader: {one:>10,.0f}")
        many = _concurrent(lambda: _count(sse_stream(session, turn_id=turn_id)), args.readers)
        print(f"frames/s, sse_stream, {args.readers} readers (sum):  {many:>10,.0f}")


if __name__ == "__main__":
    main()
