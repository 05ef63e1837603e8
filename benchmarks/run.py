"""Run every benchmark and print its table under a heading.

    python -m benchmarks [--quick] [--only NAME ...] [--no-peers] [--timeout S]
    python benchmarks/run.py ...

Each ``benchmarks/bench_*.py`` runs as its own subprocess (so one benchmark's imports, caches
and garbage do not weigh on the next), then the peers comparison (``python -m
benchmarks.peers``). A benchmark that fails or times out is reported with the end of its
error output, and the others still run. ``--quick`` is passed to the peers benchmark.
``bench_postgres`` needs a PostgreSQL server in ``LOUSHO_TEST_POSTGRES_URL`` (it says it was
skipped without one); ``bench_redis`` takes ``LOUSHO_TEST_REDIS_URL`` or starts a server.
Benchmarks are not part of the test suite.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def scripts() -> list[Path]:
    """The ``bench_*.py`` files beside this one, by name."""
    return sorted(HERE.glob("bench_*.py"))


def run_one(title: str, command: list[str], timeout_s: float) -> bool:
    """Run ``command`` from the repository root; print its output under ``title``."""
    print(f"\n### {title}\n", flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        print(f"skipped: still running after {timeout_s:.0f} s", flush=True)
        return False
    elapsed = time.monotonic() - start
    if proc.stdout:
        print(proc.stdout.rstrip())
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        print(f"skipped: exit status {proc.returncode}\n{tail}", flush=True)
        return False
    print(f"[{elapsed:.1f} s]", flush=True)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; the exit status is 1 when one failed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter peers run")
    parser.add_argument(
        "--only", nargs="*", default=None, help="names, e.g. bench_overhead peers"
    )
    parser.add_argument("--no-peers", action="store_true", help="skip the peers comparison")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    args = parser.parse_args(argv)
    jobs: list[tuple[str, list[str]]] = [
        (path.stem, [sys.executable, str(path)]) for path in scripts()
    ]
    if not args.no_peers:
        peers = [sys.executable, "-m", "benchmarks.peers"] + (["--quick"] if args.quick else [])
        jobs.append(("peers", peers))
    if args.only:
        jobs = [job for job in jobs if job[0] in args.only]
    failed = [title for title, command in jobs if not run_one(title, command, args.timeout)]
    if failed:
        print(f"\nnot run to the end: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
