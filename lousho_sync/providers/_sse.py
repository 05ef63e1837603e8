"""Server-sent events: a parser for ``text/event-stream`` bodies (WHATWG rules), fed raw
byte chunks as they arrive."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

__all__ = ["SseEvent", "iter_sse"]


@attrs.frozen(slots=True)
class SseEvent:
    """One dispatched server-sent event: its ``event`` name (default ``message``) and data."""

    event: str
    data: str
    id: str | None = None


def _iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Complete lines (CR, LF or CRLF ended); an unterminated last line is dropped."""
    buf = bytearray()
    first = True
    for chunk in chunks:
        buf += chunk
        start = 0
        while True:
            cr, lf = buf.find(b"\r", start), buf.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            if lf < 0 or 0 <= cr < lf:
                if cr == len(buf) - 1:  # maybe the first half of CRLF: wait for more
                    break
                end, nxt = cr, cr + 2 if buf[cr + 1 : cr + 2] == b"\n" else cr + 1
            else:
                end, nxt = lf, lf + 1
            line = buf[start:end].decode("utf-8", errors="replace")
            if first:
                line, first = line.removeprefix("\ufeff"), False
            start = nxt
            yield line
        del buf[:start]
    if buf.endswith(b"\r"):
        yield buf[:-1].decode("utf-8", errors="replace")


def iter_sse(chunks: Iterable[bytes]) -> Iterator[SseEvent]:
    """Parse a server-sent event stream (WHATWG rules) from raw byte chunks.

    Handles ``event:``/``data:``/``id:`` fields, multi-line data, ``:`` comments and any
    line ending. A last event not followed by a blank line is still dispatched if its
    lines are complete; a cut-off last line is dropped.
    """
    event, last_id = "", None
    data: list[str] = []
    for line in _iter_lines(chunks):
        if not line:
            if data:
                yield SseEvent(event or "message", "\n".join(data), last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\0" not in value:
            last_id = value
    if data:
        yield SseEvent(event or "message", "\n".join(data), last_id)
