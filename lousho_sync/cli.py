"""The ``lousho`` command: ``demo``, ``chat``, ``sessions``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lousho`` console script."""
    parser = argparse.ArgumentParser(prog="lousho", description="lousho: agents whose "
                                     "conversations survive")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="an offline tour: sessions, streaming, tools, "
                          "crash and resume, approvals")
    demo.add_argument("--dir", default=None, help="where the demo's SQLite store goes "
                      "(default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args.dir, out=sys.stdout)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
