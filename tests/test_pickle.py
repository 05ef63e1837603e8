"""Records and errors cross processes: pickle, copy.deepcopy, a real process hop, and the
public message_to_dict/result_to_dict (and from_dict) of messages and results.

Every public attrs record of ``lousho_sync`` and every ``LoushoError`` subclass found in the
package is enumerated, so a new one is covered (or the coverage test fails) automatically.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import multiprocessing
import pickle
import pkgutil
import typing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import attrs
import pytest

import lousho_aio
import lousho_sync
from lousho_sync import (
    ApprovalPage,
    ApprovalRecord,
    ApprovalRequested,
    Checkpoint,
    Compaction,
    CompactionDone,
    CompactionStart,
    ContextCleared,
    ExecutionResult,
    FilePart,
    ImagePart,
    InputApplied,
    InputQueued,
    Limits,
    Message,
    ModelDone,
    ModelRequest,
    ModelResponse,
    ModelTextDelta,
    ModelToolCallDelta,
    PendingTurn,
    Price,
    PruneResult,
    RunDone,
    RunEvent,
    RunFailed,
    RunStart,
    SessionAwaitingApprovalError,
    SessionEvent,
    SessionInfo,
    SessionPage,
    StepReset,
    StepStart,
    StoreCapabilities,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallStart,
    ToolResultEvent,
    TurnInfo,
    Usage,
    UsageEvent,
)
from lousho_sync.errors import LoushoError, StoreCorruptError
from lousho_sync.providers.base import ToolSpec

# Public attrs classes that are live handles, not records: they hold stores, functions,
# signals or gates, and are not meant to cross a process.
HANDLES = {"AgentStore", "Tool", "ToolContext", "Step"}

# Frozen records whose contents do not allow a hash (a caller's plain dict).
UNHASHABLE = {
    "ModelRequest": "ModelRequest.settings is the caller's plain dict",
    "ToolSpec": "ToolSpec.parameters is a plain JSON Schema dict",
}

CALL = ToolCall("call-1", "lookup", {"city": "Paris", "days": [1, 2], "opts": {"u": "c"}})
USAGE = Usage(input_tokens=12, output_tokens=5, cost_usd=0.25)
USER = Message("user", "hello", metadata={"k": "v"})
ASSISTANT = Message(
    "assistant",
    (TextPart("hi "), ImagePart(url="https://example.test/a.png"), FilePart(b"\x00\x01", "a/b")),
    tool_calls=(CALL,),
    usage=USAGE,
    extra={"future_field": {"nested": [1]}},
)
TOOL = Message("tool", "result", tool_call_id="call-1", is_error=True)
RESULT = ExecutionResult(
    text="hi", finish_reason="awaiting-approval", messages=(USER, ASSISTANT, TOOL),
    usage=USAGE, steps=2, run_id="run-1", approval_id="ap-1", approval_ids=("ap-1", "ap-2"),
    exceeded=None,
)
INFO = SessionInfo(id="s-1", messages=3, created_at=1.5, updated_at=2.5,
                   metadata={"title": "t", "tags": ["a"]})
ERROR = SessionAwaitingApprovalError("waiting", approval_id="ap-1", session_id="s-1")

SAMPLES: dict[str, Any] = {
    "TextPart": TextPart("t"),
    "ImagePart": ImagePart(data=b"\x89PNG", media_type="image/png"),
    "FilePart": FilePart(b"data", "text/plain", name="f.txt"),
    "ToolCall": CALL,
    "Usage": USAGE,
    "Message": ASSISTANT,
    "ExecutionResult": RESULT,
    "PendingTurn": PendingTurn("awaiting-approval", "ap-1"),
    "PruneResult": PruneResult(1, 2, 3),
    "StoreCapabilities": StoreCapabilities(lease=True, fencing=True, mailbox=True),
    "Checkpoint": Checkpoint(
        key="k", session_id="s-1", run_id="run-1", turn_index=3, input=(USER,),
        recorded=(ASSISTANT, TOOL), started_call_ids=("call-1",), queued_inputs=(USER,),
        pending_approval_ids=("ap-1",), usage=USAGE, status="awaiting-approval",
        extra={"newer": 1},
    ),
    "ApprovalRecord": ApprovalRecord(
        id="ap-1", session_id="s-1", checkpoint_key="k", call=CALL, status="denied",
        reason="no", resolved_at=2.5, extra={"newer": [1]},
    ),
    "Limits": Limits(max_steps=3, max_cost_usd=1.5),
    "Price": Price(input_per_mtok=1.0, output_per_mtok=2.0),
    "Compaction": Compaction(max_input_tokens=1000, keep_last=4, instructions="short"),
    "RunEvent": RunEvent(run_id="run-1", seq=0),
    "RunStart": RunStart(run_id="run-1", seq=0, session_id="s-1", input=(USER,)),
    "StepStart": StepStart(run_id="run-1", seq=1, step=1),
    "StepReset": StepReset(run_id="run-1", seq=7, step=2),
    "TurnInfo": TurnInfo(turn_id="t1", status="running", started_at=1.5, last_seq=3,
                         owner="host:1:abc"),
    "TextDelta": TextDelta(run_id="run-1", seq=2, text="hi"),
    "ToolCallStart": ToolCallStart(run_id="run-1", seq=3, call=CALL),
    "ToolResultEvent": ToolResultEvent(run_id="run-1", seq=4, call_id="c", result="r",
                                       is_error=False),
    "ApprovalRequested": ApprovalRequested(run_id="run-1", seq=5, approval_id="a", call=CALL),
    "InputQueued": InputQueued(run_id="run-1", seq=6, input=(USER,)),
    "InputApplied": InputApplied(run_id="run-1", seq=7, input=(USER,)),
    "UsageEvent": UsageEvent(run_id="run-1", seq=8, usage=USAGE, total=USAGE + USAGE),
    "RunFailed": RunFailed(run_id="run-1", seq=9, error=ERROR),
    "RunDone": RunDone(run_id="run-1", seq=10, finish_reason="stop", result=RESULT),
    "SessionEvent": SessionEvent(session_id="s-1", seq=0),
    "CompactionStart": CompactionStart(session_id="s-1", seq=1, messages_before=9),
    "CompactionDone": CompactionDone(session_id="s-1", seq=2, messages_before=9,
                                     messages_after=3),
    "ContextCleared": ContextCleared(session_id="s-1", seq=3),
    "ToolSpec": ToolSpec("lookup", "Look up.", {"type": "object", "properties": {}}),
    "ModelRequest": ModelRequest(system="sys", messages=(USER,), tools=(), settings={"t": 1}),
    "ModelResponse": ModelResponse(message=ASSISTANT, finish_reason="tool_calls", model="m"),
    "ModelTextDelta": ModelTextDelta("x"),
    "ModelToolCallDelta": ModelToolCallDelta(0, "c", "lookup", '{"a"'),
    "SessionInfo": INFO,
    "SessionPage": SessionPage(items=(INFO, SessionInfo(id="s-2", messages=0, created_at=1.0,
                                                        updated_at=1.0)), next="cur"),
    "ModelDone": ModelDone(ModelResponse(message=ASSISTANT, finish_reason="stop")),
    "ApprovalPage": ApprovalPage(items=(ApprovalRecord(
        id="ap-1", session_id="s-1", checkpoint_key="s-1.turn-0", call=ToolCall("c", "pay", {}),
        expires_at=9.0, resolved_by="alice"),), next_cursor="cur"),
}


def public_records() -> list[str]:
    names = set()
    for module in (lousho_sync, lousho_aio):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and attrs.has(obj) and name not in HANDLES:
                names.add(name)
    return sorted(names)


def _import_all() -> None:
    for package in (lousho_sync, lousho_aio):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith(("__main__", ".demo")):
                continue
            importlib.import_module(info.name)


def error_classes() -> list[type[LoushoError]]:
    _import_all()
    seen: list[type[LoushoError]] = [LoushoError]
    stack = [LoushoError]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen.append(sub)
                stack.append(sub)
    return seen


def _sample_value(name: str, annotation: object) -> object:
    args = typing.get_args(annotation) or (annotation,)
    if bool in args:
        return True
    if int in args:
        return 7
    return f"{name}-value"


def make_error(cls: type[LoushoError]) -> tuple[LoushoError, dict[str, object]]:
    """An instance of ``cls`` with every keyword-only field set to a non-default value."""
    hints = typing.get_type_hints(cls.__init__)
    fields = {
        p.name: _sample_value(p.name, hints.get(p.name, object))
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    return cls(f"{cls.__name__} happened", **fields), fields


def assert_same_error(copy_: BaseException, original: LoushoError, fields: dict[str, object]
                      ) -> None:
    assert type(copy_) is type(original)
    assert isinstance(copy_, LoushoError)
    assert copy_.code == original.code
    assert str(copy_) == str(original)
    assert copy_.args == original.args
    for name, value in fields.items():
        assert getattr(copy_, name) == value, name


def via_pickle(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def test_every_public_record_has_a_sample() -> None:
    missing = [n for n in public_records() if n not in SAMPLES]
    assert not missing, f"add a sample for the new public record(s) {missing}"


@pytest.mark.parametrize("name", public_records())
@pytest.mark.parametrize("how", ["pickle", "pickle-0", "deepcopy", "copy"])
def test_record_round_trips_to_an_equal_object(name: str, how: str) -> None:
    obj = SAMPLES[name]
    assert type(obj).__name__ == name
    if how == "pickle":
        back = via_pickle(obj)
    elif how == "pickle-0":
        back = pickle.loads(pickle.dumps(obj, protocol=0))
    elif how == "deepcopy":
        back = copy.deepcopy(obj)
    else:
        back = copy.copy(obj)
    assert type(back) is type(obj)
    assert back == obj
    assert repr(back) == repr(obj)


def _is_frozen(obj: Any) -> bool:
    try:
        object.__getattribute__(obj, "__setattr__")(attrs.fields(type(obj))[0].name, None)
    except attrs.exceptions.FrozenInstanceError:
        return True
    return False


@pytest.mark.parametrize("name", public_records())
def test_frozen_records_are_hashable_and_copies_hash_alike(name: str) -> None:
    obj = SAMPLES[name]
    if not _is_frozen(obj):
        pytest.skip(f"{name} is mutable")
    if name in UNHASHABLE:
        pytest.skip(UNHASHABLE[name])
    assert hash(via_pickle(obj)) == hash(obj)
    assert hash(copy.deepcopy(obj)) == hash(obj)
    assert len({obj, copy.deepcopy(obj)}) == 1


def test_deepcopy_does_not_share_nested_arguments() -> None:
    back = copy.deepcopy(CALL)
    assert back.arguments["days"] == [1, 2]
    assert back.arguments["days"] is not CALL.arguments["days"]
    with pytest.raises(TypeError):
        back.arguments["city"] = "Rome"  # type: ignore[index]


def test_the_error_classes_are_all_found() -> None:
    names = {cls.__name__ for cls in error_classes()}
    assert {"SessionAwaitingApprovalError", "StoreConflictError", "LeaseLostError",
            "ApprovalNotFoundError", "RateLimitedError"} <= names


@pytest.mark.parametrize("cls", error_classes(), ids=lambda c: c.__name__)
def test_every_error_unpickles_with_its_code_and_fields(cls: type[LoushoError]) -> None:
    error, fields = make_error(cls)
    assert_same_error(via_pickle(error), error, fields)
    assert_same_error(copy.deepcopy(error), error, fields)
    assert_same_error(pickle.loads(pickle.dumps(error, protocol=0)), error, fields)


def test_an_error_keeps_its_notes_across_pickle() -> None:
    error = SessionAwaitingApprovalError("w", approval_id="a")
    error.add_note("while resuming")
    assert via_pickle(error).__notes__ == ["while resuming"]


def _spawn_pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def test_records_cross_a_real_process() -> None:
    names = public_records()
    with _spawn_pool() as pool:
        # copy.copy runs in the child: the object is unpickled there and pickled back.
        back = list(pool.map(copy.copy, [SAMPLES[n] for n in names], timeout=120))
    for name, obj in zip(names, back, strict=True):
        assert type(obj).__name__ == name
        assert obj == SAMPLES[name], name


def test_errors_cross_a_real_process() -> None:
    made = [make_error(cls) for cls in error_classes()]
    with _spawn_pool() as pool:
        back = list(pool.map(copy.copy, [e for e, _ in made], timeout=120))
    for (error, fields), copy_ in zip(made, back, strict=True):
        assert_same_error(copy_, error, fields)


def test_an_error_raised_in_a_child_process_reaches_the_parent() -> None:
    with _spawn_pool() as pool:
        future = pool.submit(
            exec,
            "from lousho_sync.errors import SessionAwaitingApprovalError as E\n"
            "raise E('paused', approval_id='ap-9', session_id='s-9')",
        )
        with pytest.raises(SessionAwaitingApprovalError) as info:
            future.result(timeout=120)
    assert info.value.approval_id == "ap-9"
    assert info.value.session_id == "s-9"
    assert info.value.code == "LOUSHO_SESSION_AWAITING_APPROVAL"


# --- to_dict / from_dict -------------------------------------------------------------------


@pytest.mark.parametrize("message", [USER, ASSISTANT, TOOL], ids=["user", "assistant", "tool"])
def test_message_to_dict_round_trips(message: Message) -> None:
    d = lousho_sync.message_to_dict(message)
    assert lousho_sync.message_from_dict(d) == message
    assert lousho_sync.message_from_dict(via_pickle(d)) == message


def test_message_to_dict_is_the_stores_format() -> None:
    assert lousho_sync.message_to_dict(USER) == {
        "role": "user", "content": "hello", "metadata": {"k": "v"}}
    d = lousho_sync.message_to_dict(ASSISTANT)
    assert d["tool_calls"] == [
        {"id": "call-1", "name": "lookup",
         "arguments": {"city": "Paris", "days": [1, 2], "opts": {"u": "c"}}}
    ]
    assert d["future_field"] == {"nested": [1]}  # unknown fields kept


def test_result_to_dict_round_trips() -> None:
    d = lousho_sync.result_to_dict(RESULT)
    assert d["v"] == 1
    assert d["messages"] == [lousho_sync.message_to_dict(m) for m in RESULT.messages]
    assert d["approval_ids"] == ["ap-1", "ap-2"]
    assert "exceeded" not in d
    assert lousho_sync.result_from_dict(d) == RESULT
    plain = ExecutionResult(text="", finish_reason="stop", messages=(), usage=Usage(),
                            steps=1, run_id="r")
    assert lousho_sync.result_from_dict(lousho_sync.result_to_dict(plain)) == plain


def test_result_from_dict_names_a_bad_field() -> None:
    d = lousho_sync.result_to_dict(RESULT)
    d["steps"] = "two"
    with pytest.raises(StoreCorruptError, match="result 'steps'"):
        lousho_sync.result_from_dict(d)
    with pytest.raises(StoreCorruptError, match="newer"):
        lousho_sync.result_from_dict({**lousho_sync.result_to_dict(RESULT), "v": 99})
