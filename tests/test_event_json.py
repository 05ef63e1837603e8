"""event_to_dict: the stable JSON form of every run event, as a browser reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

import lousho_sync
from lousho_sync import (
    EVENT_JSON_VERSION,
    InvalidInputError,
    ProviderError,
    RunFailed,
    ScriptedProvider,
    Step,
    ToolCall,
    Usage,
    create_agent,
    event_to_dict,
    tool,
)
from lousho_sync.events import RunEvent, StepStart


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(needs_approval=True)
def wipe(path: str) -> str:
    """Delete a path (needs a human's yes)."""
    return "wiped " + path


def _events(provider: ScriptedProvider, text: str, tools: list[Any]) -> list[dict[str, Any]]:
    agent = create_agent(provider=provider, tools=tools)
    run = agent.session("s1").stream(text)
    # what a browser gets: the dict survives JSON as it is
    return [json.loads(json.dumps(event_to_dict(e))) for e in run]


def test_a_turn_with_a_tool_call_in_json() -> None:
    provider = ScriptedProvider([
        Step(tool_calls=(ToolCall("c1", "add", {"a": 2, "b": 3}),),
             usage=Usage(input_tokens=10, output_tokens=2)),
        Step(text="It is 5.", chunks=["It is ", "5."], usage=Usage(input_tokens=20,
                                                                      output_tokens=3)),
    ])
    dicts = _events(provider, "2+3?", [add])
    assert all(d["v"] == EVENT_JSON_VERSION == 1 for d in dicts)
    assert [d["seq"] for d in dicts] == list(range(len(dicts)))
    run_id = dicts[0]["run_id"]
    assert all(d["run_id"] == run_id for d in dicts)
    by_type = [d["type"] for d in dicts]
    assert by_type[0] == "run.start" and by_type[-1] == "run.done"
    start = dicts[0]
    assert start["session_id"] == "s1"
    assert start["input"] == [{"role": "user", "content": "2+3?"}]
    call = next(d for d in dicts if d["type"] == "tool.call")
    assert call["call"] == {"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}
    result = next(d for d in dicts if d["type"] == "tool.result")
    assert (result["call_id"], result["result"], result["is_error"]) == ("c1", "5", False)
    steps = [d["step"] for d in dicts if d["type"] == "step.start"]
    assert steps == [1, 2]
    assert "".join(d["text"] for d in dicts if d["type"] == "text.delta") == "It is 5."
    usage = [d for d in dicts if d["type"] == "usage"][-1]
    assert usage["usage"] == {"input_tokens": 20, "output_tokens": 3, "cost_usd": 0.0}
    assert usage["total"] == {"input_tokens": 30, "output_tokens": 5, "cost_usd": 0.0}
    done = dicts[-1]
    assert done["finish_reason"] == "stop"
    assert done["result"]["text"] == "It is 5."
    assert done["result"]["v"] == 1
    last = done["result"]["messages"][-1]
    assert (last["role"], last["content"]) == ("assistant", "It is 5.")


def test_an_approval_request_in_json() -> None:
    provider = ScriptedProvider([Step(tool_calls=(ToolCall("c9", "wipe", {"path": "/tmp/x"}),))])
    dicts = _events(provider, "clean up", [wipe])
    asked = next(d for d in dicts if d["type"] == "approval.requested")
    assert asked["call"] == {"id": "c9", "name": "wipe", "arguments": {"path": "/tmp/x"}}
    assert isinstance(asked["approval_id"], str) and asked["approval_id"]
    assert dicts[-1]["finish_reason"] == "awaiting-approval"


def test_a_failed_turn_names_the_error_without_a_traceback() -> None:
    provider = ScriptedProvider([Step(error=ProviderError("the model is down", status=503))])
    dicts = _events(provider, "hi", [])
    error = next(d for d in dicts if d["type"] == "error")
    assert error["error"] == {"type": "ProviderError", "code": "LOUSHO_PROVIDER_ERROR",
                              "message": error["error"]["message"]}
    assert "the model is down" in error["error"]["message"]
    assert "Traceback" not in json.dumps(dicts)
    assert dicts[-1] == {**dicts[-1], "type": "run.done", "finish_reason": "error",
                         "result": None}


def test_an_error_that_is_not_a_lousho_error_has_no_code() -> None:
    event = RunFailed(run_id="r", seq=3, error=KeyError("k"))
    assert event_to_dict(event)["error"] == {"type": "KeyError", "code": None,
                                             "message": "'k'"}


def test_a_field_added_to_an_event_class_is_written_by_kind() -> None:
    # a subclass stands for the fields later releases add (turn_id, a reset step, ...)
    @attrs.frozen(slots=True, kw_only=True)
    class StepAgain(StepStart):
        turn_id: str
        usage_so_far: Usage
        calls: tuple[ToolCall, ...]

    event = StepAgain(run_id="r", seq=7, step=2, turn_id="t1",
                      usage_so_far=Usage(output_tokens=4),
                      calls=(ToolCall("c", "add", {"a": 1}),))
    assert event_to_dict(event) == {
        "v": 1, "type": "step.start", "run_id": "r", "seq": 7, "step": 2, "turn_id": "t1",
        "usage_so_far": {"output_tokens": 4},
        "calls": [{"id": "c", "name": "add", "arguments": {"a": 1}}],
    }


def test_every_run_event_class_is_documented_with_its_json_fields() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "reference.md").read_text()
    section = text.split("## Events as JSON", 1)[1].split("\n## ", 1)[0]
    classes = [c for c in vars(lousho_sync.events).values()
               if isinstance(c, type) and issubclass(c, RunEvent) and c is not RunEvent]
    assert classes
    for cls in classes:
        row = next((line for line in section.splitlines()
                    if line.startswith(f"| `{cls.type}` |")), None)
        assert row is not None, f"{cls.type} has no row in 'Events as JSON'"
        for f in attrs.fields(cls):
            if f.name in ("run_id", "seq"):
                continue
            assert f"`{f.name}`" in row, f"{cls.type}: field {f.name} is not in its row"


def test_what_is_not_an_event_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="takes a lousho event, not a dict"):
        event_to_dict({"type": "text.delta"})  # type: ignore[arg-type]

    @attrs.frozen(slots=True, kw_only=True)
    class Odd(StepStart):
        thing: object

    with pytest.raises(InvalidInputError, match="'thing' holds a set"):
        event_to_dict(Odd(run_id="r", seq=0, step=1, thing={1}))
