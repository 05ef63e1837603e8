"""RedisStore on a real redis-server: its own settings, key layout and failure modes, and
real processes sharing one store.

The server comes from the ``redis_url`` fixture (conftest.py): ``LOUSHO_TEST_REDIS_URL`` when
set, otherwise a ``redis-server`` started for the session; without one these tests are
skipped, unless ``CI`` is set. The behaviour every store shares is tested once per store in
test_store_contract.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import IN_CI, approval, checkpoint, free_port, read_line, run_together, texts, user

from lousho_sync.errors import (
    ConfigError,
    StoreClosedError,
    StoreCorruptError,
    StoreTooNewError,
    StoreUnavailableError,
)
from lousho_sync.stores._lease import make_owner, poll_until

TIMEOUT = 60.0

try:
    import redis

    from lousho_sync.redis import LAYOUT_VERSION, RedisStore
except ImportError as exc:  # pragma: no cover - depends on the environment
    if IN_CI:
        raise
    pytest.skip(f"redis-py is not installed ({exc}): pip install 'lousho[redis]'",
                allow_module_level=True)


@pytest.fixture
def rstore(redis_url: str, redis_prefix: str) -> Iterator[RedisStore]:
    with RedisStore(redis_url, prefix=redis_prefix) as s:
        yield s


# --- real processes --------------------------------------------------------------------------

WORKER = r"""
import os, sys
from lousho_sync import ScriptedProvider, Step, create_agent, tool
from lousho_sync.errors import ApprovalAlreadyResolvedError
from lousho_sync.stores._lease import make_owner

from lousho_sync.redis import RedisStore

url, prefix, mode, name = sys.argv[1:5]
store = RedisStore(url, prefix=prefix)

@tool
def charge(amount: int) -> str:
    "Charge the card."
    if mode == "crash":
        os._exit(17)  # the process dies while the tool runs
    return f"charged {amount}"

if mode == "hold":
    ok = store.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=3600, wait_s=0)
    print("held" if ok else "refused", flush=True)
    sys.stdin.readline()  # until killed
    sys.exit(0)
if mode == "crash":
    provider = ScriptedProvider([Step(tool_calls=[("charge", {"amount": 5})]), "unused"])
    create_agent(provider=provider, tools=[charge], store=store).session(id="buyer").send("buy")
    sys.exit(0)
if mode == "resume":
    session = create_agent(provider=ScriptedProvider(["done"]), tools=[charge],
                           store=store).session(id="buyer")
    print(session.pending().status, flush=True)
    print(session.resume().text, flush=True)
    sys.exit(0)
agent = create_agent(provider=ScriptedProvider(default="ok"), store=store)
print("ready", flush=True)
sys.stdin.readline()
if mode == "turns":
    for i in range(50):
        agent.session(id="shared" if i % 5 else "other").send(f"{name}-{i}")
    print("done", flush=True)
elif mode == "resolve":
    try:
        store.approvals.resolve("a1", approved=True, reason=name)
        print("won", flush=True)
    except ApprovalAlreadyResolvedError:
        print("lost", flush=True)
