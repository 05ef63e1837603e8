"""The API key as an object that never shows itself, and the clip rule for error text.

A leaf below both the HTTP client and the response builder, which each redact with it.
"""

from __future__ import annotations

__all__ = ["RedactedCause", "Secret", "clip"]

_MIN_SECRET_LEN = 8  # shorter "keys" are placeholders for local servers; not redacted


def clip(text: str, limit: int = 500) -> str:
    """``text`` cut to ``limit`` characters (``...`` marks a cut), for error messages."""
    return text if len(text) <= limit else text[:limit] + "..."


class Secret:
    """An API key: ``reveal()`` gives it; its repr and str never do."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The key itself (only for the request header)."""
        return self._value

    def redact(self, text: str) -> str:
        """``text`` with every occurrence of the key replaced by ``***``."""
        if len(self._value) >= _MIN_SECRET_LEN and self._value in text:
            return text.replace(self._value, "***")
        return text

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def stand_in(self, exc: BaseException) -> RedactedCause:
        """A chainable stand-in for ``exc``: its type and redacted text, and no objects.

        A third-party exception can carry the request (with its auth header) or the raw
        body; a :class:`~lousho_sync.errors.ProviderError` chains this instead, raised
        outside the ``except`` block so that ``__context__`` holds nothing either.
        """
        kind = type(exc)
        return RedactedCause(f"{kind.__module__}.{kind.__qualname__}: {self.redact(str(exc))}")


class RedactedCause(Exception):
    """The cause of a provider error, as text only (see :meth:`Secret.stand_in`)."""
