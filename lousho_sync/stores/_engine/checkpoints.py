"""The checkpoint rules, once: the codec, the wrapping of a damaged checkpoint, and the
fenced save and delete. A backend writes :class:`CheckpointOps`; one that keeps the
objects themselves (the memory one) also writes :class:`ObjectCheckpointOps`, and is handed
the checkpoint without its JSON."""

from __future__ import annotations

import copy
from typing import Protocol, cast

import attrs

from ...codec import dumps_checkpoint, loads_checkpoint
from ...errors import StoreCorruptError
from ...records import Checkpoint, Fence
from .backend import Backend, text_of
from .leases import check_newest, fence_token_of

__all__ = ["CheckpointOps", "CheckpointRules", "ObjectCheckpointOps"]


class CheckpointOps(Protocol):
    """A backend's checkpoint primitives. A fenced write (``token`` >= 1) is refused,
    atomically, when a token newer than ``token`` exists for session ``fenced_id``: it
    then returns that newest token (0: written)."""

    @property
    def backend(self) -> Backend:
        """The connection the primitives run on."""
        ...

    def get(self, key: str) -> str | bytes | None:
        """The stored JSON text, or None."""
        ...

    def put(self, key: str, session_id: str | None, text: str, fenced_id: str | None, token: int,
            checkpoint: Checkpoint) -> int:
        """Write (replace) ``text`` under ``key``."""
        ...

    def drop(self, key: str, fenced_id: str | None, token: int) -> int:
        """Delete ``key`` (no error when absent)."""
        ...

    def keys(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        ...


class ObjectCheckpointOps(CheckpointOps, Protocol):
    """Checkpoint primitives that keep the objects (``keeps_objects`` True): the rules
    write through :meth:`keep` and read through :meth:`get_object`, no JSON either way
    (``get`` still gives the text, for the primitives' contract)."""

    keeps_objects: bool

    def keep(self, key: str, fenced_id: str | None, token: int, checkpoint: Checkpoint) -> int:
        """Write (replace) ``checkpoint`` under ``key``, as ``put``."""
        ...

    def get_object(self, key: str) -> Checkpoint | str | None:
        """The stored checkpoint (or text written through ``put``), or None."""
        ...


def _unshared(checkpoint: Checkpoint) -> Checkpoint:
    """A checkpoint a caller may change without changing the kept one: the records are
    frozen, only ``extra`` (a dict) is copied, deeply, when there is one."""
    if not checkpoint.extra:
        return checkpoint
    return attrs.evolve(checkpoint, extra=copy.deepcopy(dict(checkpoint.extra)))


class CheckpointRules:
    """A fenced checkpoint store over the primitives in ``_ops`` (opaque JSON by key;
    unknown fields round-trip)."""

    fenced = True
    _ops: CheckpointOps

    def load(self, key: str) -> Checkpoint | None:
        """The checkpoint, or None."""
        value: str | bytes | Checkpoint | None
        if getattr(self._ops, "keeps_objects", False):
            value = cast(ObjectCheckpointOps, self._ops).get_object(key)
            if value is None:  # (asked before every session turn: mostly none pends)
                return None
            if isinstance(value, Checkpoint):
                return _unshared(value)
        else:
            value = self._ops.get(key)
        if value is None:
            return None
        try:
            return loads_checkpoint(text_of(value))
        except (StoreCorruptError, ValueError) as exc:
            error = self._ops.backend.unreadable(f"checkpoint {key!r}", exc)
        raise error  # unchained: the codec's cause holds the stored text

    def save(self, key: str, checkpoint: Checkpoint, *, fence: Fence | None = None) -> None:
        """Write (replace) the checkpoint. With ``fence``, LeaseLostError (nothing written)
        when a newer lease token exists for the fence's session."""
        token, fenced_id = (0, None) if fence is None else (
            fence_token_of(fence, checkpoint.session_id), fence.session_id)
        ops = self._ops
        if getattr(ops, "keeps_objects", False):  # no JSON (the memory store)
            newest = cast(ObjectCheckpointOps, ops).keep(key, fenced_id, token, checkpoint)
        else:
            text = dumps_checkpoint(checkpoint)
            newest = ops.put(key, checkpoint.session_id, text, fenced_id, token, checkpoint)
        if fenced_id is not None:
            check_newest(self._ops.backend, fenced_id, newest, token)

    def delete(self, key: str, *, fence: Fence | None = None) -> None:
        """Delete the checkpoint (no error when absent). With ``fence``, LeaseLostError
        (nothing deleted) when a newer lease token exists for the fence's session."""
        token, fenced_id = (0, None) if fence is None else (
            fence_token_of(fence, None), fence.session_id)
        newest = self._ops.drop(key, fenced_id, token)
        if fenced_id is not None:
            check_newest(self._ops.backend, fenced_id, newest, token)

    def keys(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        return self._ops.keys(prefix)
