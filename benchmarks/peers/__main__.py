"""``python -m benchmarks.peers``."""

from .run import main

main()
