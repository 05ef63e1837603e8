"""The session mailbox's cost: a plain turn with and without it, and how long input from
another connection takes to reach the running turn.

    python benchmarks/bench_mailbox.py [--turns N] [--rounds N] [--redis URL] [--postgres URL]

1. A plain ``send()`` on ``SqliteStore`` (scripted model, no tool) with the mailbox (the
   owner registers its turn with the mailbox watcher) and without it (``mail_ops_of``
   answering None, as before the mailbox), interleaved in blocks, median µs per turn and
   the ratio (goal: at most 1.05).
2. The delay from B's ``send()`` (``turn_policy="queue"``, its own store object on the same
   store: its own connection and lease owner, as another process has) to ``input.applied``
   in A's running turn (A is in a tool that returns once input is offered), p50 and p90
   over ``--rounds``, on SQLite and files (polled every 5 ms) and Redis, PostgreSQL (woken
   by ``XREAD BLOCK``, ``NOTIFY``) when their URL is given.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import lousho_sync._session_parts as parts_mod
from lousho_sync import ModelRequest, ScriptedProvider, Step, create_agent, tool
from lousho_sync.sqlite import SqliteStore


def plain(turns: int, blocks: int = 40) -> tuple[float, float, float]:
    """Median µs per turn with and without the mailbox, and the median of the ratios of
    neighbouring blocks (on a loaded host the load drifts more than the cost measured)."""
    root = Path(tempfile.mkdtemp())
    agent = create_agent(provider=ScriptedProvider(default="ok"),
                         store=SqliteStore(root / "a.db"))
    real = parts_mod.mail_ops_of
    on: list[float] = []
    off: list[float] = []
    ratios: list[float] = []
    for block in range(blocks):
        medians: dict[str, float] = {}
        for mode in ("on", "off") if block % 2 else ("off", "on"):
            parts_mod.mail_ops_of = real if mode == "on" else (lambda _s: None)
            s = agent.session(id=f"s-{block}-{mode}")
            s.send("warm")
            times: list[float] = []
            for _ in range(turns // blocks):
                t = time.perf_counter()
                s.send("hello there")
                times.append(time.perf_counter() - t)
            (on if mode == "on" else off).extend(times)
            medians[mode] = statistics.median(times)
        ratios.append(medians["on"] / medians["off"])
    parts_mod.mail_ops_of = real
    return statistics.median(on) * 1e6, statistics.median(off) * 1e6, statistics.median(ratios)


def _store(kind: str, root: Path, url: str | None) -> Any:
    if kind == "sqlite":
        return SqliteStore(root / "a.db")
    if kind == "files":
        from lousho_sync.stores.files import FileSessionStore

        return FileSessionStore(root)
    if kind == "redis":
        from lousho_sync.redis import RedisStore

        return RedisStore(str(url), prefix=f"bench-mail:{root.name}:")
    from lousho_sync.postgres import PostgresStore

    return PostgresStore(str(url), schema=f"bench_mail_{root.name[-8:].lower()}")


def delay(rounds: int, kind: str = "sqlite", url: str | None = None) -> list[float]:
    root = Path(tempfile.mkdtemp())
    holder: dict[str, Any] = {}

    @tool
    def hold() -> str:
        """Wait for input."""
        control = holder["a"]._state.current.control
        control.offered.wait(30)
        return "held"

    def answer(request: ModelRequest) -> Step | str:
        last = list(request.messages)[-1]
        return Step(tool_calls=[("hold", {})]) if last.text.startswith("A") else "ok"

    a_agent = create_agent(provider=ScriptedProvider(default=answer), tools=[hold],
                           store=_store(kind, root, url))
    b_agent = create_agent(provider=ScriptedProvider(default="ok"),
                           store=_store(kind, root, url))
    out: list[float] = []
    for i in range(rounds):
        a = holder["a"] = a_agent.session(id=f"d{i}")
        b = b_agent.session(id=f"d{i}", turn_policy="queue")
        in_tool = threading.Event()
        applied: list[float] = []

        def run_a(a: Any = a, in_tool: threading.Event = in_tool,
                  applied: list[float] = applied) -> None:
            run = a.stream("A")
            for e in run:
                if e.type == "tool.call":
                    in_tool.set()
                if e.type == "input.applied":
                    applied.append(time.perf_counter())
            holder["ra"] = run.result()

        ta = threading.Thread(target=run_a)
        ta.start()
        in_tool.wait(30)
        t0 = time.perf_counter()
        r = b.send("B")
        ta.join()
        assert r.joined and applied, (holder.get("ra"), r)
        out.append(applied[0] - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--redis")
    ap.add_argument("--postgres")
    args = ap.parse_args()
    on, off, ratio = plain(args.turns)
    print(f"plain turn, SqliteStore: with mailbox {on:.0f} µs, without {off:.0f} µs, "
          f"ratio {ratio:.3f} (median of neighbouring blocks)")
    stores = [("sqlite", None), ("files", None), ("redis", args.redis),
              ("postgres", args.postgres)]
    for kind, url in stores:
        if kind in ("redis", "postgres") and not url:
            continue
        d = sorted(delay(args.rounds, kind, url))
        p50, p90 = statistics.median(d) * 1e3, d[int(len(d) * 0.9)] * 1e3
        print(f"B send() -> input.applied in A's turn, {kind}: p50 {p50:.1f} ms, "
              f"p90 {p90:.1f} ms")


if __name__ == "__main__":
    main()
