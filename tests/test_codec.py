"""The JSON codec: stable compact form, round trips, unknown fields kept, bad input refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lousho_sync.codec import (
    FORMAT_VERSION,
    dumps_approval,
    dumps_checkpoint,
    dumps_message,
    dumps_messages,
    loads_approval,
    loads_checkpoint,
    loads_message,
    loads_message_texts,
    loads_messages,
    message_from_dict,
    message_to_dict,
)
from lousho_sync.errors import InvalidInputError, StoreCorruptError
from lousho_sync.messages import FilePart, ImagePart, Message, TextPart, ToolCall, Usage
from lousho_sync.stores.base import ApprovalRecord, Checkpoint

ALL_BYTES = bytes(range(256)) * 3


def roundtrip(m: Message) -> Message:
    """Through the dict, one-message JSON and the document; all must agree."""
    via_dict = message_from_dict(json.loads(json.dumps(message_to_dict(m))))
    via_json = loads_message(dumps_message(m))
    via_doc = loads_messages(dumps_messages([m]))
    assert via_dict == via_json == via_doc[0]
    assert len(via_doc) == 1
    return via_json


# --- the form ---------------------------------------------------------------------------


def test_text_message_is_compact_and_omits_defaults() -> None:
    m = Message("user", "hello")
    assert dumps_message(m) == '{"role":"user","content":"hello"}'
    assert roundtrip(m) == m


def test_assistant_with_tool_calls_and_usage() -> None:
    m = Message(
        "assistant",
        "",
        (ToolCall("call_1", "add", {"a": 1, "b": [2, 3]}), ToolCall("call_2", "now")),
        usage=Usage(10, 20, 0.0125),
    )
    assert message_to_dict(m) == {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "name": "add", "arguments": {"a": 1, "b": [2, 3]}},
            {"id": "call_2", "name": "now", "arguments": {}},
        ],
        "usage": {"input_tokens": 10, "output_tokens": 20, "cost_usd": 0.0125},
    }
    back = roundtrip(m)
    assert back == m
    assert back.tool_calls[0].arguments == {"a": 1, "b": [2, 3]}


def test_usage_without_cost_has_no_cost_key() -> None:
    m = Message("assistant", "hi", usage=Usage(3, 4))
    assert message_to_dict(m)["usage"] == {"input_tokens": 3, "output_tokens": 4}
    back = roundtrip(m)
    assert back.usage == Usage(3, 4) and back.usage.cost_usd is None


@pytest.mark.parametrize("is_error", [True, False])
def test_tool_result(is_error: bool) -> None:
    m = Message("tool", "division by zero", tool_call_id="call_1", is_error=is_error)
    d = message_to_dict(m)
    assert d["tool_call_id"] == "call_1"
    assert ("is_error" in d) is is_error
    back = roundtrip(m)
    assert back == m
    assert back.is_error is is_error


def test_metadata_round_trips_and_is_omitted_when_empty() -> None:
    m = Message("user", "x", metadata={"source": "cli", "tags": ["a", "b"], "n": {"k": None}})
    assert roundtrip(m) == m
    assert "metadata" not in message_to_dict(Message("user", "x"))


def test_parts_round_trip_byte_for_byte() -> None:
    m = Message(
        "user",
        (
            TextPart("look at this"),
            ImagePart(data=ALL_BYTES, media_type="image/jpeg"),
            ImagePart(url="https://example.com/cat.png"),
            FilePart(ALL_BYTES[::-1], "application/pdf", name="report.pdf"),
            FilePart(b"", "text/plain"),
        ),
    )
    back = roundtrip(m)
    assert back == m
    assert isinstance(back.content, tuple)
    image = back.content[1]
    assert isinstance(image, ImagePart)
    assert image.data == ALL_BYTES and image.url is None and image.media_type == "image/jpeg"
    url_image = back.content[2]
    assert isinstance(url_image, ImagePart)
    assert url_image.url == "https://example.com/cat.png" and url_image.data is None
    file = back.content[3]
    assert isinstance(file, FilePart) and file.data == ALL_BYTES[::-1]
    assert file.name == "report.pdf"
    d = message_to_dict(m)
    assert [p["type"] for p in d["content"]] == ["text", "image", "image", "file", "file"]
    assert "name" not in d["content"][4]


def test_output_is_ascii_and_any_string_of_characters_round_trips() -> None:
    m = Message("user", "café ✓ 日本 \U0001f600 \x00")
    s = dumps_message(m)
    assert s.isascii()
    assert loads_message(s) == m
    assert loads_message(s.encode()) == m


@pytest.mark.parametrize("text", ["\ud800", "a \ud83d\ude00 pair", "\udfff"])
def test_a_surrogate_code_point_is_refused_not_changed(text: str) -> None:
    # JSON would give a surrogate pair back as one character: refused on dump
    with pytest.raises(InvalidInputError, match="surrogate code point U\\+D"):
        dumps_message(Message("user", text))
    with pytest.raises(InvalidInputError, match="surrogate code point"):
        dumps_message(Message("user", "x", metadata={"k": [text]}))


def test_metadata_that_is_not_json_is_refused_on_dump() -> None:
    with pytest.raises(InvalidInputError, match="JSON"):
        dumps_message(Message("user", "x", metadata={"when": object()}))


# --- hypothesis -------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(alphabet=st.characters(codec="utf-8")),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
# Any str of Unicode characters (a surrogate code point is refused: test_store_strings.py).
any_text = st.text(alphabet=st.characters(categories=None, codec="utf-8"))
parts = st.one_of(
    st.builds(TextPart, any_text),
    st.builds(ImagePart, data=st.binary(), media_type=st.text()),
    st.builds(ImagePart, url=any_text, media_type=st.text()),
    st.builds(FilePart, st.binary(), st.text(), st.none() | st.text()),
)
usages = st.builds(
    Usage,
    st.integers(min_value=0),
    st.integers(min_value=0),
    st.none() | st.floats(allow_nan=False),
)
messages = st.builds(
    Message,
    st.sampled_from(["user", "assistant", "tool"]),
    any_text | st.lists(parts, max_size=4).map(tuple),
    st.lists(st.builds(ToolCall, st.text(), st.text(), json_objects), max_size=3).map(tuple),
    st.none() | st.text(),
    st.booleans(),
    st.none() | usages,
    json_objects,
)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_any_message_round_trips(m: Message) -> None:
    assert roundtrip(m) == m
    assert dumps_message(loads_message(dumps_message(m))) == dumps_message(m)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_a_loaded_message_is_a_message_like_any_other(m: Message) -> None:
    """Loading builds messages without Message(...): each one still equals, hashes, prints,
    pickles and refuses changes exactly as the one the constructor made."""
    import pickle

    import attrs

    loaded = loads_message_texts([dumps_message(m)] * 2)
    assert loaded == [m, m] and loaded[0] is not loaded[1]
    one = loaded[0]
    assert type(one) is Message and hash(one) == hash(m) and repr(one) == repr(m)
    assert pickle.loads(pickle.dumps(one)) == m
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        one.content = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError):
        one.metadata["k"] = 1  # type: ignore[index]
    assert attrs.evolve(one, content="x") == attrs.evolve(m, content="x")


def test_loading_many_messages_refuses_any_unreadable_one() -> None:
    good = dumps_message(Message("user", "a"))
    assert loads_message_texts([]) == []
    for bad in ("{", '{"role":"user"} trailing', '{"role":["user"],"content":"x"}', "[]"):
        with pytest.raises(StoreCorruptError):
            loads_message_texts([good, bad, good])


@settings(max_examples=50, deadline=None)
@given(st.lists(messages, max_size=5))
def test_any_transcript_round_trips(msgs: list[Message]) -> None:
    assert loads_messages(dumps_messages(msgs)) == msgs


# --- unknown fields ---------------------------------------------------------------------


def test_message_from_a_newer_release_loads_and_saves_back_unchanged() -> None:
    newer: dict[str, Any] = {
        "role": "assistant",
        "content": [{"type": "text", "text": "hi"}],
        "usage": {"input_tokens": 1, "output_tokens": 2},
        "reasoning": {"summary": "thought hard", "tokens": 12},
        "citations": [{"url": "https://example.com"}],
    }
    text = json.dumps(newer, separators=(",", ":"))
    m = loads_message(text)
    assert m.text == "hi"
    assert dict(m.extra) == {
        "reasoning": {"summary": "thought hard", "tokens": 12},
        "citations": [{"url": "https://example.com"}],
    }
    assert message_to_dict(m) == newer
    assert dumps_message(m) == text
    assert message_from_dict(newer) == m


def test_unknown_field_on_a_minimal_message_is_kept() -> None:
    m = message_from_dict({"role": "user", "future": 1})
    assert dict(m.extra) == {"future": 1}
    assert message_to_dict(m) == {"role": "user", "future": 1}


def test_extra_never_overrides_known_fields() -> None:
    m = Message("user", "real", extra={"role": "assistant", "other": 2})
    assert message_to_dict(m) == {"role": "user", "content": "real", "other": 2}


def test_transcript_document_keeps_unknown_message_fields() -> None:
    doc = {
        "v": 1,
        "messages": [{"role": "user", "content": "a", "x-new": [1, 2]}, {"role": "user"}],
    }
    text = json.dumps(doc, separators=(",", ":"))
    assert dumps_messages(loads_messages(text)) == text


def checkpoint() -> Checkpoint:
    return Checkpoint(
        key="s1.turn-4",
        session_id="s1",
        run_id="run-1",
        turn_index=4,
        input=(Message("user", (TextPart("see"), ImagePart(data=ALL_BYTES))),),
        recorded=(
            Message("assistant", "", (ToolCall("c1", "pay", {"amount": 5}),), usage=Usage(1, 2)),
            Message("tool", "paid", tool_call_id="c1"),
        ),
        started_call_ids=("c2",),
        queued_inputs=(Message("user", "and then?"),),
        pending_approval_ids=("ap-1",),
        usage=Usage(5, 6, 0.5),
        status="awaiting-approval",
        created_at=1700000000.25,
        updated_at=1700000001.5,
    )


def test_checkpoint_round_trips_with_version() -> None:
    c = checkpoint()
    s = dumps_checkpoint(c)
    assert json.loads(s)["v"] == FORMAT_VERSION == 1
    assert loads_checkpoint(s) == c


def test_checkpoint_from_a_newer_release_keeps_unknown_fields() -> None:
    d = json.loads(dumps_checkpoint(checkpoint()))
    d["lineage"] = {"parent": "run-0"}
    d["recorded"][0]["new_field"] = True
    text = json.dumps(d, separators=(",", ":"))
    c = loads_checkpoint(text)
    assert c.extra == {"lineage": {"parent": "run-0"}}
    assert dict(c.recorded[0].extra) == {"new_field": True}
    assert dumps_checkpoint(c) == text


def approval() -> ApprovalRecord:
    return ApprovalRecord(
        id="ap-1",
        session_id=None,
        checkpoint_key="run-1.turn-0",
        call=ToolCall("c1", "transfer", {"amount": 10.5, "to": "bob"}),
        created_at=1700000000.0,
    )


def test_approval_round_trips_with_unknown_fields() -> None:
    r = approval()
    s = dumps_approval(r)
    assert json.loads(s)["v"] == 1
    assert loads_approval(s) == r
    d = json.loads(s)
    d["approver"] = "alice"
    text = json.dumps(d, separators=(",", ":"))
    back = loads_approval(text)
    assert back.extra == {"approver": "alice"}
    assert dumps_approval(back) == text


# --- refusals ---------------------------------------------------------------------------


def test_newer_format_version_is_refused() -> None:
    with pytest.raises(StoreCorruptError, match=r"newer lousho \(format v2"):
        loads_messages('{"v":2,"messages":[]}')
    d = json.loads(dumps_checkpoint(checkpoint()))
    d["v"] = 2
    with pytest.raises(StoreCorruptError, match="newer"):
        loads_checkpoint(json.dumps(d))
    d = json.loads(dumps_approval(approval()))
    d["v"] = 99
    with pytest.raises(StoreCorruptError, match="newer"):
        loads_approval(json.dumps(d))


@pytest.mark.parametrize("text", ["", "{", "not json", '{"role":"user"} trailing', b"\xff\xfe{"])
def test_invalid_json_is_refused(text: str | bytes) -> None:
    with pytest.raises(StoreCorruptError, match="not valid JSON"):
        loads_message(text)
    with pytest.raises(StoreCorruptError, match="not valid JSON"):
        loads_messages(text)
    with pytest.raises(StoreCorruptError, match="not valid JSON"):
        loads_checkpoint(text)


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("[]", "must be an object"),
        ('{"messages":[]}', "has no 'v'"),
        ('{"v":"1","messages":[]}', "invalid format version"),
        ('{"v":1}', "has no 'messages'"),
        ('{"v":1,"messages":{}}', "must be a list"),
        ('{"v":1,"messages":[{"content":"x"}]}', r"messages\[0\]: a message has no 'role'"),
        ('{"v":1,"messages":[{"role":"robot"}]}', "role must be"),
        ('{"v":1,"messages":[{"role":"robot","content":"x"}]}', "role must be"),
        ('{"v":1,"messages":[{"role":["user"],"content":"x"}]}', "role must be"),
        ('{"v":1,"messages":[{"role":"user","content":5}]}', "'content' must be a list"),
        (
            '{"v":1,"messages":[{"role":"user"},{"role":"user","content":[{"type":"video"}]}]}',
            r"messages\[1\]: unknown content part type 'video'",
        ),
        (
            '{"v":1,"messages":[{"role":"user","content":[{"type":"image","data":"@@"}]}]}',
            "not valid base64",
        ),
        (
            '{"v":1,"messages":[{"role":"user","content":[{"type":"image"}]}]}',
            "exactly one of data",
        ),
        ('{"v":1,"messages":[{"role":"tool","is_error":"yes"}]}', "'is_error' must be a boolean"),
        (
            '{"v":1,"messages":[{"role":"assistant","usage":{"input_tokens":1.5}}]}',
            "'input_tokens' must be an integer",
        ),
        ('{"v":1,"messages":[{"role":"assistant","tool_calls":[{"id":"c"}]}]}', "has no 'name'"),
    ],
)
def test_wrong_shapes_are_refused_with_a_readable_message(doc: str, says: str) -> None:
    with pytest.raises(StoreCorruptError, match=says):
        loads_messages(doc)


def test_unknown_part_type_is_refused_for_a_single_message() -> None:
    with pytest.raises(StoreCorruptError, match="unknown content part type 'audio'"):
        loads_message('{"role":"user","content":[{"type":"audio","data":""}]}')


def test_checkpoint_with_unknown_status_is_refused() -> None:
    d = json.loads(dumps_checkpoint(checkpoint()))
    d["status"] = "sleeping"
    with pytest.raises(StoreCorruptError, match="'status' must be one of"):
        loads_checkpoint(json.dumps(d))
