"""The AI SDK's UI message stream protocol, read by the ``ai`` npm package's own reader.

A real HTTP server on 127.0.0.1 serves ``ui_message_frames`` of real (scripted) turns; a
Node script (tests/node/read_ui_stream.mjs) fetches it and reads it with ``ai``'s
``parseJsonEventStream`` + ``uiMessageChunkSchema`` + ``readUIMessageStream``, as
``useChat`` does, and prints every chunk and the final assistant message. ``ai`` is
installed with ``npm ci`` from tests/node/package-lock.json into tests/node/node_modules.
Without Node the tests are skipped with the reason, except under CI (``CI`` set), where
they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from lousho_sync import ScriptedProvider, Step, ToolCall, Usage, create_agent, tool
from lousho_sync.events import RunDone, RunEvent, RunStart, StepStart, TextDelta
from lousho_sync.sse import UI_MESSAGE_STREAM_HEADERS, ui_message_frames

NODE_DIR = Path(__file__).parent / "node"
_install_lock = threading.Lock()
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _no_node(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI needs Node for the UI message stream tests: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary, with ``ai`` installed from the lock file."""
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if node_bin is None or npm_bin is None:
        _no_node("node and npm are not installed (Debian: apt-get install nodejs npm)")
    assert node_bin is not None and npm_bin is not None
    lock = json.loads((NODE_DIR / "package-lock.json").read_text())
    wanted = lock["packages"]["node_modules/ai"]["version"]
    installed = NODE_DIR / "node_modules" / "ai" / "package.json"
    # one install at a time: in this process, and in the suite's other worker processes
    with _install_lock, FileLock(os.path.join(tempfile.gettempdir(), "lousho-test-npm.lock")):
        if not installed.exists() or json.loads(installed.read_text())["version"] != wanted:
            done = subprocess.run([npm_bin, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                _no_node(f"npm ci could not install ai {wanted}: {done.stderr[-2000:]}")
    return node_bin


class _Server:
    """Serves ``routes[path]()`` (an iterable of frames) with the given headers."""

    def __init__(self) -> None:
        self.routes: dict[str, Callable[[], Iterable[str]]] = {}
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True  # each frame leaves at once
            def do_GET(self) -> None:
                frames = routes.get(self.path)
                if frames is None:
                    self.send_response(204)
                    self.end_headers()
                    return
                self.send_response(200)
                for name, value in UI_MESSAGE_STREAM_HEADERS.items():
                    self.send_header(name, value)
                self.end_headers()
                for frame in frames():
                    self.wfile.write(frame.encode())
                    self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=30)


@pytest.fixture
def frame_server() -> Iterator[_Server]:
    s = _Server()
    try:
        yield s
    finally:
        s.close()


def read(node: str, url: str) -> dict[str, Any]:
    done = subprocess.run([node, str(NODE_DIR / "read_ui_stream.mjs"), url], cwd=NODE_DIR,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(needs_approval=True)
def wipe(path: str) -> str:
    """Delete a path (needs a human's yes)."""
    return "wiped " + path


def _turn(script: list[Any], text: str, tools: list[Any]) -> Callable[[], Iterable[str]]:
    def frames() -> Iterable[str]:
        agent = create_agent(provider=ScriptedProvider(script), tools=tools)
        return ui_message_frames(agent.session("s1").stream(text), heartbeat_s=5.0)
    return frames


def test_a_turn_with_a_tool_call_reads_as_one_assistant_message(
    node: str, frame_server: _Server
) -> None:
    frame_server.routes["/chat"] = _turn([
        Step(tool_calls=(ToolCall("c1", "add", {"a": 2, "b": 3}),),
             usage=Usage(input_tokens=10, output_tokens=2)),
        Step(text="It is 5.", chunks=["It is ", "5."]),
    ], "2+3?", [add])
    seen = read(node, frame_server.url + "/chat")
    assert seen["status"] == 200 and seen["errors"] == []
    assert seen["headers"]["x-vercel-ai-ui-message-stream"] == "v1"
    assert seen["headers"]["content-type"].startswith("text/event-stream")
    types = [c["type"] for c in seen["chunks"]]
    assert types[0] == "start" and types[-1] == "finish"
    assert types.count("start-step") == types.count("finish-step") == 2
    message = seen["message"]
    assert message["role"] == "assistant" and message["id"] == seen["chunks"][0]["messageId"]
    parts = [p for p in message["parts"] if p["type"] != "step-start"]
    assert parts[0]["type"] == "tool-add"
    assert (parts[0]["toolCallId"], parts[0]["state"], parts[0]["input"], parts[0]["output"]) \
        == ("c1", "output-available", {"a": 2, "b": 3}, "5")
    assert [(p["type"], p["text"]) for p in parts[1:]] == [("text", "It is 5.")]
    assert message["metadata"]["finishReason"] == "stop"
    assert seen["chunks"][-1]["finishReason"] == "stop"


def test_an_approval_request_reads_as_a_tool_waiting_for_approval(
    node: str, frame_server: _Server
) -> None:
    frame_server.routes["/chat"] = _turn(
        [Step(tool_calls=(ToolCall("c9", "wipe", {"path": "/tmp/x"}),))], "clean up", [wipe])
    seen = read(node, frame_server.url + "/chat")
    assert seen["errors"] == []
    tool_part = next(p for p in seen["message"]["parts"] if p["type"] == "tool-wipe")
    assert tool_part["state"] == "approval-requested"
    assert tool_part["input"] == {"path": "/tmp/x"}
    request = next(c for c in seen["chunks"] if c["type"] == "tool-approval-request")
    assert tool_part["approval"]["id"] == request["approvalId"] and request["approvalId"]
    assert seen["message"]["metadata"]["finishReason"] == "awaiting-approval"
    assert seen["chunks"][-1] == {**seen["chunks"][-1], "type": "finish",
                                  "finishReason": "other"}


def test_a_failed_turn_reads_as_an_error(node: str, frame_server: _Server) -> None:
    from lousho_sync import ProviderError

    frame_server.routes["/chat"] = _turn(
        [Step(error=ProviderError("the model is down", status=503))], "hi", [])
    seen = read(node, frame_server.url + "/chat")
    assert len(seen["errors"]) == 1 and "the model is down" in seen["errors"][0]
    assert seen["chunks"][-1]["finishReason"] == "error"


def test_a_step_reset_is_a_data_part_after_which_the_step_is_made_again(
    node: str, frame_server: _Server
) -> None:
    class StepReset(StepStart):  # the event a taken-over turn sends first
        type = "step.reset"  # type: ignore[assignment]

    def events() -> Iterator[RunEvent]:
        yield RunStart(run_id="t1", seq=0, session_id="s1", input=())
        yield StepStart(run_id="t1", seq=1, step=1)
        yield TextDelta(run_id="t1", seq=2, text="half an ans")
        yield StepReset(run_id="t1", seq=3, step=1)
        yield StepStart(run_id="t1", seq=4, step=1)
        yield TextDelta(run_id="t1", seq=5, text="the whole answer")
        yield RunDone(run_id="t1", seq=6, finish_reason="stop", result=None)

    frame_server.routes["/chat"] = lambda: ui_message_frames(events(), heartbeat_s=None)
    seen = read(node, frame_server.url + "/chat")
    assert seen["errors"] == []
    kinds = [p["type"] for p in seen["message"]["parts"]]
    assert kinds == ["step-start", "text", "data-step-reset", "step-start", "text"]
    parts = seen["message"]["parts"]
    assert parts[2]["data"] == {"step": 1}
    # what a front end shows: the text parts after the last data-step-reset
    assert parts[-1]["text"] == "the whole answer"


def test_the_aio_twin_yields_the_same_parts() -> None:
    import asyncio

    import lousho_aio
    from lousho_aio.sse import ui_message_frames as async_frames

    script = [Step(tool_calls=(ToolCall("c1", "add", {"a": 2, "b": 3}),)),
              Step(text="It is 5.", chunks=["It is ", "5."])]

    def parts(frames: list[str], turn_id: str) -> list[Any]:
        text = "".join(frames).replace(turn_id, "TURN")
        return [json.loads(b[len("data: "):]) if b != "data: [DONE]" else "DONE"
                for b in text.split("\n\n") if b]

    sync_run = create_agent(provider=ScriptedProvider(script), tools=[add]).session(
        "s1").stream("2+3?")
    expected = parts(list(ui_message_frames(sync_run, heartbeat_s=None)), sync_run.run_id)

    async def main() -> tuple[list[str], str]:
        agent = lousho_aio.create_agent(provider=ScriptedProvider(script), tools=[add])
        run = agent.session("s1").stream("2+3?")
        return [f async for f in async_frames(run, heartbeat_s=5.0)], run.run_id

    frames, run_id = asyncio.run(main())
    assert parts(frames, run_id) == expected
    assert expected[-1] == "DONE" and expected[0]["messageId"] == "TURN"


def test_a_started_turn_read_again_from_its_start_reads_whole(
    node: str, frame_server: _Server, tmp_path: Path
) -> None:
    # useChat's resume: the reloaded page has no part of the answer; the endpoint streams
    # the session's turn from its start with ui_message_stream
    from lousho_sync.sqlite import SqliteStore
    from lousho_sync.sse import ui_message_stream

    agent = create_agent(provider=ScriptedProvider([
        Step(tool_calls=(ToolCall("c1", "add", {"a": 2, "b": 3}),)),
        Step(text="It is 5.", chunks=["It is ", "5."])]), tools=[add],
        store=SqliteStore(tmp_path / "agent.db"))
    session = agent.session("s1")
    run = session.start("2+3?")
    frame_server.routes["/api/chat/s1/stream"] = lambda: ui_message_stream(session, heartbeat_s=5.0)
    seen = read(node, frame_server.url + "/api/chat/s1/stream")
    assert seen["errors"] == [] and seen["message"]["id"] == run.turn_id
    texts = [p["text"] for p in seen["message"]["parts"] if p["type"] == "text"]
    assert texts == [session.messages[-1].text] == ["It is 5."]
    tool_part = next(p for p in seen["message"]["parts"] if p["type"] == "tool-add")
    assert tool_part["output"] == "5"
