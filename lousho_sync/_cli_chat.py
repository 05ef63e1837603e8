"""``lousho chat``: a streaming chat on one durable session.

A pending turn (a crash, or a failure that left work to finish) is shown on start and after
each failure; ``/retry`` finishes it and prints its answer, ``/discard`` drops it. Ctrl-C
during a turn aborts the turn; at the prompt it ends the chat (exit code 130). When stdin is
a terminal, the prompt has line editing and history (the standard ``readline`` module).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from .events import RunDone, TextDelta, ToolCallStart
from .session import Session
from .signal import AbortController

__all__ = ["EXIT_INTERRUPTED", "chat_loop", "pending_note"]

EXIT_INTERRUPTED = 130
HELP = "/history /retry /discard /clear /compact /exit; Ctrl-C aborts a turn"


def pending_note(session: Session) -> str | None:
    """One line about the session's pending turn, or None when nothing pends."""
    pending = session.pending()
    if pending is None:
        return None
    if pending.status == "awaiting-approval":
        return (f"a turn is waiting for approval {pending.approval_id}: resolve it with "
                "agent.approvals.resolve(), or /discard drops the turn")
    return "a turn is pending (it did not finish): /retry finishes it, /discard drops it"


def _line_reader(stdin: TextIO, out: TextIO) -> Callable[[str], str]:
    """``input`` with readline editing and history on a terminal; a plain read otherwise.
    Raises EOFError at the end of input."""
    if stdin.isatty() and out.isatty():
        with contextlib.suppress(ImportError):  # not on every platform
            import readline  # noqa: F401  (importing it gives input() editing and history)
        return input

    def read(prompt: str) -> str:
        out.write(prompt)
        out.flush()
        line = stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    return read


@contextlib.contextmanager
def _ctrl_c_aborts(abort: Callable[[], object]) -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, lambda *_: abort())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Chat:
    def __init__(self, session: Session, out: TextIO) -> None:
        self.session = session
        self.out = out

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def note_pending(self) -> bool:
        note = pending_note(self.session)
        if note is not None:
            self.say(f"  ({note})")
        return note is not None

    def retry(self, *, quiet_if_none: bool = False) -> bool:
        """Finish the pending turn, printing its answer; False when it failed again."""
        if self.session.pending() is None:
            if not quiet_if_none:
                self.say("  (nothing is pending)")
            return True
        controller = AbortController()
        try:
            with _ctrl_c_aborts(lambda: controller.abort("Ctrl-C")):
                result = self.session.resume(signal=controller.signal)
        except Exception as exc:  # shown, and the chat goes on
            self.say(f"  error: {exc}")
            self.note_pending()
            return False
        if result is None:
            return True
        if result.finish_reason == "aborted":
            self.say("agent> [aborted: the pending turn is still pending]")
            return False
        self.say(f"agent> {result.text}")
        if result.finish_reason == "awaiting-approval":
            self.note_pending()
            return False
        return True

    def discard(self) -> None:
        if self.session.pending() is None:
            self.say("  (nothing is pending)")
            return
        self.session.discard_pending()
        self.say("  (the pending turn was dropped; the transcript is as it was)")

    def turn(self, text: str) -> None:
        pending = self.session.pending()
        if pending is not None:
            if pending.status == "awaiting-approval":
                self.note_pending()
                return
            self.say("  (finishing the pending turn first)")
            if not self.retry(quiet_if_none=True):
                self.say("  (your message was not sent)")
                return
        run = self.session.stream(text)
        failed: BaseException | None = None
        with _ctrl_c_aborts(lambda: run.abort("Ctrl-C")):
            self.out.write("agent> ")
            self.out.flush()
            for event in run:
                if isinstance(event, TextDelta):
                    self.out.write(event.text)
                    self.out.flush()
                elif isinstance(event, ToolCallStart):
                    self.out.write(f"[{event.call.name}] ")
                elif isinstance(event, RunDone) and event.finish_reason == "aborted":
                    self.out.write("[aborted: the transcript is unchanged]")
            self.out.write("\n")
            try:
                run.result()
            except Exception as exc:
                failed = exc
        if failed is not None:
            self.say(f"  error: {failed}")
            self.note_pending()

    def history(self) -> None:
        for m in self.session.messages:
            what = m.text or ", ".join(f"{c.name}()" for c in m.tool_calls)
            self.say(f"  {m.role}: {what}")
        self.note_pending()


def chat_loop(session: Session, stdin: TextIO, out: TextIO) -> int:
    """Run the chat until /exit, the end of input (0) or Ctrl-C at the prompt (130)."""
    chat = _Chat(session, out)
    read = _line_reader(stdin, out)
    pending = " and a pending turn" if session.pending() is not None else ""
    chat.say(f"lousho chat — session {session.id!r} ({len(session.messages)} messages"
             f"{pending}), {HELP}")
    chat.note_pending()
    commands: dict[str, Callable[[], Any]] = {
        "/history": chat.history,
        "/retry": chat.retry,
        "/discard": chat.discard,
    }
    while True:
        try:
            text = read("you> ").strip()
        except KeyboardInterrupt:
            out.write("\n")
            out.flush()
            return EXIT_INTERRUPTED
        except EOFError:
            out.write("\n")
            out.flush()
            return 0
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        try:
            if text in commands:
                commands[text]()
            elif text == "/clear":
                session.clear()
                chat.say("  (transcript cleared)")
            elif text == "/compact":
                before = len(session.messages)
                session.compact()
                chat.say(f"  (compacted {before} -> {len(session.messages)} messages)")
            elif text.startswith("/") and " " not in text:
                chat.say(f"  unknown command {text}: {HELP}")
            else:
                chat.turn(text)
        except KeyboardInterrupt:  # Ctrl-C between two turns' steps: back to the prompt
            chat.say("\n  (interrupted)")
        except Exception as exc:  # a store or session failure: shown, the chat goes on
            chat.say(f"  error: {exc}")
