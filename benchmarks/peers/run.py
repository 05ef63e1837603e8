"""Side-by-side: lousho, OpenAI Agents SDK, Pydantic AI and LangGraph in one process.

    python -m benchmarks.peers [--turns 200] [--conversations 3] [--tool-reps 50] [--quick]

Workload, the same on every framework, each on a canned model that answers at once:

- a conversation of ``--turns`` turns without tools; µs per turn early (median of turns
  1-10 over all conversations) and late (turns ``turns-9``..``turns``);
- one tool round trip (user -> tool call -> tool result -> answer) at the start of a new
  conversation, repeated ``--tool-reps`` times; median µs;

each with the history in memory and in a SQLite file (WAL, synchronous=FULL everywhere).
Then, on a fresh backend: peak traced memory of one whole conversation (``tracemalloc``:
Python allocations only, not SQLite's own page cache) and, on SQLite, the file size (db +
-wal while open, and the db alone after the last connection closed and a
``wal_checkpoint(TRUNCATE)``) next to the history's JSON in the framework's own format.
The frameworks' async APIs are awaited inside one event loop, so no per-turn loop set-up is
counted. One framework runs at a time, on a freshly opened and warmed-up backend, with
only its own objects alive (another framework's heap would slow its garbage collector); the
order rotates from one conversation (or block of 10 tool turns) to the next, so noise from
elsewhere on the machine is spread over all of them. Ratios are lousho / peer: below 1
means lousho is cheaper.
"lousho normal" is lousho's SqliteStore at synchronous="normal" (no fsync per commit),
shown for reference.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import cast

from .common import (
    ANSWER,
    TOOL_NAME,
    TOOL_RUNS,
    Backend,
    Chat,
    PeerModule,
    Storage,
    user_text,
)

PEERS = (
    "peer_lousho",
    "peer_lousho_normal",
    "peer_openai_agents",
    "peer_pydantic_ai",
    "peer_langgraph",
)
STORAGES: tuple[Storage, ...] = ("memory", "sqlite")
WINDOW = 10
WARM_TURNS = 20
TOOL_BLOCK = 10


@dataclass
class Figures:
    """One framework on one storage."""

    early_us: float = 0.0
    late_us: float = 0.0
    tool_us: float = 0.0
    peak_kib: float = 0.0
    file_open_bytes: int = 0
    file_bytes: int = 0
    largest_btree: tuple[str, int] = ("", 0)
    json_bytes: int = 0


@dataclass
class PeerResult:
    """A framework's figures per storage, or why there are none."""

    name: str
    version: str = ""
    status: str = "ok"
    figures: dict[str, Figures] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    """Sizes of the workload."""

    turns: int
    conversations: int
    tool_reps: int
    directory: Path


def _median_us(samples: Sequence[int]) -> float:
    return statistics.median(samples) / 1000


async def _turn(chat: Chat, turn: int) -> int:
    text = user_text(turn)
    start = time.perf_counter_ns()
    answer = await chat.send(text)
    elapsed = time.perf_counter_ns() - start
    if answer != ANSWER:
        raise RuntimeError(f"turn {turn} answered {answer[:60]!r}, not the canned answer")
    return elapsed


async def _conversation(chat: Chat, turns: int) -> None:
    for turn in range(1, turns + 1):
        await _turn(chat, turn)


async def _tool_turn(backend: Backend, session_id: str) -> int:
    chat = backend.chat(session_id, tools=True)
    before = TOOL_RUNS[TOOL_NAME]
    try:
        elapsed = await _turn(chat, 1)
    finally:
        chat.close()
    if TOOL_RUNS[TOOL_NAME] != before + 1:
        raise RuntimeError("the tool turn did not run the tool exactly once")
    return elapsed


