"""``python -m benchmarks``: every benchmark, then the peers table."""

import sys

from .run import main

sys.exit(main())
