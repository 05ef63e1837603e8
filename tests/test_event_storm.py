"""The kill storm with attached readers (issue 29): round after round, a driver process
starts a detached turn that streams its answer slowly and is SIGKILLed at a random moment
(before its first checkpoint, mid-answer, after its commit); a reader process attached to
the turn takes it over when its driver dies. Afterwards: no turn committed twice, every
reader's text (after applying ``step.reset``) equals the committed answer, no event out of
order.

The kills per store come from ``LOUSHO_STRESS`` (``tests/_stress.py``: 10 by default, 50 in
CI's storm step, 300 with ``long``); ``LOUSHO_STORM_KILLS`` sets them alone;
``LOUSHO_STORM_SEED`` replays a run (the seed is printed).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from _stress import STORM_KILLS
from conftest import STORE_KINDS
from crash_child import make_store
from test_events import ANSWER, Child, applied, child

from lousho_sync import ScriptedProvider, create_agent

KILLS = STORM_KILLS
KINDS = [*STORE_KINDS, "encrypted-sqlite"]

pytestmark = pytest.mark.stress


@pytest.mark.timeout(120 + 6 * KILLS)  # about a second a kill, more on a loaded machine
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_kill_storm_with_attached_readers(kind: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("LOUSHO_STORM_SEED", str(random.randrange(1 << 30))))
    print(f"LOUSHO_STORM_SEED={seed}")
    rng = random.Random(seed)
    env = {"LOUSHO_TEST_ANSWER": ANSWER, "LOUSHO_TEST_CHUNKS": "20"}
    reader = child("serve", kind, str(tmp_path), "-", **env)
    watched: list[str] = []
    try:
        assert reader.line() == "READY"
        for i in range(KILLS):
            sid = f"s{i}"
            driver: Child = child("drive", kind, str(tmp_path), sid, ANSWER, "20", "-1",
                                  LOUSHO_TEST_PACE_S="0.01")
            try:
                turn = driver.line()["turn"]
                reader.send(f"{sid} {turn}\n")
                watched.append(sid)
                time.sleep(rng.uniform(0.0, 0.4))  # the moment of the kill, not a sync
            finally:
                driver.kill()
        results: dict[str, Any] = {}
        while len(results) < len(watched):
            out = reader.line()
            results[out["session"]] = out
    finally:
        reader.close()
    check = create_agent(provider=ScriptedProvider(default="x"), store=make_store(kind, tmp_path))
    twice = wrong = disorder = lost = resets = 0
    for sid in watched:
        session = check.session(id=sid)
        texts = [m.text for m in session.load()]
        if len(texts) > 2:
            print("committed twice:", sid, texts)
            twice += 1
        out = results[sid]
        if "error" in out:  # the reader's error: only a turn lost before it was recorded
            lost += 1
            assert texts == [], (sid, out, texts)
            continue
        events = out["events"]
        seqs = [e["seq"] for e in events]
        if seqs != list(range(len(seqs))):
            print("out of order:", sid, seqs)
            disorder += 1
        resets += any(e["type"] == "step.reset" for e in events)
        done = events[-1]
        assert done["type"] == "run.done", (sid, events[-3:])
        if texts == ["go", ANSWER]:
            if applied(events) != ANSWER:
                print("wrong text:", sid, applied(events))
                wrong += 1
        else:  # never committed: the reader was told so (error, run.done)
            assert texts == [] and events[-2]["type"] == "error", (sid, texts, events[-3:])
            lost += 1
    print(f"{kind}: {len(watched)} kills, {resets} turns taken over by their reader, {lost} "
          "lost before their first record")
    assert (twice, wrong, disorder) == (0, 0, 0)
