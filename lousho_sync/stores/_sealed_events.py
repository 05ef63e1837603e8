"""EncryptedStore's event log: the inner store's primitives with each row's JSON sealed like
a message (bound to its turn and seq, so a row moved elsewhere does not decrypt)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ._events import EventOps, TurnHead, TurnStatus

__all__ = ["SealedEventOps"]

Seal = Callable[[str, bytes], str]
Open = Callable[[str, bytes, str], str]


def _aad(turn_id: str, seq: int) -> bytes:
    return f"lousho event {turn_id}:{seq}".encode()


class SealedEventOps:
    """``inner`` with the rows sealed by ``seal(text, aad)`` and opened by
    ``open(token, aad, what)``; heads stay plain (ids, times, owner)."""

    def __init__(self, inner: EventOps, seal: Seal, open: Open) -> None:
        self._inner = inner
        self._seal = seal
        self._open = open

    def begin(self, head: TurnHead) -> None:
        self._inner.begin(head)

    def append(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str,
               status: TurnStatus, ended_at: float | None) -> bool | None:
        sealed = [(seq, self._seal(text, _aad(turn_id, seq))) for seq, text in rows]
        return self._inner.append(turn_id, sealed, owner=owner, status=status,
                                  ended_at=ended_at)

    def head(self, turn_id: str) -> TurnHead | None:
        return self._inner.head(turn_id)

    def latest(self, session_id: str) -> str | None:
        return self._inner.latest(session_id)

    def read(self, turn_id: str, after: int, limit: int) -> list[tuple[int, str]]:
        return [(seq, self._open(token, _aad(turn_id, seq), f"event {turn_id}:{seq}"))
                for seq, token in self._inner.read(turn_id, after, limit)]

    def wait(self, turn_id: str, after: int, timeout: float) -> None:
        self._inner.wait(turn_id, after, timeout)

    def replace(self, turn_id: str, rows: Sequence[tuple[int, str]], upto: int) -> None:
        sealed = [(seq, self._seal(text, _aad(turn_id, seq))) for seq, text in rows]
        self._inner.replace(turn_id, sealed, upto)

    def drop(self, turn_id: str) -> None:
        self._inner.drop(turn_id)

    def ended_before(self, when: float) -> list[str]:
        return self._inner.ended_before(when)