store.close()
"""


def _spawn(store: RedisStore, mode: str, name: str = "") -> subprocess.Popen[str]:
    """A WORKER process on ``store``'s data (the test URLs carry no password)."""
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, store.address, store.prefix, mode, name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_four_processes_x_50_turns_lose_no_turn(rstore: RedisStore) -> None:
    names = [f"p{i}" for i in range(4)]
    outputs = run_together([_spawn(rstore, "turns", n) for n in names])
    assert [stdout.strip() for stdout, _ in outputs] == ["done"] * 4
    for sid, mine in (("shared", lambda i: i % 5), ("other", lambda i: not i % 5)):
        messages = rstore.sessions.load(sid)
        assert messages is not None
        assert [m.role for m in messages] == ["user", "assistant"] * (len(messages) // 2)
        assert all(m.content == "ok" for m in messages[1::2])  # turns never interleave
        users = [m.content for m in messages[0::2]]
        expected = [f"{n}-{i}" for n in names for i in range(50) if mine(i)]
        assert sorted(users) == sorted(expected)  # zero lost, zero doubled
        for n in names:  # each process's turns in its own order
            assert [u for u in users if u.startswith(f"{n}-")] == [
                e for e in expected if e.startswith(f"{n}-")]
    assert len(rstore.sessions.load("shared") or []) == 2 * 4 * 40
    assert rstore.checkpoints.keys("") == []


def test_eight_processes_resolve_one_approval_once(rstore: RedisStore) -> None:
    rstore.approvals.create(approval("a1"))
    outputs = run_together([_spawn(rstore, "resolve", f"w{i}") for i in range(8)])
    said = [stdout.strip() for stdout, _ in outputs]
    assert sorted(said) == ["lost"] * 7 + ["won"]
    record = rstore.approvals.get("a1")
    assert rstore.approvals.list_pending() == []
    assert record is not None and record.status == "approved"
    assert record.reason == f"w{said.index('won')}"


def test_lease_of_killed_process_is_taken_over_at_once(rstore: RedisStore) -> None:
    child = _spawn(rstore, "hold")
    try:
        assert read_line(child) == "held"
        me = make_owner()
        assert not rstore.sessions.acquire_lease("s1", owner=me, ttl_s=600, wait_s=0)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=TIMEOUT)
        assert rstore.sessions.acquire_lease("s1", owner=me, ttl_s=600, wait_s=0)
        assert not rstore.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=TIMEOUT)


def test_turn_crashed_in_one_process_resumes_in_another(rstore: RedisStore) -> None:
    def run(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", WORKER, rstore.address, rstore.prefix, mode, ""],
            capture_output=True, text=True, timeout=TIMEOUT,
        )

    crashed = run("crash")
    assert crashed.returncode == 17, crashed.stderr
    resumed = run("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split("\n")[:2] == ["interrupted", "done"]
    messages = rstore.sessions.load("buyer")
    assert messages is not None
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2].content == "charged 5"
    assert rstore.checkpoints.keys("") == []


# --- Redis only ------------------------------------------------------------------------------


def test_unreachable_server_names_address_without_password() -> None:
    port = free_port()  # closed: nothing listens there
    store = RedisStore(f"redis://alice:s3cr3t-pw@127.0.0.1:{port}/2", prefix="x:")
    assert store.address == f"redis://127.0.0.1:{port}/2"
    assert "s3cr3t" not in repr(store)
    for call in (lambda: store.sessions.load("s1"),
                 lambda: store.approvals.resolve("a1", approved=True),
                 lambda: store.acquire_lease("s1", owner=make_owner(), ttl_s=1, wait_s=0)):
        with pytest.raises(StoreUnavailableError) as info:
            call()
        err = info.value
        assert f"redis://127.0.0.1:{port}/2" in str(err) and err.address == store.address
        assert "s3cr3t" not in str(err) and err.code == "LOUSHO_STORE_UNAVAILABLE"
        assert isinstance(err.__cause__, redis.exceptions.ConnectionError)
    store.close()


def test_bad_configuration_is_refused(redis_url: str) -> None:
    with pytest.raises(ConfigError) as info:
        RedisStore("http://example.com:6379/0")
    assert "redis://" in str(info.value)
    with pytest.raises(ConfigError):
        RedisStore(redis_url, ttl_s=0)
    with pytest.raises(ConfigError):
        RedisStore(42)  # type: ignore[arg-type]


