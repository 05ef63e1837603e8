"""How many of the package's files one session turn runs through.

    python benchmarks/turn_files.py

Profiles (``sys.setprofile``) the second ``send()`` of a session on a SqliteStore with a
ScriptedProvider and prints: the Python calls made inside the package, the distinct package
files they ran in, and the moves between files (a call in another file than the call before it;
a generator resumed counts as a call). The files are listed with their call counts. Calls
into the standard library and C functions are not counted.
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import lousho_sync
from lousho_sync import create_agent
from lousho_sync.providers.scripted import ScriptedProvider
from lousho_sync.sqlite import SqliteStore

PACKAGE = str(Path(lousho_sync.__file__).resolve().parent.parent)


def _package_file(frame: FrameType) -> str | None:
    name = frame.f_code.co_filename
    if not name.startswith(PACKAGE):
        return None
    rel = name[len(PACKAGE) + 1:]
    return rel if rel.startswith(("lousho_sync", "lousho_aio")) else None


def measure() -> tuple[int, Counter[str], int]:
    """(calls, calls per file, moves) of the second send() of a fresh session."""
    with tempfile.TemporaryDirectory() as tmp:
        with warnings.catch_warnings():  # what this SQLite build is told to say: not counted
            warnings.simplefilter("ignore")
            store = SqliteStore(str(Path(tmp) / "turns.db"))
        try:
            agent = create_agent(provider=ScriptedProvider(default="ok"), store=store)
            session = agent.session("files")
            session.send("first")
            calls = 0
            per_file: Counter[str] = Counter()
            moves = 0
            last: list[str | None] = [None]  # the file of the previous call

            def profile(frame: FrameType, event: str, arg: Any) -> None:
                nonlocal calls, moves
                if event != "call":
                    return
                here = _package_file(frame)
                if here is None:
                    return
                calls += 1
                per_file[here] += 1
                if last[0] is not None and last[0] != here:
                    moves += 1
                last[0] = here

            sys.setprofile(profile)
            try:
                session.send("second")
            finally:
                sys.setprofile(None)
            return calls, per_file, moves
        finally:
            store.close()


def main() -> None:
    """Print the figures."""
    calls, per_file, moves = measure()
    print(f"second send(), SqliteStore, ScriptedProvider: {calls} calls in "
          f"{len(per_file)} package files, {moves} moves between files")
    for name, n in per_file.most_common():
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
