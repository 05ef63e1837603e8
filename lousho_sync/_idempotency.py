"""Idempotency keys: the one rule, written once for every store.

A call with ``idempotency_key=K`` claims K in its turn's messages, so the claim is as atomic
as the turn itself on every store, with no store primitive of its own:

* the turn's first message carries ``{"key": K}`` in its ``extra`` (under :data:`EXTRA`):
  it is in the turn's first checkpoint write, so a turn that crashes with progress keeps
  its key, and the next holder of the lease that finishes it finishes the keyed turn;
* the turn's last message carries ``{"key": K, "at": <commit time>, "end": {...}}`` (the
  result's count of messages, steps, finish reason, run id and usage), written in the
  commit transaction, so a committed key always points at a whole turn;
* a turn that failed without progress wrote nothing that survives: the key is free again.

A later call with K (any process; it first waits for the session's lease, so a running
turn with K is waited for) finds the sealed message in the transcript and returns that
turn's result rebuilt from the store (``result.replayed``). A seal older than the TTL is
ignored: the key is free again. Compaction carries the seals of the turns it summarises,
still within the TTL, on its summary message (:func:`carry`), so a key is not free again
after compaction; a seal past its TTL is dropped there. A store's ``prune()`` removes the
seals past the TTL (and the claims of their turns) from the transcripts (:func:`expire`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .errors import InvalidInputError
from .messages import Message, Usage
from .results import ExecutionResult

__all__ = ["DEFAULT_TTL_S", "EXTRA", "MAX_KEY", "carry", "check_key", "claim", "claims",
           "expire", "find", "seal"]

EXTRA = "lousho_idempotency"
MAX_KEY = 200
DEFAULT_TTL_S = 24 * 3600.0


def check_key(key: object) -> str | None:
    """``key`` when it is None or a non-empty str of at most :data:`MAX_KEY` characters;
    InvalidInputError otherwise (raised before anything is written)."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidInputError(
            f"idempotency_key must be a str, got {type(key).__name__}: {key!r:.80}"
        )
    if not key or len(key) > MAX_KEY:
        raise InvalidInputError(
            f"idempotency_key must be a non-empty str of at most {MAX_KEY} characters; "
            f"got {len(key)} characters"
        )
    return key


def _stamp(m: Message, value: Mapping[str, Any]) -> Message:
    return attrs.evolve(m, extra={**m.extra, EXTRA: dict(value)})


def claim(msgs: tuple[Message, ...], key: str, also: str | None = None) -> tuple[Message, ...]:
    """The turn's input with ``key`` recorded on its first message (``also``: the caller's
    idempotency key of an input joining another turn through the mailbox, whose ``key`` is
    the mail's id: the turn that applies it seals both)."""
    stamp: dict[str, Any] = {"key": key} if also is None else {"key": key, "also": [also]}
    return (_stamp(msgs[0], stamp), *msgs[1:]) if msgs else msgs


def claims(msgs: Sequence[Message]) -> list[str]:
    """The keys claimed by ``msgs`` (a turn's messages: its input, and input joined from
    another call, see :mod:`lousho_sync._mailbox`), in order."""
    out: list[str] = []
    for m in msgs:
        if m.role != "user" or not m.extra:
            continue
        stamp = m.extra.get(EXTRA)
        if isinstance(stamp, Mapping) and "end" not in stamp:
            key = stamp.get("key")
            if isinstance(key, str):
                out.append(key)
            out.extend(k for k in stamp.get("also") or () if isinstance(k, str))
    return out


def seal(result: ExecutionResult, keys: Sequence[str]) -> ExecutionResult:
    """``result`` with its last message sealed: ``keys`` (claimed in the turn), the commit
    time and what rebuilds the result from the stored transcript."""
    if not result.messages or not keys:
        return result
    end = {
        "count": len(result.messages), "steps": result.steps,
        "finish_reason": result.finish_reason, "run_id": result.run_id,
        "exceeded": result.exceeded, "usage": attrs.asdict(result.usage),
    }
    last = result.messages[-1]
    old = last.extra.get(EXTRA)
    stamp = {**(old if isinstance(old, Mapping) else {}), "key": keys[0],
             "keys": list(keys), "at": time.time(), "end": end}
    return attrs.evolve(result, messages=(*result.messages[:-1], _stamp(last, stamp)))


