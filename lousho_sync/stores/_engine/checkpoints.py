"""The checkpoint rules, once: the codec, the wrapping of a damaged checkpoint, and the
fenced save and delete. A backend writes :class:`CheckpointOps`."""

from __future__ import annotations

from typing import Protocol

from ...codec import dumps_checkpoint, loads_checkpoint
from ...errors import StoreCorruptError
from ...records import Checkpoint, Fence
from .backend import Backend, text_of
from .leases import check_newest, fence_token_of

__all__ = ["CheckpointOps", "CheckpointRules"]


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


class CheckpointRules:
    """A fenced checkpoint store over the primitives in ``_ops`` (opaque JSON by key;
    unknown fields round-trip)."""

    fenced = True
    _ops: CheckpointOps

    def load(self, key: str) -> Checkpoint | None:
        """The checkpoint, or None."""
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
        token = fence_token_of(fence, checkpoint.session_id)
        text = dumps_checkpoint(checkpoint)
        fenced_id = None if fence is None else fence.session_id
        newest = self._ops.put(key, checkpoint.session_id, text, fenced_id, token, checkpoint)
        if fenced_id is not None:
            check_newest(self._ops.backend, fenced_id, newest, token)

    def delete(self, key: str, *, fence: Fence | None = None) -> None:
        """Delete the checkpoint (no error when absent). With ``fence``, LeaseLostError
        (nothing deleted) when a newer lease token exists for the fence's session."""
        token = fence_token_of(fence, None)
        fenced_id = None if fence is None else fence.session_id
        newest = self._ops.drop(key, fenced_id, token)
        if fenced_id is not None:
            check_newest(self._ops.backend, fenced_id, newest, token)

    def keys(self, prefix: str) -> list[str]:
        """Keys starting with ``prefix``, sorted."""
        return self._ops.keys(prefix)
