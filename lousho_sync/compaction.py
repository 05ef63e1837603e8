"""Compaction: replace older messages with one model-written summary."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Compaction", "compact_session"]


@attrs.frozen(slots=True, kw_only=True)
class Compaction:
    """Automatic compaction: before a turn whose estimated input exceeds
    ``max_input_tokens``, compact the session keeping the last ``keep_last`` messages."""

    max_input_tokens: int
    keep_last: int = 8
    instructions: str | None = None


def compact_session(session: Session, *, keep_last: int, instructions: str | None) -> None:
    """Compact ``session`` now (see :meth:`Session.compact`)."""
    raise NotImplementedError("compaction arrives with the budgets issue")
