"""lousho's benchmarks: ``python -m benchmarks`` runs them all (see :mod:`benchmarks.run`).

Not run by the test suite. The peers comparison needs the ``bench`` extra.
"""