def test_given_client_is_used_and_left_open(redis_url: str, redis_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    with RedisStore(client, prefix=redis_prefix) as s:
        s.sessions.append("s1", [user("é")], expected_length=0)
        s.checkpoints.save("s1.turn-1", checkpoint("s1.turn-1"))
        s.approvals.create(approval("a1"))
        assert texts(s.sessions.load("s1")) == ["é"] and s.sessions.ids() == ["s1"]
        assert s.checkpoints.keys("s1") == ["s1.turn-1"]
        assert s.approvals.resolve("a1", approved=True).status == "approved"
        assert isinstance(s.sessions.revision("s1"), int)
    assert client.ping() is True  # still open
    with pytest.raises(StoreClosedError):
        s.sessions.load("s1")
    client.close()


def test_session_ttl_is_set_and_refreshed_and_expired_ids_vanish(
    redis_url: str, redis_prefix: str, redis_raw: redis.Redis
) -> None:
    with RedisStore(redis_url, prefix=redis_prefix, ttl_s=600) as s:
        s.sessions.append("s1", [user("a")], expected_length=0)
        s.sessions.save("s2", [user("b")])
        s.sessions.set_metadata("m", {"title": "metadata only"})
        for key in ("session:s1", "session-meta:s1", "session-info:s1", "session:s2",
                    "session-info:m"):
            assert 0 < redis_raw.pttl(redis_prefix + key) <= 600_000
        redis_raw.pexpire(f"{redis_prefix}session:s1", 100_000)
        s.sessions.append("s1", [user("c")], expected_length=1)  # a write refreshes it
        assert redis_raw.pttl(f"{redis_prefix}session:s1") > 100_000
        redis_raw.pexpire(f"{redis_prefix}session:s2", 1)  # expire it now instead of waiting
        redis_raw.pexpire(f"{redis_prefix}session-meta:s2", 1)
        assert poll_until(lambda: not redis_raw.exists(f"{redis_prefix}session:s2"), TIMEOUT)
        assert s.sessions.load("s2") is None and s.sessions.revision("s2") is None
        redis_raw.pexpire(f"{redis_prefix}session-info:m", 1)
        assert poll_until(lambda: not redis_raw.exists(f"{redis_prefix}session-info:m"), TIMEOUT)
        assert [i.id for i in s.sessions.list()] == ["s1"] and s.sessions.info("s2") is None
        assert s.sessions.ids() == ["s1"]
        assert redis_raw.zrange(f"{redis_prefix}sessions", 0, -1) == ["s1"]  # the index was cleaned
    with RedisStore(redis_url, prefix=redis_prefix) as s:  # no ttl_s: no expiry
        s.sessions.save("s3", [user("d")])
        assert redis_raw.pttl(f"{redis_prefix}session:s3") == -1


def test_foreign_data_under_the_prefix_is_corrupt(
    rstore: RedisStore, redis_raw: redis.Redis
) -> None:
    redis_raw.set(f"{rstore.prefix}session:s1", "not a list")
    with pytest.raises(StoreCorruptError) as info:
        rstore.sessions.load("s1")
    assert rstore.address in str(info.value) and "WRONGTYPE" in str(info.value)
    assert redis_raw.get(f"{rstore.prefix}session:s1") == "not a list"  # left as it was
    redis_raw.hset(f"{rstore.prefix}approval:a1", mapping={"json": "{}", "status": "pending"})
    with pytest.raises(StoreCorruptError) as info:
        rstore.approvals.get("a1")
    assert "approval 'a1'" in str(info.value)


def test_newer_layout_is_refused(redis_url: str, redis_prefix: str, redis_raw: redis.Redis) -> None:
    redis_raw.set(f"{redis_prefix}layout", str(LAYOUT_VERSION + 41))
    with RedisStore(redis_url, prefix=redis_prefix) as s, pytest.raises(StoreTooNewError) as info:
        s.sessions.load("s1")
    message = str(info.value)
    assert f"version {LAYOUT_VERSION + 41}" in message and f"version {LAYOUT_VERSION}" in message
    assert redis_raw.get(f"{redis_prefix}layout") == str(LAYOUT_VERSION + 41)
    assert redis_raw.keys(redis_prefix + "*") == [f"{redis_prefix}layout"]  # nothing else written


def test_a_layout_1_prefix_is_taken_as_layout_3_and_keeps_its_data(
    redis_url: str, redis_prefix: str, redis_raw: redis.Redis
) -> None:
    """Layout 1 had no fence keys; read as layout 3 its sessions have token 0 so far."""
    from lousho_sync.codec import dumps_message

    p = redis_prefix
    redis_raw.set(f"{p}layout", "1")
    redis_raw.rpush(f"{p}session:s1", dumps_message(user("a")), dumps_message(user("b")))
    redis_raw.hset(f"{p}session-meta:s1", mapping={"rev": "7"})
    redis_raw.zadd(f"{p}sessions", {"s1": 1.0})
    redis_raw.set(f"{p}lease:s1", "old-host:1:x", px=600_000)  # held under layout 1
    with RedisStore(redis_url, prefix=p) as s:
        assert texts(s.sessions.load("s1")) == ["a", "b"]
        assert redis_raw.get(f"{p}layout") == str(LAYOUT_VERSION) == "3"
        assert s.sessions.fence_token("s1") == 0
        assert s.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=60, wait_s=0) is None
        redis_raw.delete(f"{p}lease:s1")
        assert s.sessions.acquire_lease("s1", owner=make_owner(), ttl_s=60, wait_s=0) == 1


