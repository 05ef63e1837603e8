"""``python -m lousho_sync``: the ``lousho`` command."""

import sys

from .cli import main

sys.exit(main())
