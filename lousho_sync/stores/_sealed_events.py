"""EncryptedStore's event log: the inner store's primitives with each row's JSON sealed like
a message (bound to its turn and seq, so a row moved elsewhere does not decrypt); the rows
its live tail sends are sealed the same way (never plaintext on the channel)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ._events import LIVE_LOG, EventOps, LiveOps, LiveTail, TurnHead, TurnStatus, live_of

__all__ = ["SealedEventOps", "SealedLive"]

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
        inner_live = live_of(inner)
        self.live: SealedLive | None = (
            None if inner_live is None else SealedLive(inner_live, seal, open))
        """The inner store's live tail, sealed (None when it has none)."""

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


class SealedLive:
    """``inner``'s live tail with the rows sealed as the log's are."""

    def __init__(self, inner: LiveOps, seal: Seal, open: Open) -> None:
        self._inner = inner
        self._seal = seal
        self._open = open

    def watched(self, turn_id: str, *, ask: bool = False) -> bool:
        return self._inner.watched(turn_id, ask=ask)

    def send(self, turn_id: str, rows: Sequence[tuple[int, str]], *, owner: str) -> None:
        sealed = [(seq, self._seal(text, _aad(turn_id, seq))) for seq, text in rows]
        self._inner.send(turn_id, sealed, owner=owner)

    def sent(self, turn_id: str) -> int:
        return self._inner.sent(turn_id)

    def tail(self, turn_id: str) -> LiveTail:
        return _SealedTail(self._inner.tail(turn_id), turn_id, self._open)


class _SealedTail:
    """A tail whose rows are opened; a row that does not open is left to the log."""

    def __init__(self, inner: LiveTail, turn_id: str, open: Open) -> None:
        self._inner = inner
        self._turn = turn_id
        self._open = open

    def get(self, after: int, timeout: float) -> list[tuple[int, str] | None]:
        out: list[tuple[int, str] | None] = []
        for item in self._inner.get(after, timeout):
            if item is None:
                out.append(LIVE_LOG)
                continue
            seq, token = item
            try:
                out.append((seq, self._open(token, _aad(self._turn, seq),
                                            f"event {self._turn}:{seq}")))
            except Exception:
                out.append(LIVE_LOG)
        return out

    def close(self) -> None:
        self._inner.close()
