"""``lousho chat``: a streaming chat on one durable session.

A pending turn (a crash, or a failure that left work to finish) is shown on start and after
each failure; ``/retry`` finishes it and prints its answer, ``/discard`` drops it. Ctrl-C
during a turn aborts the turn; at the prompt it ends the chat (exit code 130). When stdin is
a terminal, the prompt has line editing and history (the standard ``readline`` module).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from .compaction import SUMMARY_INSTRUCTIONS
from .errors import ProviderError
from .events import RunDone, TextDelta, ToolCallStart
from .providers.base import ModelRequest
from .providers.scripted import ScriptedProvider, Step
from .session import Session
from .signal import AbortController

__all__ = ["EXIT_INTERRUPTED", "ChatEnded", "chat_loop", "pending_note", "scripted_model"]

EXIT_INTERRUPTED = 130
HELP = "/history /retry /discard /clear /compact /exit; Ctrl-C aborts a turn"


class ChatEnded(Exception):
    """A failure that ends the chat (exit code 1), such as an API key the provider refused;
    the message is one line with a hint."""


def _refused_key(exc: BaseException, session: Session) -> ChatEnded | None:
    """ChatEnded when ``exc`` is the provider refusing the API key (HTTP 401): every later
    turn would fail the same way."""
    if not isinstance(exc, ProviderError) or exc.status != 401:
        return None
    name = exc.provider or "the provider"
    variable = f"{exc.provider.upper()}_API_KEY" if exc.provider else "the API key variable"
    kept = ("its turn is pending: /retry it once the key is fixed" if session.pending()
            else "the transcript is as it was")
    return ChatEnded(f"{name} refused the API key (HTTP 401): check {variable} (or chat "
                     f"offline with --model scripted); {kept}")


def _scripted_answer(request: ModelRequest) -> Step:
    """The offline model of ``--model scripted``: it says what it got, streamed word by word;
    asked to compact, it writes a short summary."""
    if (request.system or "").startswith(SUMMARY_INSTRUCTIONS):
        users = sum(1 for m in request.messages if m.role == "user")
        return Step(text=f"The user sent {users} message(s) to a scripted model.")
    last = list(request.messages)[-1].text if request.messages else ""
    words = f"(scripted) You said: {last}".split(" ")
    return Step(chunks=[w + " " for w in words[:-1]] + words[-1:])


def scripted_model() -> ScriptedProvider:
    """The provider of ``lousho chat --model scripted``: offline, no key, no network."""
    return ScriptedProvider(default=_scripted_answer)


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


class _CtrlC:
    """Where Ctrl-C goes: during a turn it calls the turn's abort; at the prompt it raises
    KeyboardInterrupt in the main thread.

    On POSIX, SIGINT stays blocked in the main thread (and so in every thread started
    later, such as the lease heartbeat) and a watcher thread takes it with ``sigwait``. At
    the prompt the watcher wakes the main thread with SIGUSR1 until it has taken the
    interrupt: a signal that lands just before readline blocks in ``select`` would
    otherwise wait for the next key press.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # also taken by the handler, in the main thread
        self._abort: Callable[[], object] | None = None
        self._reading = False
        self._interrupted = False
        self._taken = threading.Event()
        self._main = threading.get_ident()
        self._posix = all(hasattr(signal, n) for n in ("pthread_sigmask", "sigwait",
                                                        "pthread_kill", "SIGUSR1"))
        if self._posix:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            signal.signal(signal.SIGUSR1, self._on_wake)
            threading.Thread(target=self._watch, name="lousho-chat-ctrl-c", daemon=True).start()

    def _watch(self) -> None:
        while True:
            signal.sigwait({signal.SIGINT})
            with self._lock:
                abort = self._abort
                if abort is None:
                    self._interrupted = True
                    self._taken.clear()
            if abort is not None:
                abort()
                continue
            while not self._taken.is_set():  # wake the prompt until it takes the interrupt
                with self._lock:
                    reading = self._reading
                if reading:
                    signal.pthread_kill(self._main, signal.SIGUSR1)
                self._taken.wait(0.05)

    def _take(self) -> None:
        self._interrupted = False
        self._taken.set()
        raise KeyboardInterrupt

    def _on_wake(self, signum: int, frame: object) -> None:
        with self._lock:
            if self._reading and self._interrupted:
                self._take()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Around the prompt: Ctrl-C (also one pressed since the last prompt) raises
        KeyboardInterrupt."""
        if not self._posix:
            yield
            return
        with self._lock:
            if self._interrupted:
                self._take()
            self._reading = True
        try:
            yield
        finally:
            with self._lock:
                self._reading = False

    @contextlib.contextmanager
    def aborting(self, abort: Callable[[], object]) -> Iterator[None]:
        """Around a turn: Ctrl-C calls ``abort``."""
        if not self._posix:
            previous = signal.signal(signal.SIGINT, lambda *_: abort())
            try:
                yield
            finally:
                signal.signal(signal.SIGINT, previous)
            return
        with self._lock:
            self._abort = abort
        try:
            yield
        finally:
            with self._lock:
                self._abort = None


class _Chat:
    def __init__(self, session: Session, out: TextIO, ctrl_c: _CtrlC) -> None:
        self.session = session
        self.out = out
        self.ctrl_c = ctrl_c

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
            with self.ctrl_c.aborting(lambda: controller.abort("Ctrl-C")):
                result = self.session.resume(signal=controller.signal)
        except Exception as exc:  # shown, and the chat goes on
            ended = _refused_key(exc, self.session)
            if ended is not None:
                raise ended from exc
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
        with self.ctrl_c.aborting(lambda: run.abort("Ctrl-C")):
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
            ended = _refused_key(failed, self.session)
            if ended is not None:
                raise ended from failed
            self.say(f"  error: {failed}")
            if not self.note_pending():
                self.say("  (nothing of this turn was kept: the transcript is as it was)")

    def history(self) -> None:
        for m in self.session.messages:
            what = m.text or ", ".join(f"{c.name}()" for c in m.tool_calls)
            self.say(f"  {m.role}: {what}")
        self.note_pending()


def chat_loop(session: Session, stdin: TextIO, out: TextIO) -> int:
    """Run the chat until /exit, the end of input (0) or Ctrl-C at the prompt (130)."""
    ctrl_c = _CtrlC()
    chat = _Chat(session, out, ctrl_c)
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
            with ctrl_c.reading():
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
                if session.compact():
                    chat.say(f"  (compacted {before} -> {len(session.messages)} messages)")
                else:
                    chat.say(f"  (nothing was compacted: {before} messages, and compaction "
                             "keeps the last 8)")
            elif text.startswith("/") and " " not in text:
                chat.say(f"  unknown command {text}: {HELP}")
            else:
                chat.turn(text)
        except KeyboardInterrupt:  # Ctrl-C between two turns' steps: back to the prompt
            chat.say("\n  (interrupted)")
        except (ChatEnded, BrokenPipeError):
            raise
        except Exception as exc:  # a store or session failure: shown, the chat goes on
            chat.say(f"  error: {exc}")
