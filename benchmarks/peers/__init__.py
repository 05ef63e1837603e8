"""The peers benchmark: the same session workload on lousho and the SDKs users would pick.

Run it with ``python -m benchmarks.peers``; see :mod:`benchmarks.peers.run`.
"""