def _sizes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def _compact_size(path: Path) -> tuple[int, tuple[str, int]]:
    """The db's size after a checkpoint, and its largest b-tree (name, bytes) if the
    SQLite build has the ``dbstat`` table."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        try:
            row = conn.execute(
                "SELECT name, SUM(pgsize) AS n FROM dbstat GROUP BY name ORDER BY n DESC LIMIT 1"
            ).fetchone()
        except sqlite3.OperationalError:
            row = None
    finally:
        conn.close()
    return _sizes(path), (str(row[0]), int(row[1])) if row else ("", 0)


@dataclass
class _Samples:
    """The timings of one framework on one storage."""

    mod: PeerModule
    result: PeerResult
    early: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    tools: list[int] = field(default_factory=list)
    opened: int = 0


def _fail(result: PeerResult, storage: Storage, exc: BaseException) -> None:
    result.status = f"failed on {storage}: {type(exc).__name__}: {exc}"
    result.figures.pop(storage, None)


def _rotated(items: list[_Samples], k: int) -> list[_Samples]:
    k %= max(1, len(items))
    return items[k:] + items[:k]


async def _open(p: _Samples, storage: Storage, cfg: Config) -> Backend:
    """A fresh backend (same file as before on SQLite), warmed up, its garbage collected."""
    p.opened += 1
    backend = p.mod.open_backend(storage, cfg.directory / f"{p.mod.NAME}-timed.db")
    warm = backend.chat(f"warm-{p.opened}", tools=False)
    await _conversation(warm, WARM_TURNS)
    warm.close()
    for i in range(3):
        await _tool_turn(backend, f"warm-{p.opened}-tool-{i}")
    gc.collect()
    return backend


async def _conversation_job(p: _Samples, storage: Storage, cfg: Config, c: int) -> None:
    backend = await _open(p, storage, cfg)
    try:
        chat = backend.chat(f"conv-{c}", tools=False)
        for turn in range(1, cfg.turns + 1):
            elapsed = await _turn(chat, turn)
            if turn <= WINDOW:
                p.early.append(elapsed)
            elif turn > cfg.turns - WINDOW:
                p.late.append(elapsed)
        chat.close()
    finally:
        backend.close()


async def _tool_job(p: _Samples, storage: Storage, cfg: Config, block: int, reps: int) -> None:
    backend = await _open(p, storage, cfg)
    try:
        for i in range(reps):
            p.tools.append(await _tool_turn(backend, f"tool-{block}-{i}"))
    finally:
        backend.close()


async def _timed(entries: list[tuple[PeerModule, PeerResult]], storage: Storage,
                 cfg: Config) -> None:
    """Median µs early, late and of a tool turn. One framework runs at a time, on a fresh
    backend, so no other framework's objects weigh on its garbage collector; the order
    rotates job by job (a conversation, or a block of TOOL_BLOCK tool turns), so noise from
    elsewhere on the machine is spread over all of them."""
    live = [_Samples(mod, result) for mod, result in entries]
    jobs: list[tuple[int, Callable[[_Samples], Awaitable[None]]]] = [
        (c, partial(_conversation_job, storage=storage, cfg=cfg, c=c))
        for c in range(cfg.conversations)
    ]
    for b, first in enumerate(range(0, cfg.tool_reps, TOOL_BLOCK)):
        reps = min(TOOL_BLOCK, cfg.tool_reps - first)
        jobs.append((b, partial(_tool_job, storage=storage, cfg=cfg, block=b, reps=reps)))
    for k, job in jobs:
        for p in _rotated(live, k):
            try:
                await job(p)
            except Exception as exc:  # reported; the others still run
                _fail(p.result, storage, exc)
                live.remove(p)
    for p in live:
        fig = p.result.figures.setdefault(storage, Figures())
        fig.early_us, fig.late_us, fig.tool_us = map(_median_us, (p.early, p.late, p.tools))


async def _footprint(mod: PeerModule, storage: Storage, cfg: Config, fig: Figures) -> None:
    """Peak traced memory of one conversation on a fresh backend; file and JSON sizes."""
    path = cfg.directory / f"{mod.NAME}-size.db"
    backend = mod.open_backend(storage, path)
    try:
        gc.collect()
        tracemalloc.start()
        try:
            chat = backend.chat("size", tools=False)
            await _conversation(chat, cfg.turns)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        fig.peak_kib = peak / 1024
        fig.json_bytes = await chat.json_size()
        if storage == "sqlite":
            fig.file_open_bytes = _sizes(path)
        chat.close()
    finally:
        backend.close()
    if storage == "sqlite":
        fig.file_bytes, fig.largest_btree = _compact_size(path)


def _load(module_name: str) -> tuple[PeerModule | None, PeerResult]:
    try:
        mod = cast(PeerModule, importlib.import_module(f"{__package__}.{module_name}"))
    except ImportError as exc:
        name = module_name.removeprefix("peer_").replace("_", "-")
        return None, PeerResult(name, status=f"not installed ({exc.name or exc})")
    result = PeerResult(mod.NAME)
    try:
        result.version = metadata.version(mod.DISTRIBUTION)
    except metadata.PackageNotFoundError:
        result.version = "?"
    return mod, result


async def measure(module_names: Sequence[str], cfg: Config) -> list[PeerResult]:
    """Every framework's figures; 'not installed' or 'failed: ...' instead of raising."""
    loaded = [_load(name) for name in module_names]
    results = [result for _, result in loaded]
    entries = [(mod, result) for mod, result in loaded if mod is not None]
    for storage in STORAGES:
        taking_part = [
            (mod, result) for mod, result in entries
            if storage in getattr(mod, "STORAGES", STORAGES) and result.status == "ok"
        ]
        await _timed(taking_part, storage, cfg)
        for mod, result in taking_part:
            fig = result.figures.get(storage)
            if fig is None:
                continue
            try:
                await _footprint(mod, storage, cfg, fig)
            except Exception as exc:
                _fail(result, storage, exc)
    return results


def _ratio(ours: float, theirs: float) -> str:
    if not theirs:
        return "-"
    r = ours / theirs
    if r >= 1:
        return f"{r:.2f}"
    return f"{r:.3f} (1/{1 / r:.0f})" if r < 0.1 else f"{r:.2f} (1/{1 / r:.1f})"


