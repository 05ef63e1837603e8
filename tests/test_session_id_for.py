"""session_id_for: any user key becomes a valid, stable session id, distinct keys distinct
ids, readable where the key is."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lousho_aio
import lousho_sync
from lousho_sync import (
    InvalidInputError,
    InvalidSessionIdError,
    ScriptedProvider,
    create_agent,
    session_id_for,
)
from lousho_sync.ids import is_session_id


def test_known_values_do_not_change() -> None:
    # part of the contract: a change would orphan every stored session
    assert session_id_for("ali@example.com") == "ali-example-com-9d86ec2b59bb107bf110722c"
    assert session_id_for("tenant:42") == "tenant-42-4b5d4625d71bf87fe91c295a"
    assert session_id_for("José") == "Jose-24c2ab65b7adab7e070ba05a"
    assert session_id_for("用户") == "0d0e1a86b3aa787709b00329"


def test_readable_prefix_and_bounded_length() -> None:
    assert session_id_for("user-42").startswith("user-42-")
    long = session_id_for("x" * 10_000)
    assert long.startswith("x" * 64 + "-") and len(long) == 64 + 1 + 24
    assert session_id_for("--..--") == session_id_for("--..--")[-24:]  # nothing readable


def test_keys_that_read_alike_stay_apart() -> None:
    keys = ["a.b", "a-b", "a_b", "a b", "A.b", "a..b", "ab", "a/b", "a@b"]
    assert len({session_id_for(k) for k in keys}) == len(keys)
    # a valid id is hashed too, so no key can be picked to land on another key's session
    target = session_id_for("victim@example.com")
    assert session_id_for(target) != target


def test_bad_keys_are_refused_with_a_clear_error() -> None:
    with pytest.raises(InvalidSessionIdError, match="non-empty key"):
        session_id_for("")
    with pytest.raises(InvalidInputError, match="takes a str key, got int"):
        session_id_for(42)  # type: ignore[arg-type]


def test_exported_from_both_roots_and_accepted_by_sessions() -> None:
    assert lousho_sync.session_id_for is session_id_for
    assert lousho_aio.session_id_for is session_id_for
    agent = create_agent(provider=ScriptedProvider(default="ok"))
    session = agent.session(id=session_id_for("ali@example.com"))
    assert session.send("hi").text == "ok"


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=400))
def test_any_key_gives_a_valid_stable_id(key: str) -> None:
    sid = session_id_for(key)
    assert is_session_id(sid)
    assert session_id_for(key) == sid


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=40), min_size=2, max_size=30, unique=True))
def test_distinct_keys_get_distinct_ids(keys: list[str]) -> None:
    assert len({session_id_for(k) for k in keys}) == len(keys)
