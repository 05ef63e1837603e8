"""The stores' benchmarks, this checkout against another one (e.g. the commit before a store
change, in a git worktree), measured alternately in one run: ``bench_sqlite.py``,
``bench_redis.py`` and ``bench_postgres.py`` (this checkout's scripts) import lousho from
each checkout in turn, several rounds, and the medians of their main figures are compared.

    git worktree add /tmp/lousho-old <commit>
    python -m benchmarks.compare_stores /tmp/lousho-old [--rounds 3] [--only sqlite,redis]

Redis and PostgreSQL are measured when ``LOUSHO_TEST_REDIS_URL`` /
``LOUSHO_TEST_POSTGRES_URL`` name a server (bench_redis starts its own otherwise;
bench_postgres is left out without one). Lower is better for every figure except turns/s.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# bench -> (script arguments, [(figure, regex whose first group is the number)])
FIGURES: dict[str, tuple[list[str], list[tuple[str, str]]]] = {
    "sqlite": (["--turns", "400"], [
        ("full, 20 stored (µs)", r"^full\s+[0-9.]+\s+([0-9.]+)"),
        ("full, 10,000 stored (µs)", r"^full\s+(?:[0-9.]+\s+){4}([0-9.]+)"),
        ("normal, 20 stored (µs)", r"^normal\s+[0-9.]+\s+([0-9.]+)"),
        ("normal, 10,000 stored (µs)", r"^normal\s+(?:[0-9.]+\s+){4}([0-9.]+)"),
        ("load 10,000 (ms)", r"^load of a 10,000-message session: ([0-9.]+)"),
    ]),
    "redis": (["--turns", "1000"], [
        ("append, 10 stored (µs)", r"^RedisStore\s+([0-9.]+)"),
        ("append, 10,000 stored (µs)", r"^RedisStore\s+[0-9.]+\s+([0-9.]+)"),
        ("load 10,000 (ms)", r"^RedisStore\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)"),
    ]),
    "postgres": (["--seconds", "2"], [
        ("append (ms)", r"^append: ([0-9.]+) ms"),
        ("load 10,000 mixed (ms)", r"^load 10000 \(mixed messages\): ([0-9.]+) ms"),
        ("turns/s, 1 session, 4 processes", r"^turns/s, 1 session\(s\) across \d+ processes: "
                                            r"([0-9.]+)"),
        ("turns/s, 100 sessions, 4 processes", r"^turns/s, 100 session\(s\) across \d+ "
                                               r"processes: ([0-9.]+)"),
    ]),
}


def run(bench: str, package_root: Path) -> dict[str, float]:
    """One run of ``bench_<bench>.py`` importing lousho from ``package_root``."""
    args, figures = FIGURES[bench]
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", str(HERE / f"bench_{bench}.py"), *args],
        cwd=package_root, env=env, capture_output=True, text=True, check=True,
    ).stdout
    got = {}
    for name, pattern in figures:
        match = re.search(pattern, out, re.MULTILINE)
        if match:
            got[name] = float(match.group(1))
    return got


def main() -> None:
    """Run each benchmark against both checkouts, alternating, and print the medians."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (its root directory)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="sqlite,redis,postgres",
                        help="comma-separated: sqlite, redis, postgres")
    args = parser.parse_args()
    benches = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = sorted(set(benches) - set(FIGURES))
    if unknown:
        parser.error(f"--only: unknown benchmark(s) {', '.join(unknown)}; "
                     f"known: {', '.join(FIGURES)}")
    if "postgres" in benches and not os.environ.get("LOUSHO_TEST_POSTGRES_URL"):
        print("postgres: skipped (LOUSHO_TEST_POSTGRES_URL is not set)")
        benches.remove("postgres")
    print(f"{'median of ' + str(args.rounds) + ' runs':<44}{'other':>10}{'this':>10}"
          f"{'this/other':>12}")
    for bench in benches:
        samples: dict[str, dict[str, list[float]]] = {"this": {}, "other": {}}
        for i in range(args.rounds):
            order = (("other", args.other.resolve()), ("this", ROOT))
            for name, root in order if i % 2 == 0 else order[::-1]:
                for figure, value in run(bench, root).items():
                    samples[name].setdefault(figure, []).append(value)
        for figure, _ in FIGURES[bench][1]:
            other = statistics.median(samples["other"].get(figure, [float("nan")]))
            this = statistics.median(samples["this"].get(figure, [float("nan")]))
            print(f"{bench + ': ' + figure:<44}{other:>10.1f}{this:>10.1f}"
                  f"{this / other:>12.2f}")


if __name__ == "__main__":
    main()
