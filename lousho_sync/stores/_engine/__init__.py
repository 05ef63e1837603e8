"""The store engine: the rules every built-in store follows, written once.

``backend`` is the skeleton of a backend's connection (lock, closed flag, fork guard, one
error translation table); ``leases``, ``checkpoints``, ``approvals`` and ``commits`` are
the rules of each kind of write, driven by small primitives a backend writes (each one
transaction or one script, returning an outcome instead of raising). See "Writing a store"
in docs/architecture.md.
"""
