"""The mailbox kill storm: worker processes send with ``turn_policy="queue"`` on one
session (so inputs join other processes' turns through the mailbox) while a killer
SIGKILLs a random one every 0.05-0.3 s and restarts it. Afterwards the session is resumed
here and checked: every input whose ``send()`` returned is in the transcript exactly once,
and no input is stored twice.

The kills per store come from ``LOUSHO_STRESS`` (``tests/_stress.py``: 10 by default, 50 in
CI's storm step, 300 with ``long``); ``LOUSHO_STORM_KILLS`` sets them alone."""

from __future__ import annotations

import collections
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _stress import STORM_KILLS
from conftest import STORE_KINDS, read_line
from crash_child import make_store

from lousho_sync import ScriptedProvider, create_agent

HERE = Path(__file__).resolve().parent
KILLS = STORM_KILLS
WORKERS = 3
LEASE_TTL_S = 3.0

pytestmark = pytest.mark.stress


def _spawn(kind: str, root: Path, worker: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HERE / "mail_storm_worker.py"), kind,
                             str(root), str(worker), str(LEASE_TTL_S)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


@pytest.mark.parametrize("kind", STORE_KINDS, indirect=True)
@pytest.mark.timeout(120 + KILLS * 3)
def test_queue_senders_under_a_kill_storm_store_every_returned_input_once(
    kind: str, tmp_path: Path
) -> None:
    rng = random.Random()
    procs = [_spawn(kind, tmp_path, w) for w in range(WORKERS)]
    try:
        for p in procs:  # the storm starts once every worker's first send() returned
            assert read_line(p) == "up"
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.05, 0.3))  # the killer's cadence, not a sync
            w = rng.randrange(WORKERS)
            procs[w].send_signal(signal.SIGKILL)
            procs[w].wait()
            procs[w] = _spawn(kind, tmp_path, w)
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    returned: dict[str, bool] = {}
    for w in range(WORKERS):
        path = tmp_path / f"returned-{w}.txt"
        for line in path.read_text().splitlines() if path.exists() else []:
            label, joined = line.split()
            returned[label] = joined == "1"
    assert returned, "no send() returned: the storm measured nothing"
    agent = create_agent(provider=ScriptedProvider(default="done"),
                         store=make_store(kind, tmp_path))
    session = agent.session(id="storm", lease_ttl_s=LEASE_TTL_S)
    session.resume()  # a turn a kill left pending is finished here
    users = collections.Counter(m.text for m in session.messages if m.role == "user")
    twice = [label for label, n in users.items() if n > 1]
    assert not twice, f"inputs stored more than once: {twice[:5]}"
    lost = [label for label in returned if users[label] != 1]
    assert not lost, f"returned inputs missing from the transcript: {lost[:5]}"
    print(f"{kind}: {len(returned)} sends returned, {sum(returned.values())} joined "
          f"another process's turn, {len(users)} inputs stored")
