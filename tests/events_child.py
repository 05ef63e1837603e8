"""Child processes for the event-log tests (detached turns, attach, takeover).

    python tests/events_child.py attach KIND DIR SESSION TURN AFTER [LEAVE_AT]
    python tests/events_child.py drive KIND DIR SESSION TEXT CHUNKS HOLD_AFTER
    python tests/events_child.py serve KIND DIR -

``attach`` prints ``READY`` once attached, then one JSON line per event
(``{"type", "seq", "text"}``) and ``{"end": ..., "result": ...}``; with ``LEAVE_AT`` it
leaves its loop after that seq and attaches again with it; with ``LOUSHO_TEST_ANSWER`` (and
``LOUSHO_TEST_CHUNKS``) its model streams that answer when it takes the turn over. ``drive``
starts a turn streaming TEXT in CHUNKS pieces, prints ``{"turn": ...}`` and then each event
it reads, and holds the answer after HOLD_AFTER pieces forever (the parent SIGKILLs it there;
with ``LOUSHO_TEST_GO_FILE`` it goes on once that file exists, then prints
``{"end": ..., "result"|"error": ...}``; ``LOUSHO_TEST_LEASE_TTL_S`` sets its lease's TTL,
``LOUSHO_TEST_HOST`` the host its lease owner names, ``LOUSHO_TEST_EVENT_INTERVAL_S`` its
turn's ``event_interval_s``; with ``LOUSHO_TEST_SAY_STORED`` it
prints ``{"stored": true}`` once the held answer's events are in the log). With
``LOUSHO_TEST_DUMP_DIR`` every child writes the stacks of all its threads to
``MODE-PID.txt`` there every 25 s and on SIGUSR1 (a stopped child's at its SIGCONT): where
a takeover that never comes waits.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from crash_child import make_store  # noqa: E402

from lousho_sync import (  # noqa: E402
    Event,
    LoushoError,
    Message,
    ModelDone,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ScriptedProvider,
    Signal,
    create_agent,
)


class GatedProvider:
    """Streams ``text`` in ``chunks`` pieces; after ``hold_after`` pieces of its first call
    it waits for ``gate`` (None: forever, until aborted)."""

    model = "gated"

    def __init__(self, text: str, chunks: int, hold_after: int,
                 gate: threading.Event | None = None, pace_s: float = 0.0) -> None:
        self.text = text
        size = max(1, -(-len(text) // chunks))
        self.pieces = [text[i:i + size] for i in range(0, len(text), size)]
        self.hold_after = hold_after
        self.gate = gate if gate is not None else threading.Event()
        self.calls = 0
        self.reached = threading.Event()
        self.pace_s = pace_s  # a pause before each piece (the storm's slow model)
        self.go_file: Path | None = None

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        self.calls += 1
        first = self.calls == 1
        for i, piece in enumerate(self.pieces):
            if first and i == self.hold_after:
                self.reached.set()
                while not self.gate.wait(0.05):
                    signal.raise_if_aborted()
                    if self.go_file is not None and self.go_file.exists():
                        break  # the parent says go on (it SIGSTOPped and continued us)
            if self.pace_s and signal.wait(self.pace_s):
                signal.raise_if_aborted()
            signal.raise_if_aborted()
            yield ModelTextDelta(piece)
        yield ModelDone(ModelResponse(Message("assistant", self.text), "stop", self.model))

    def complete(self, request: ModelRequest, *, signal: Signal) -> ModelResponse:
        return ModelResponse(Message("assistant", self.text), "stop", self.model)


def line_of(event: Event) -> dict[str, Any]:
    return {"type": event.type, "seq": event.seq, "turn": event.turn_id,
            "text": getattr(event, "text", None), "step": getattr(event, "step", None)}


_out_lock = threading.Lock()


def _out(value: Any) -> None:
    with _out_lock:  # one write a line: two threads print
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()


def _say_stored(provider: GatedProvider, turn_id: str) -> None:
    """Once the answer is held, write what the turn published to the log and say
    ``{"stored": true}``: the turn writes nothing more until it goes on."""
    from lousho_sync._detached import local_run

    provider.reached.wait()
    run = local_run(turn_id)
    assert run is not None
    while not run._publisher.flush():
        pass  # a failed write is made again
    _out({"stored": True})


def main() -> None:
    mode, kind, root, sid, *args = sys.argv[1:]
    if os.environ.get("LOUSHO_TEST_DUMP_DIR"):  # where a hang shows (see the module)
        import faulthandler
        import signal

        dump = open(  # noqa: SIM115 - open for the process's life
            Path(os.environ["LOUSHO_TEST_DUMP_DIR"]) / f"{mode}-{os.getpid()}.txt", "w")
        faulthandler.dump_traceback_later(25, repeat=True, file=dump)
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    store = make_store(kind, Path(root))
    if mode == "attach":
        turn, after = args[0], int(args[1])
        leave_at = int(args[2]) if len(args) > 2 else None
        answer = os.environ.get("LOUSHO_TEST_ANSWER")  # the model of a takeover
        provider: Any = (GatedProvider(answer, int(os.environ["LOUSHO_TEST_CHUNKS"]), -1)
                         if answer else ScriptedProvider(default="unused"))
        session = create_agent(provider=provider, store=store).session(id=sid)
        run = session.attach(turn, after=after)
        _out("READY")
        last = after
        for event in run:
            _out(line_of(event))
            last = event.seq
            if leave_at is not None and event.seq >= leave_at:
                break
        if leave_at is not None:
            for event in session.attach(turn, after=last):
                _out(line_of(event))
        result = run.result(timeout=60)
        _out({"end": True, "result": result.text})
    elif mode == "serve":  # the storm's reader: "SESSION TURN" lines on stdin
        answer = os.environ["LOUSHO_TEST_ANSWER"]
        agent = create_agent(provider=GatedProvider(answer, int(os.environ["LOUSHO_TEST_CHUNKS"]),
                                                    -1), store=store)
        _out("READY")
        for line in sys.stdin:
            session_id, turn = line.split()
            try:
                events = [line_of(e) for e in agent.session(id=session_id).attach(turn)]
                _out({"session": session_id, "events": events})
            except Exception as exc:
                _out({"session": session_id, "error": f"{type(exc).__name__}: {exc}"})
    elif mode == "drive":
        text, chunks, hold_after = args[0], int(args[1]), int(args[2])
        provider = GatedProvider(text, chunks, hold_after,
                                 pace_s=float(os.environ.get("LOUSHO_TEST_PACE_S", "0")))
        if os.environ.get("LOUSHO_TEST_HOST"):  # a lease owner that names another host
            from lousho_sync.stores import _lease

            _lease.HOST = os.environ["LOUSHO_TEST_HOST"]
        if os.environ.get("LOUSHO_TEST_GO_FILE"):
            provider.go_file = Path(os.environ["LOUSHO_TEST_GO_FILE"])
        ttl = os.environ.get("LOUSHO_TEST_LEASE_TTL_S")
        session = create_agent(provider=provider, store=store).session(
            id=sid, lease_ttl_s=float(ttl) if ttl else None)
        if os.environ.get("LOUSHO_TEST_EVENT_INTERVAL_S"):
            session.event_interval_s = float(os.environ["LOUSHO_TEST_EVENT_INTERVAL_S"])
        run = session.start("go")
        _out({"turn": run.turn_id})
        if os.environ.get("LOUSHO_TEST_SAY_STORED"):
            threading.Thread(target=_say_stored, args=(provider, run.turn_id),
                             daemon=True).start()
        for event in run:
            _out(line_of(event))
        try:
            _out({"end": True, "result": run.result(timeout=60).text})
        except LoushoError as exc:
            _out({"end": True, "error": exc.code})
    else:  # pragma: no cover
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