def report(results: list[PeerResult], cfg: Config) -> None:
    """Print the tables and the goal check."""
    print(
        f"{cfg.turns}-turn conversations x{cfg.conversations}, tool turn x{cfg.tool_reps}; "
        f"early = turns 1-{WINDOW}, late = turns {cfg.turns - WINDOW + 1}-{cfg.turns}; "
        "µs are medians per turn\n"
    )
    ok = [r for r in results if r.status == "ok" or r.figures]
    for r in results:
        if r.status != "ok":
            print(f"  {r.name}: {r.status}")
    for storage in STORAGES:
        rows = [r for r in ok if storage in r.figures]
        print(f"\n== history {'in memory' if storage == 'memory' else 'in a SQLite file'} ==")
        head = f"{'framework':<15}{'version':>9}{'early µs':>11}{'late µs':>11}{'late/early':>11}"
        head += f"{'tool µs':>11}{'peak KiB':>10}"
        if storage == "sqlite":
            head += f"{'db+wal KiB':>12}{'db KiB':>9}{'JSON KiB':>10}{'db/JSON':>9}"
        print(head)
        for r in rows:
            f = r.figures[storage]
            line = (
                f"{r.name:<15}{r.version:>9}{f.early_us:>11.0f}{f.late_us:>11.0f}"
                f"{f.late_us / f.early_us:>11.2f}{f.tool_us:>11.0f}{f.peak_kib:>10.0f}"
            )
            if storage == "sqlite":
                line += (
                    f"{f.file_open_bytes / 1024:>12.0f}{f.file_bytes / 1024:>9.0f}"
                    f"{f.json_bytes / 1024:>10.0f}{f.file_bytes / f.json_bytes:>9.2f}"
                )
            print(line)
        ours = next((r.figures[storage] for r in rows if r.name == "lousho"), None)
        peers = [r for r in rows if not r.name.startswith("lousho")]
        if ours is None or not peers:
            continue
        print(f"\nlousho / peer ({storage}){'early':>14}{'late':>16}{'tool':>16}{'peak mem':>16}")
        for r in peers:
            f = r.figures[storage]
            print(
                f"  {r.name:<22}{_ratio(ours.early_us, f.early_us):>16}"
                f"{_ratio(ours.late_us, f.late_us):>16}{_ratio(ours.tool_us, f.tool_us):>16}"
                f"{_ratio(ours.peak_kib, f.peak_kib):>16}"
            )
    _goals(ok)


def _goals(results: list[PeerResult]) -> None:
    lousho = next((r for r in results if r.name == "lousho"), None)
    peers = [r for r in results if not r.name.startswith("lousho")]
    if lousho is None or not peers:
        return
    print("\n== goal: lousho per turn <= 1/10 of the fastest peer, flat, file <= 1.5x JSON ==")
    for storage, ours in lousho.figures.items():
        theirs = [p.figures[storage] for p in peers if storage in p.figures]
        if not theirs:
            continue
        for label, attr in (("early", "early_us"), ("late", "late_us")):
            mine: float = getattr(ours, attr)
            best = min(getattr(f, attr) for f in theirs)
            verdict = "met" if mine * 10 <= best else "missed"
            print(
                f"  {storage:<7}{label:<6} lousho {mine:8.0f} µs, fastest peer {best:8.0f} µs: "
                f"1/{best / mine:.1f} ({verdict})"
            )
        print(f"  {storage:<7}flat   lousho late/early {ours.late_us / ours.early_us:.2f}")
    if "sqlite" in lousho.figures:
        f = lousho.figures["sqlite"]
        ratio = f.file_bytes / f.json_bytes
        verdict = "met" if ratio <= 1.5 else "missed"
        print(
            f"  sqlite file after the conversation: {f.file_bytes:,} B "
            f"(db+wal while open {f.file_open_bytes:,} B), raw JSON {f.json_bytes:,} B: "
            f"{ratio:.2f}x ({verdict})"
        )
        name, size = f.largest_btree
        if size:
            print(
                f"  (of the file, {size:,} B are the largest b-tree, {name!r}: "
                f"{size / f.json_bytes:.2f}x the JSON; the rest is the other tables and indexes)"
            )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the peers benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--conversations", type=int, default=None, help="default 3")
    parser.add_argument("--tool-reps", type=int, default=None, help="default 50")
    parser.add_argument(
        "--quick", action="store_true", help="defaults of 1 conversation and 20 tool turns"
    )
    parser.add_argument("--only", nargs="*", default=None, help="peer names, e.g. lousho")
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite files go")
    args = parser.parse_args(argv)
    if args.turns < 2 * WINDOW:
        parser.error(f"--turns must be at least {2 * WINDOW}")
    os.environ.setdefault("OPENAI_API_KEY", "dummy")  # never used: every model is canned
    names = [
        n for n in PEERS
        if not args.only or n.removeprefix("peer_").replace("_", "-") in args.only
        or n.removeprefix("peer_") in args.only
    ]
    directory = Path(tempfile.mkdtemp(prefix="lousho-peers-", dir=args.dir))
    cfg = Config(
        turns=args.turns,
        conversations=args.conversations or (1 if args.quick else 3),
        tool_reps=args.tool_reps or (20 if args.quick else 50),
        directory=directory,
    )
    try:
        results = asyncio.run(measure(names, cfg))
        report(results, cfg)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