def carry(
    summary: Message, older: Sequence[Message], ttl_s: float, *, now: float | None = None
) -> Message:
    """``summary`` (the compaction summary replacing ``older``) carrying the seals of the
    turns in ``older`` (and those an earlier summary among them carried) still within
    ``ttl_s``, with each turn's answer text: a key is not free again after compaction,
    and a seal past its TTL is dropped here."""
    cutoff = (time.time() if now is None else now) - ttl_s
    carried: list[dict[str, Any]] = []
    for i, m in enumerate(older):
        stamp = m.extra.get(EXTRA) if m.extra else None
        if not isinstance(stamp, Mapping):
            continue
        for old in stamp.get("carried") or ():
            if isinstance(old, Mapping) and _fresh(old.get("at"), cutoff):
                carried.append(dict(old))
        if "end" in stamp and _fresh(stamp.get("at"), cutoff):
            end = stamp["end"]
            turn = older[max(0, i + 1 - int(end["count"])): i + 1]
            carried.append({
                "keys": list(stamp.get("keys") or (stamp.get("key"),)), "at": stamp["at"],
                "end": dict(end),
                "text": next((x.text for x in reversed(turn) if x.role == "assistant"), ""),
            })
    if not carried:
        return summary
    return _stamp(summary, {"carried": carried})


def _fresh(at: object, cutoff: float) -> bool:
    return isinstance(at, (int, float)) and at >= cutoff


def _from_carried(c: Mapping[str, Any]) -> ExecutionResult:
    end = c["end"]
    return ExecutionResult(
        text=str(c.get("text", "")), finish_reason=str(end["finish_reason"]), messages=(),
        usage=Usage(**end["usage"]), steps=int(end["steps"]), run_id=str(end["run_id"]),
        exceeded=end.get("exceeded"), replayed=True,
    )


def find(
    messages: Sequence[Message], key: str, ttl_s: float, *, now: float | None = None
) -> ExecutionResult | None:
    """The committed result of the turn that used ``key`` within ``ttl_s`` (rebuilt from
    ``messages``, ``replayed`` set), or None when the key is free. A turn that compaction
    summarised is found in its summary (:func:`carry`): its result has no messages (they
    are in the session's history)."""
    cutoff = (time.time() if now is None else now) - ttl_s
    for i in range(len(messages) - 1, -1, -1):
        stamp = messages[i].extra.get(EXTRA)
        if not isinstance(stamp, Mapping):
            continue
        if "end" not in stamp:
            for c in reversed(stamp.get("carried") or ()):
                if isinstance(c, Mapping) and key in (c.get("keys") or ()):
                    return _from_carried(c) if _fresh(c.get("at"), cutoff) else None
            continue
        if key not in (stamp.get("keys") or (stamp.get("key"),)):
            continue
        at = stamp.get("at")
        if not isinstance(at, (int, float)) or at < cutoff:
            return None
        end = stamp["end"]
        count = int(end["count"])
        msgs = tuple(messages[max(0, i + 1 - count): i + 1])
        return ExecutionResult(
            text=next((m.text for m in reversed(msgs) if m.role == "assistant"), ""),
            finish_reason=str(end["finish_reason"]), messages=msgs,
            usage=Usage(**end["usage"]), steps=int(end["steps"]), run_id=str(end["run_id"]),
            exceeded=end.get("exceeded"), replayed=True,
        )
    return None


def _unstamp(m: Message) -> Message:
    return attrs.evolve(m, extra={k: v for k, v in m.extra.items() if k != EXTRA})


def expire(
    messages: Sequence[Message], ttl_s: float, *, now: float | None = None
) -> list[Message] | None:
    """``messages`` without the keys past ``ttl_s`` — each expired seal, with the claims of
    its turn, and the expired entries a compaction summary carries — or None when there is
    none (they count as free already: this only frees their space)."""
    cutoff = (time.time() if now is None else now) - ttl_s
    out = list(messages)
    changed = False
    for i, m in enumerate(out):
        stamp = m.extra.get(EXTRA) if m.extra else None
        if not isinstance(stamp, Mapping):
            continue
        if "end" in stamp:
            if _fresh(stamp.get("at"), cutoff):
                continue
            try:
                count = int(stamp["end"]["count"])
            except (KeyError, TypeError, ValueError):
                count = 1
            for j in range(max(0, i + 1 - count), i + 1):
                if out[j].extra and EXTRA in out[j].extra:
                    out[j] = _unstamp(out[j])
                    changed = True
        elif "carried" in stamp:
            carried = stamp.get("carried") or ()
            kept = [c for c in carried if isinstance(c, Mapping) and _fresh(c.get("at"), cutoff)]
            if len(kept) != len(carried):
                rest = {k: v for k, v in stamp.items() if k != "carried"}
                left = {**rest, "carried": kept} if kept else rest
                out[i] = _stamp(m, left) if left else _unstamp(m)
                changed = True
    return out if changed else None
