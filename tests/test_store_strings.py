"""Strings a store cannot hold are refused at input, the same on every store kit: a NUL or a
surrogate code point in an id, a surrogate in metadata or in message text. The refusal is
InvalidInputError (InvalidSessionIdError, InvalidMetadataError for their fields) before
anything is written; whatever is accepted comes back equal. Fuzzed with hypothesis over the
store kits of test_store_contract.py."""

from __future__ import annotations

import itertools
import string
from typing import Any

import pytest
import test_store_contract as contract
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store_contract import Kit

from lousho_sync import (
    InvalidInputError,
    InvalidMetadataError,
    InvalidSessionIdError,
    Message,
    ScriptedProvider,
    ToolCall,
    create_agent,
)
from lousho_sync.records import ApprovalRecord, Checkpoint
from lousho_sync.stores.base import supports_catalog

ODD = ["\x00", "\ud800", "\udbff", "\udc00", "\udfff", "\ud83d", "\ude00"]
"""NUL and surrogate code points, high and low (a high then a low: a pair)."""

# (lists joined: hypothesis's text() leaves surrogates out even of an explicit alphabet)
_text = st.lists(st.one_of(st.characters(), st.sampled_from(ODD)), max_size=12).map("".join)
_id_chars = st.sampled_from([*string.ascii_letters, *string.digits, "-", "_", *ODD])
_ids = st.lists(_id_chars, min_size=1, max_size=10).map("".join)
FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

kit, store = contract.kit, contract.store  # the store kits' fixtures

_fresh = itertools.count()


def _sid(tag: str) -> str:
    return f"{tag}{next(_fresh)}"


def _has_surrogate(value: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def _has_unstorable_id_char(value: str) -> bool:
    return "\x00" in value or _has_surrogate(value)


@FUZZ
@given(text=_text)
def test_message_text_comes_back_equal_or_is_refused_before_any_write(
    kit: Kit, store: Any, text: str
) -> None:
    sid = _sid("m")
    message = Message("user", text)
    try:
        store.sessions.append(sid, [message], expected_length=0)
    except InvalidInputError as exc:
        assert _has_surrogate(text), exc
        assert store.sessions.load(sid) is None  # nothing was written
    else:
        assert not _has_surrogate(text)
        loaded = store.sessions.load(sid)
        assert loaded is not None and loaded[0].content == text


@FUZZ
@given(text=_text)
def test_a_turn_with_such_input_is_refused_before_the_model_runs(
    kit: Kit, store: Any, text: str
) -> None:
    provider = ScriptedProvider(default="ok")
    session = create_agent(provider=provider, store=store).session(id=_sid("t"))
    try:
        session.send(text or "x")
    except InvalidInputError as exc:
        assert _has_surrogate(text), exc
        assert "surrogate code point" in str(exc)
        assert provider.calls == 0
        assert store.sessions.load(session.id) is None
    else:
        assert not _has_surrogate(text)
        assert [m.text for m in session.messages] == [text or "x", "ok"]


@FUZZ
@given(key=_text, value=_text)
def test_metadata_comes_back_equal_or_is_refused(
    kit: Kit, store: Any, key: str, value: str
) -> None:
    if not supports_catalog(store.sessions):
        pytest.skip(f"{kit.name} keeps no catalog")
    sid = _sid("d")
    metadata = {key: value, "nested": [value, {"k": value}]}
    try:
        store.sessions.set_metadata(sid, metadata)
    except InvalidMetadataError as exc:
        assert _has_surrogate(key + value), exc
        assert "surrogate code point" in str(exc)
        assert store.sessions.info(sid) is None
    else:
        assert not _has_surrogate(key + value)
        info = store.sessions.info(sid)
        assert info is not None and dict(info.metadata) == metadata


@FUZZ
@given(id=_ids)
def test_approval_ids_and_checkpoint_keys_come_back_equal_or_are_refused(
    kit: Kit, store: Any, id: str
) -> None:
    agent = create_agent(provider=ScriptedProvider(default="ok"), store=store)
    try:
        record = ApprovalRecord(id=id, session_id="s1", checkpoint_key=f"s1.{id}",
                                call=ToolCall("c1", "pay", {"amount": 5}))
    except InvalidInputError as exc:
        assert _has_unstorable_id_char(id), exc
        for call in (lambda: agent.approvals.get(id), lambda: agent.approvals.list(id),
                     lambda: agent.approvals.resolve(id=id, approved=True)):
            with pytest.raises(InvalidInputError, match="neither NUL nor surrogate"):
                call()
        with pytest.raises(InvalidInputError):
            Checkpoint(key=id, session_id="s1", run_id="r1")
        with pytest.raises(InvalidSessionIdError):
            agent.session(id=id)
        return
    assert not _has_unstorable_id_char(id)
    if store.approvals.get(id) is None:
        store.approvals.create(record)
    assert agent.approvals.get(id) == record
    key = f"s1.{id}"
    store.checkpoints.save(key, Checkpoint(key=key, session_id="s1", run_id="r1"))
    loaded = store.checkpoints.load(key)
    assert loaded is not None and loaded.key == key


@pytest.mark.parametrize("arguments", [[1, 2], "amount=5", ("a", "b"), 7])
def test_tool_call_arguments_must_be_a_mapping(arguments: Any) -> None:
    with pytest.raises(InvalidInputError, match="ToolCall arguments must be a mapping") as e:
        ToolCall("c1", "pay", arguments)
    assert type(arguments).__name__ in str(e.value)
    assert ToolCall("c1", "pay", None).arguments == {}
