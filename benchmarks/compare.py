"""The framework's own cost per turn, this checkout against another one (e.g. the previous
main in a git worktree), measured in the same run: ``bench_overhead.py`` runs alternately
against each package, several rounds, and the medians are compared.

    git worktree add /tmp/lousho-old <commit>
    python -m benchmarks.compare /tmp/lousho-old [--rounds 3] [--reps 3000]
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
ROWS = ("one model step", "one tool call", "turns 1-10", "turns 191-200")


def run(package_root: Path, reps: int, conversations: int) -> dict[str, float]:
    """One run of bench_overhead.py importing lousho from ``package_root``."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    out = subprocess.run(
        [sys.executable, str(HERE / "bench_overhead.py"), "--reps", str(reps),
         "--conversations", str(conversations)],
        cwd=package_root, env=env, capture_output=True, text=True, check=True,
    ).stdout
    got = {}
    for row in ROWS:
        match = re.search(re.escape(row) + r".*?([0-9.]+)\s*$", out, re.MULTILINE)
        if match:
            got[row] = float(match.group(1))
    return got


def main() -> None:
    """Run both, alternating, and print medians and ratios."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (its root directory)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3_000)
    parser.add_argument("--conversations", type=int, default=10)
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {"this": {}, "other": {}}
    for _ in range(args.rounds):
        for name, root in (("other", args.other.resolve()), ("this", ROOT)):
            for row, value in run(root, args.reps, args.conversations).items():
                samples[name].setdefault(row, []).append(value)
    print(f"{'median µs of ' + str(args.rounds) + ' runs':<36}{'other':>10}{'this':>10}"
          f"{'this/other':>12}")
    for row in ROWS:
        other = statistics.median(samples["other"].get(row, [float("nan")]))
        this = statistics.median(samples["this"].get(row, [float("nan")]))
        print(f"{row:<36}{other:>10.1f}{this:>10.1f}{this / other:>12.2f}")


if __name__ == "__main__":
    main()
