"""Who is calling: the identity a turn queue uses to refuse a call that would wait forever
behind its own caller's unread stream.

In plain code the caller is the thread. An asyncio facade runs blocking calls on pool
threads, so it says which task is calling with :func:`calling_as` (a context variable,
which travels with the task's context into the pool thread).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator

__all__ = ["adopt", "calling_as", "context_for", "current_caller", "declared_caller"]

_CALLER: contextvars.ContextVar[object] = contextvars.ContextVar("lousho_caller")


def declared_caller() -> object | None:
    """The caller set by :func:`calling_as` or :func:`adopt` in this context, or None."""
    return _CALLER.get(None)


def adopt(caller: object) -> object:
    """Make ``caller`` this context's caller for good, unless one is declared already;
    returns the one in force. Contexts copied from this one later (an asyncio task's
    children, e.g. the task ``asyncio.wait_for`` makes on Python 3.11) inherit it."""
    current = _CALLER.get(None)
    if current is None:
        _CALLER.set(caller)
        return caller
    return current


def current_caller() -> object:
    """The caller's identity: the one set by :func:`calling_as`, else the thread's id."""
    caller = _CALLER.get(None)
    return caller if caller is not None else threading.get_ident()


@contextlib.contextmanager
def calling_as(caller: object) -> Iterator[None]:
    """Calls made in this block (and in contexts copied from it) are ``caller``'s."""
    token = _CALLER.set(caller)
    try:
        yield
    finally:
        _CALLER.reset(token)


def context_for(caller: object) -> contextvars.Context:
    """A copy of the current context in which calls are ``caller``'s (for work handed to
    another thread on the caller's behalf)."""
    context = contextvars.copy_context()
    context.run(_CALLER.set, caller)
    return context