def test_layout_2_sessions_list_and_load_and_keep_their_times(
    redis_url: str, redis_prefix: str, redis_raw: redis.Redis
) -> None:
    """Layout 2 had no session-info: created_at is the updated_at the session has so far,
    and stays that when a later write records it."""
    from lousho_sync.codec import dumps_message

    p = redis_prefix
    redis_raw.set(f"{p}layout", "2")
    for id, at in (("a", 1000.25), ("b", 3000.5), ("c", 2000.125)):
        redis_raw.rpush(f"{p}session:{id}", dumps_message(user(id)), dumps_message(user("x")))
        redis_raw.hset(f"{p}session-meta:{id}", mapping={"rev": "7"})
        redis_raw.zadd(f"{p}sessions", {id: at})
    with RedisStore(redis_url, prefix=p) as s:
        page = s.sessions.list(limit=2)
        assert [(i.id, i.messages, i.created_at, i.updated_at, i.metadata) for i in page] == [
            ("b", 2, 3000.5, 3000.5, {}), ("c", 2, 2000.125, 2000.125, {})]
        assert [i.id for i in s.sessions.list(after=page.next)] == ["a"]
        assert texts(s.sessions.load("a")) == ["a", "x"] and s.sessions.history("a") == []
        assert redis_raw.get(f"{p}layout") == "3"
        s.sessions.append("a", [user("y")], expected_length=2)
        s.sessions.set_metadata("c", {"title": "C"})
        s.sessions.compact("b", [user("sum")], replaced=[user("b")])
        a, b, c = (s.sessions.info(id) for id in "abc")
        assert a and b and c
        assert (a.created_at, a.messages) == (1000.25, 3) and a.updated_at > 3000.5
        assert (c.created_at, c.title) == (2000.125, "C")
        assert b.created_at == 3000.5 and s.sessions.history("b") == [user("b")]
        assert s.sessions.ids() == ["a", "b", "c"]


def test_damaged_catalog_data_is_corrupt_and_left_as_it_was(
    rstore: RedisStore, redis_raw: redis.Redis
) -> None:
    s, p = rstore.sessions, rstore.prefix
    s.save("s1", [user("a")])
    s.compact("s1", [user("sum")], replaced=[user("a")])
    for field, value in (("md", "{not json"), ("md", "[1, 2]"), ("created", "yesterday")):
        redis_raw.hset(f"{p}session-info:s1", field, value)
        for call in (lambda: s.info("s1"), lambda: s.list()):
            with pytest.raises(StoreCorruptError) as info:
                call()
            assert "'s1'" in str(info.value) and rstore.address in str(info.value)
            assert info.value.session_id == "s1"
        assert redis_raw.hget(f"{p}session-info:s1", field) == value
        redis_raw.hdel(f"{p}session-info:s1", field)
    assert s.info("s1") is not None
    redis_raw.lset(f"{p}session-history:s1", 0, "{not json")
    with pytest.raises(StoreCorruptError, match="history of session 's1'"):
        s.history("s1")
    redis_raw.delete(f"{p}session-info:s1")
    redis_raw.set(f"{p}session-info:s1", "not a hash")
    with pytest.raises(StoreCorruptError, match="WRONGTYPE"):
        s.info("s1")


