"""The kill storm: several worker processes send turns on shared sessions while a killer
SIGKILLs a random one every 0.05-0.5 s and restarts it (a restarted worker resumes first).
Afterwards every session is resumed here and checked: every turn whose ``send()`` returned
is stored exactly once, no call id is stored twice, the ``report`` tool ran at most once per
call id, no tool call lacks its result, no turn whose tools ran is lost, every session loads.

The kills per store come from ``LOUSHO_STRESS`` (``tests/_stress.py``: 10 by default, so that
the whole suite stays a few minutes; 50 in CI's storm step; 300 with ``long``, the run before
a release or after touching commits, leases or checkpoints:
``LOUSHO_STRESS=long pytest tests/test_storm.py``; the timeout grows with it);
``LOUSHO_STORM_KILLS`` sets them alone. ``LOUSHO_STORM_SEED`` replays a run (the seed is
printed).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _stress import STORM_KILLS
from storm_worker import SESSIONS, Log, make_agent

HERE = Path(__file__).resolve().parent
KILLS = STORM_KILLS
WORKERS = 4
LEASE_TTL_S = 5.0

pytestmark = pytest.mark.stress


def _location(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return f"{url}|lousho-storm:{uuid.uuid4().hex[:12]}:"
    if kind == "postgres":  # the test's own schema, dropped afterwards
        url, schema = (request.getfixturevalue(n) for n in ("postgres_url", "postgres_schema"))
        return f"{url}|{schema}"
    return str(tmp_path / "store")


def _spawn(
    kind: str, location: str, worker: int, seed: int, logs: Path
) -> subprocess.Popen[bytes]:
    err = open(logs / f"stderr-{worker}-{time.monotonic_ns()}.txt", "wb")  # noqa: SIM115
    try:
        return subprocess.Popen(
            [sys.executable, str(HERE / "storm_worker.py"), kind, location, str(worker),
             str(seed), str(LEASE_TTL_S)],
            stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "LOUSHO_STORM_LOGS": str(logs)},
        )
    finally:
        err.close()


def _storm(kind: str, location: str, logs: Path, seed: int) -> list[str]:
    """Run the storm; returns the anomalies seen while it ran (workers that died alone)."""
    rng = random.Random(seed)
    procs = [_spawn(kind, location, w, seed, logs) for w in range(WORKERS)]
    anomalies: list[str] = []
    try:
        _await_first_send(logs, procs)
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.05, 0.5))  # the storm's pace, not a synchronisation
            for w, proc in enumerate(procs):
                if proc.poll() is not None:  # a worker must only ever die by our hand
                    anomalies.append(f"worker {w} exited by itself with {proc.returncode}")
                    procs[w] = _spawn(kind, location, w, seed, logs)
            victim = rng.randrange(WORKERS)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(30)
            procs[victim] = _spawn(kind, location, victim, seed, logs)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
    return anomalies


def _await_first_send(logs: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait until some worker has sent a turn, so a loaded machine's slow start-up (imports,
    first resume) is not what the kills measure."""
    deadline = time.monotonic() + 120
    while not _effects(logs)["sent"]:
        assert time.monotonic() < deadline, "no storm worker sent a turn within 120 s"
        assert all(p.poll() is None for p in procs), "a storm worker died before its first turn"
        time.sleep(0.05)  # polling the workers' logs: they are other processes


def _effects(logs: Path) -> dict[str, collections.Counter[str]]:
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for path in logs.glob("effects-*.log"):
        for line in path.read_text().splitlines():
            what, _, arg = line.partition(" ")
            out[what][arg] += 1
    return out


def _check(agent: Any, logs: Path) -> list[str]:
    anomalies: list[str] = []
    users: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    results: collections.Counter[str] = collections.Counter()
    for sid in SESSIONS:
        session = agent.session(id=sid)
        if session.pending() is not None:
            anomalies.append(f"{sid}: a turn still pends after resume")
        messages = session.load()
        for i, m in enumerate(messages):
            if m.role == "user":
                users[m.text] += 1
            elif m.role == "assistant":
                for c in m.tool_calls:
                    calls[c.id] += 1
                    after = messages[i + 1 : i + 1 + len(m.tool_calls)]
                    following = {x.tool_call_id for x in after}
                    if c.id not in following:
                        anomalies.append(f"{sid}: tool call {c.id} has no result after it")
            elif m.tool_call_id is not None:
                results[m.tool_call_id] += 1
    effects = _effects(logs)
    anomalies += [f"user message {u} stored {n} times" for u, n in users.items() if n > 1]
    anomalies += [f"call id {c} stored {n} times" for c, n in calls.items() if n > 1]
    anomalies += [f"result of {c} stored {n} times" for c, n in results.items() if n > 1]
    anomalies += [f"returned turn {u} not stored" for u in effects["returned"] if u not in users]
    anomalies += [f"report tool ran {n} times for {c}" for c, n in effects["pay"].items() if n > 1]
    ran = {c.partition("-")[2] for kind in ("plain", "pay") for c in effects[kind]}
    anomalies += [f"turn {u} lost after its tools ran" for u in sorted(ran) if u not in users]
    return anomalies


@pytest.mark.timeout(max(600, 6 * KILLS))  # a kill every 0.275 s on average, plus restarts
@pytest.mark.parametrize("kind", ["sqlite", "redis", "files", "postgres", "encrypted-sqlite"])
def test_kill_storm_commits_every_turn_exactly_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    seed = int(os.environ.get("LOUSHO_STORM_SEED") or random.randrange(2**32))
    print(f"kill storm on {kind}: {KILLS} kills, seed {seed} (LOUSHO_STORM_SEED={seed} replays)")
    location = _location(kind, tmp_path, request)
    logs = tmp_path / "logs"
    logs.mkdir()
    anomalies = _storm(kind, location, logs, seed)
    agent = make_agent(kind, location, Log(logs / "effects-final.log"))
    for sid in SESSIONS:
        agent.session(id=sid).resume()
    anomalies += _check(agent, logs)
    effects = _effects(logs)
    print(f"{kind}: {len(effects['returned'])} turns returned, {len(effects['sent'])} sent, "
          f"{len(anomalies)} anomalies")
    assert effects["returned"], "no turn returned: the storm measured nothing"
    assert not anomalies, f"seed {seed}: " + "; ".join(anomalies[:20])