def test_list_orders_equal_times_by_id_and_times_round_trip(
    rstore: RedisStore, redis_raw: redis.Redis
) -> None:
    """Redis orders equal scores by member, descending, in a REV range; list() by id."""
    s, index = rstore.sessions, f"{rstore.prefix}sessions"
    ids = [f"s{i:02d}" for i in range(9)] + ["t1", "T_2", "_u", "-v"]
    for id in ids:
        s.save(id, [user(id)])
    odd = 1733312345.1234567  # 17 significant digits
    redis_raw.zadd(index, dict.fromkeys(ids[2:], odd))
    redis_raw.zadd(index, {ids[0]: odd + 1e-6, ids[1]: odd - 1e-6})
    expected = [ids[0], *sorted(ids[2:]), ids[1]]
    for limit in (1, 2, 3, 4, 100):
        got, after = [], None
        while True:
            page = s.list(limit=limit, after=after)
            got += list(page)
            after = page.next
            if after is None:
                break
        assert [i.id for i in got] == expected
        assert {i.updated_at for i in got[1:-1]} == {odd}
    assert [i.id for i in s.list(prefix="s0", limit=2)] == ["s00", "s02"]
    info = s.info("s05")
    assert info is not None and info.updated_at == odd


def test_prefixes_keep_stores_apart(redis_url: str, redis_prefix: str) -> None:
    with RedisStore(redis_url, prefix=redis_prefix + "a:") as a, \
            RedisStore(redis_url, prefix=redis_prefix + "b:") as b:
        a.sessions.save("s1", [user("a")])
        a.checkpoints.save("s1.turn-1", checkpoint("s1.turn-1"))
        assert b.sessions.load("s1") is None and b.sessions.ids() == []
        assert b.checkpoints.keys("") == []
        assert b.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0)
        assert a.acquire_lease("s1", owner=make_owner(), ttl_s=600, wait_s=0)


def test_a_retried_append_or_resolve_is_not_a_conflict(rstore: RedisStore) -> None:
    """redis-py retries a call whose reply was lost; the retry must see its own write."""
    c = rstore._c
    keys = [c.key("session:", "s1"), c.key("session-meta:", "s1"), c.key("revision"),
            c.key("sessions"), c.key("checkpoint:"), c.key("checkpoints"),
            c.key("checkpoint-keys"), c.key("lease:", "s1"), c.key("fence:", "s1"),
            c.key("session-info:", "s1"), c.key("session-history:", "s1")]
    args: list[Any] = ["1.0", 0, "s1", 0, "token-1", "0", "", "0", 0,
                       '{"role":"user","content":"a"}']
    first = list(c.append_script(keys, args, c.client))
    assert first[:2] == [1, 1] and first[2] == rstore.sessions.revision("s1")
    assert list(c.append_script(keys, args, c.client)) == first  # the retry: no double
    other = [*args[:4], "token-2", *args[5:]]
    assert list(c.append_script(keys, other, c.client)) == [0, 1]
    assert texts(rstore.sessions.load("s1")) == ["a"]
    rstore.approvals.create(approval("a1"))
    rkeys = [c.key("approval:", "a1"), c.key("approvals-pending"), c.key("approvals-resolved")]
    rargs = ["approved", "0", "", "5.0", "a1", "token-3"]
    assert c.resolve_script(rkeys, rargs, c.client)[0] == 1
    assert c.resolve_script(rkeys, rargs, c.client)[0] == 1  # the retry still wins
    assert c.resolve_script(rkeys, [*rargs[:5], "token-4"], c.client)[0] == 2


def test_package_root_does_not_import_redis() -> None:
    code = "import lousho_sync, sys; assert 'redis' not in sys.modules, 'redis imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr
