"""File stores on real files: FileStorage, the file layout, atomic writes, corrupt files
left alone, ids that are not file names, and appends, resolve-once and leases across real
processes. The behaviour every store shares is tested once per store in
test_store_contract.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lousho_sync.errors import (
    ApprovalAlreadyResolvedError,
    ApprovalNotFoundError,
    InvalidSessionIdError,
    StoreConflictError,
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
)
from lousho_sync.messages import Message, ToolCall, Usage
from lousho_sync.stores.base import (
    ApprovalRecord,
    ApprovalStore,
    Checkpoint,
    CheckpointStore,
    SessionStore,
    StorageService,
)
from lousho_sync.stores.files import (
    FileSessionStore,
    FileStorage,
    LocalStorageCheckpointStore,
    StorageServiceApprovalStore,
)

JOIN = 120.0  # seconds: the longest a test waits for a thread or process
SPAWN = multiprocessing.get_context("spawn")


def user(text: str) -> Message:
    return Message("user", text)


def record(id: str, *, session_id: str | None = "s1", created_at: float = 1.0) -> ApprovalRecord:
    return ApprovalRecord(
        id=id,
        session_id=session_id,
        checkpoint_key=f"{session_id}.turn-0",
        call=ToolCall(f"call-{id}", "transfer", {"amount": 5, "to": "bob"}),
        created_at=created_at,
    )


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# --- FileStorage --------------------------------------------------------------------------


def test_file_storage_get_put_delete_list(tmp_path: Path) -> None:
    root = tmp_path / "root"
    storage = FileStorage(root)
    assert isinstance(storage, StorageService)
    assert storage.get("a") is None
    assert storage.list() == []
    assert not root.exists()
    storage.put("b.json", b"2")
    storage.put("a", b"1")
    storage.put("approvals/x.json", b"\x00\xff")
    storage.put("checkpoints/k.json", b"k")
    storage.put("a", b"one")
    assert storage.get("a") == b"one"
    assert storage.get("approvals/x.json") == b"\x00\xff"
    assert storage.list() == ["a", "approvals/x.json", "b.json", "checkpoints/k.json"]
    assert storage.list("approvals/") == ["approvals/x.json"]
    assert storage.list("ch") == ["checkpoints/k.json"]
    assert storage.list("checkpoints/l") == []
    assert storage.list("nothing/") == []
    storage.delete("a")
    storage.delete("a")
    assert storage.get("a") is None
    with storage.lock("approvals/x"):
        pass
    # no temp files left behind; lock files are hidden and never listed
    assert all(not n.endswith(".tmp") for n in files_under(root))
    assert storage.list() == ["approvals/x.json", "b.json", "checkpoints/k.json"]


@pytest.mark.parametrize(
    "key", ["", "../x", "a/../b", "/etc/passwd", "a/b/c", ".hidden", "a/.b", "a//b", "a b", "é"]
)
def test_file_storage_refuses_bad_keys(tmp_path: Path, key: str) -> None:
    storage = FileStorage(tmp_path / "root")
    with pytest.raises(StoreError, match="invalid storage key"):
        storage.put(key, b"x")
    with pytest.raises(StoreError, match="invalid storage key"):
        storage.get(key)
    with pytest.raises(StoreError, match="invalid storage key"):
        storage.lock(key)
    assert not (tmp_path / "root").exists()


def test_file_storage_lock_excludes_other_threads(tmp_path: Path) -> None:
    holder = FileStorage(tmp_path)
    impatient = FileStorage(tmp_path, lock_timeout_s=0.05)
    held, done = threading.Event(), threading.Event()
    outcome: list[object] = []

    def other() -> None:
        assert held.wait(JOIN)
        try:
            with impatient.lock("k"):
                outcome.append("acquired")
        except StoreUnavailableError as exc:
            outcome.append(exc)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with holder.lock("k"):
        held.set()
        assert done.wait(JOIN)
    t.join(JOIN)
    assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailableError)
    assert "could not lock" in str(outcome[0])
    with impatient.lock("k"):  # free again
        pass


# --- FileSessionStore ---------------------------------------------------------------------


def test_session_files_layout(tmp_path: Path) -> None:
    directory = tmp_path / "sessions"
    store = FileSessionStore(directory)
    assert isinstance(store, SessionStore)
    assert store.load("s1") is None and store.ids() == []
    assert not directory.exists()  # created on the first save
    transcript = [user("hi"), Message("assistant", "hello", usage=Usage(3, 4, 0.01))]
    store.save("s1", transcript)
    doc = json.loads((directory / "s1.json").read_text())
    assert doc["v"] == 1 and len(doc["messages"]) == 2
    store.save("s1", [])
    assert not (directory / "s1.json").exists()
    assert [n for n in os.listdir(directory) if n.endswith(".tmp")] == []


@pytest.mark.parametrize(
    "content",
    [b"", b"not json", b'{"v":1,"messages":[{"role":"robot"}]}', b'{"v":7,"messages":[]}', b"\xff"],
)
def test_corrupt_session_file_is_reported_and_left_untouched(
    tmp_path: Path, content: bytes
) -> None:
    store = FileSessionStore(tmp_path)
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with pytest.raises(StoreCorruptError) as info:
        store.load("s")
    assert info.value.path == str(path) and str(path) in str(info.value)
    assert info.value.session_id == "s"
    with pytest.raises(StoreCorruptError):
        store.append("s", [user("x")], expected_length=0)
    assert path.read_bytes() == content
    assert store.ids() == ["s"]


BAD_IDS = ["../x", "a/b", "", "x" * 129, "a.b", "a b", "/abs"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_session_ids_are_refused_before_any_io(tmp_path: Path, bad: str) -> None:
    """What the refusal says is in the contract suite; here: no file or directory is made."""
    directory = tmp_path / "sessions"
    store = FileSessionStore(directory)
    calls: list[Callable[[], object]] = [
        lambda: store.load(bad),
        lambda: store.save(bad, [user("x")]),
        lambda: store.append(bad, [user("x")], expected_length=0),
        lambda: store.delete(bad),
        lambda: store.revision(bad),
        lambda: store.acquire_lease(bad, owner="o", ttl_s=30, wait_s=0),
        lambda: store.renew_lease(bad, owner="o", ttl_s=30),
        lambda: store.release_lease(bad, owner="o"),
        lambda: store.info(bad),
        lambda: store.set_metadata(bad, {"title": "t"}),
        lambda: store.history(bad),
        lambda: store.compact(bad, [user("x")], replaced=[user("y")]),
        lambda: store.create(bad, [user("x")]),
    ]
    for call in calls:
        with pytest.raises(InvalidSessionIdError):
            call()
    assert not directory.exists()
    assert files_under(tmp_path) == []


# --- the catalog's files -------------------------------------------------------------------


def test_catalog_files_layout(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    store.save("s", [user("a"), user("b")])
    store.set_metadata("s", {"title": "t"})
    store.compact("s", [user("sum")], replaced=[user("a"), user("b")])
    names = sorted(n for n in os.listdir(tmp_path) if not n.startswith("."))
    assert names == ["s.history.json", "s.json", "s.lock", "s.meta.json"]
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["history_length"] == 2 and len(doc["messages"]) == 1
    meta = json.loads((tmp_path / "s.meta.json").read_text())
    assert meta["metadata"] == {"title": "t"} and meta["messages"] == 1
    assert meta["created_at"] <= meta["updated_at"]
    store.save("s", [])  # transcript and history go, the metadata stays
    assert sorted(os.listdir(tmp_path)) == ["s.lock", "s.meta.json"]
    store.delete("s")
    assert os.listdir(tmp_path) == ["s.lock"]


def test_list_and_info_read_no_transcript(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileSessionStore(tmp_path)
    for i in range(5):
        store.save(f"s{i}", [user("x")] * (i + 1))

    def no(*_: object) -> None:
        raise AssertionError("a transcript was read")
    monkeypatch.setattr(FileSessionStore, "_read_doc", no)
    monkeypatch.setattr(FileSessionStore, "_peek", no)
    assert [(i.id, i.messages) for i in store.list(limit=3)] == [("s4", 5), ("s3", 4), ("s2", 3)]
    assert store.info("s0") is not None and store.info("s0").messages == 1


def test_sessions_of_the_old_layout_list_and_load(tmp_path: Path) -> None:
    """A directory written before the catalog (transcripts only) lists with the files'
    mtimes and counts, loads as before, and a read writes nothing."""
    old = {"v": 1, "messages": [{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "hello"}]}
    for id, stamp in (("old-a", 1_700_000_000), ("old-b", 1_700_000_100)):
        (tmp_path / f"{id}.json").write_text(json.dumps(old))
        os.utime(tmp_path / f"{id}.json", (stamp, stamp))
    before = files_under(tmp_path)
    store = FileSessionStore(tmp_path)
    page = store.list()
    assert [(i.id, i.messages, i.created_at, i.updated_at, dict(i.metadata)) for i in page] == [
        ("old-b", 2, 1_700_000_100.0, 1_700_000_100.0, {}),
        ("old-a", 2, 1_700_000_000.0, 1_700_000_000.0, {}),
    ]
    assert store.info("old-a") == page.items[1]
    assert store.history("old-a") == []
    assert [m.content for m in store.load("old-a") or []] == ["hi", "hello"]
    assert store.ids() == ["old-a", "old-b"]
    assert files_under(tmp_path) == before  # nothing written by a read
    # the first write adds the sidecar; created_at stays the file's time
    store.append("old-a", [user("again")], expected_length=2)
    info = store.info("old-a")
    assert info is not None and info.messages == 3 and info.created_at == 1_700_000_000.0
    assert info.updated_at > 1_700_000_100.0
    assert (tmp_path / "old-a.meta.json").exists()
    store.set_metadata("old-b", {"title": "kept"})
    assert store.info("old-b") is not None and store.info("old-b").messages == 2


BAD_SIDECARS = [
    b"",
    b"{not json",
    b"[]",
    b'{"v":1}',
    b'{"v":9,"created_at":1}',
    b'{"v":1,"created_at":1,"updated_at":1,"messages":1,"metadata":[],"transcript":null}',
]


@pytest.mark.parametrize("content", BAD_SIDECARS)
def test_a_damaged_sidecar_is_reported_with_its_path(tmp_path: Path, content: bytes) -> None:
    store = FileSessionStore(tmp_path)
    store.save("s", [user("a")])
    sidecar = tmp_path / "s.meta.json"
    sidecar.write_bytes(content)
    for call in (lambda: store.info("s"), lambda: store.list(),
                 lambda: store.set_metadata("s", {"title": "t"}),
                 lambda: store.save("s", [user("b")])):
        with pytest.raises(StoreCorruptError) as info:
            call()
        assert info.value.path == str(sidecar) and str(sidecar) in str(info.value)
        assert info.value.session_id == "s"
    assert sidecar.read_bytes() == content  # left as it is
    assert [m.content for m in store.load("s") or []] == ["a"]  # the transcript still loads
    store.delete("s")  # and the session can still be deleted
    assert files_under(tmp_path) == ["s.lock"]


def test_a_crash_between_the_transcript_and_the_sidecar_loses_nothing(tmp_path: Path) -> None:
    """The transcript is the truth: a sidecar that no longer matches it (a crash after the
    transcript was written, or an older lousho writing) is counted from the transcript."""
    store = FileSessionStore(tmp_path)
    store.save("s", [user("a")])
    store.set_metadata("s", {"title": "t"})
    before = store.info("s")
    assert before is not None
    sidecar = (tmp_path / "s.meta.json").read_bytes()
    store.append("s", [user("b"), user("c")], expected_length=1)
    (tmp_path / "s.meta.json").write_bytes(sidecar)  # as if the sidecar write never happened
    info = store.info("s")
    assert info is not None and info.messages == 3 and info.metadata == {"title": "t"}
    assert info.updated_at >= before.updated_at
    assert [(i.id, i.messages) for i in store.list()] == [("s", 3)]
    store.append("s", [user("d")], expected_length=3)  # the next write repairs the sidecar
    assert json.loads((tmp_path / "s.meta.json").read_text())["messages"] == 4


def test_a_crash_inside_compact_keeps_the_old_history(tmp_path: Path) -> None:
    """compact writes the history file first; it counts only once the transcript names its
    new length, so a crash between the two leaves the old transcript and history."""
    store = FileSessionStore(tmp_path)
    store.save("s", [user("a"), user("b"), user("c")])
    store.compact("s", [user("sum1"), user("c")], replaced=[user("a"), user("b")])
    transcript = (tmp_path / "s.json").read_bytes()
    meta = (tmp_path / "s.meta.json").read_bytes()
    store.compact("s", [user("sum2")], replaced=[user("sum1"), user("c")])
    (tmp_path / "s.json").write_bytes(transcript)  # the transcript and sidecar writes "lost"
    (tmp_path / "s.meta.json").write_bytes(meta)
    assert [m.content for m in store.history("s")] == ["a", "b"]
    assert [m.content for m in store.load("s") or []] == ["sum1", "c"]
    store.compact("s", [user("sum3")], replaced=[user("sum1")])  # the retry replaces it
    assert [m.content for m in store.history("s")] == ["a", "b", "sum1"]


def test_a_damaged_history_file_is_reported_with_its_path(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    store.create("s", [user("sum")], history=[user("a")])
    path = tmp_path / "s.history.json"
    path.write_bytes(b"{oops")
    with pytest.raises(StoreCorruptError) as info:
        store.history("s")
    assert info.value.path == str(path) and info.value.session_id == "s"
    assert path.read_bytes() == b"{oops"


def _append_worker(directory: str, name: str, count: int, barrier: Any) -> None:
    store = FileSessionStore(directory)
    barrier.wait(JOIN)
    for i in range(count):
        for _attempt in range(10_000):
            current = store.load("shared") or []
            try:
                store.append("shared", [user(f"{name}-{i}")], expected_length=len(current))
                break
            except StoreConflictError:
                continue
        else:
            raise AssertionError(f"{name} never managed to append message {i}")


def test_four_processes_append_to_one_session(tmp_path: Path) -> None:
    names, count = ["p0", "p1", "p2", "p3"], 25
    barrier = SPAWN.Barrier(len(names))
    procs = [
        SPAWN.Process(target=_append_worker, args=(str(tmp_path), name, count, barrier))
        for name in names
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(JOIN)
    assert [p.exitcode for p in procs] == [0] * len(names)
    texts = [m.text for m in FileSessionStore(tmp_path).load("shared") or []]
    assert len(texts) == len(names) * count
    for name in names:
        assert [t for t in texts if t.startswith(name + "-")] == [
            f"{name}-{i}" for i in range(count)
        ]


# --- leases -------------------------------------------------------------------------------


def test_a_lease_ttl_must_be_positive(tmp_path: Path) -> None:
    from lousho_sync import ConfigError

    store = FileSessionStore(tmp_path)
    with pytest.raises(ConfigError, match="ttl_s must be > 0"):
        store.acquire_lease("s", owner="a", ttl_s=0, wait_s=0)
    assert store.acquire_lease("s", owner="a", ttl_s=30, wait_s=0)
    with pytest.raises(ConfigError):
        store.renew_lease("s", owner="a", ttl_s=-1)
    store.release_lease("s", owner="a")


CHILD_HOLDS_LEASE = """
import sys
from lousho_sync.stores.files import FileSessionStore
store = FileSessionStore(sys.argv[1])
assert store.acquire_lease("s", owner="child", ttl_s=30, wait_s=10)
print("held", flush=True)
sys.stdin.read()
"""


def test_lease_of_a_killed_process_is_taken_at_once(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_HOLDS_LEASE, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], JOIN)
        assert ready, "the child did not report holding the lease"
        assert child.stdout.readline() == b"held\n"
        store = FileSessionStore(tmp_path)
        assert not store.acquire_lease("s", owner="parent", ttl_s=30, wait_s=0.05)
        child.kill()  # SIGKILL: no cleanup runs in the child
        child.wait(JOIN)
        assert store.acquire_lease("s", owner="parent", ttl_s=30, wait_s=0)
        store.release_lease("s", owner="parent")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(JOIN)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


CHILD_LEASE_THEN_RELEASE = """
import sys
from lousho_sync.stores.files import FileSessionStore
store = FileSessionStore(sys.argv[1])
token = store.acquire_lease("s", owner="child", ttl_s=0.2, wait_s=10)
print(token, flush=True)
sys.stdin.readline()
store.release_lease("s", owner="child")
print("released", flush=True)
sys.stdin.read()
"""


def _line(child: subprocess.Popen[bytes]) -> bytes:
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], JOIN)
    assert ready, "the child said nothing in time"
    return child.stdout.readline().strip()


def test_a_stopped_holder_keeps_others_out_no_split_brain(tmp_path: Path) -> None:
    """A holder stopped with SIGSTOP past its ttl still holds the OS lock: nobody else gets
    the lease until it runs again and releases it; then the next token is greater."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_LEASE_THEN_RELEASE, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        held = int(_line(child))
        assert held >= 1
        store = FileSessionStore(tmp_path)
        assert store.fence_token("s") == held
        os.kill(child.pid, signal.SIGSTOP)
        try:
            # its 0.2 s ttl runs out while we wait: the lease is still not ours
            assert store.acquire_lease("s", owner="parent", ttl_s=30, wait_s=0.5) is None
            assert store.fence_token("s") == held
        finally:
            os.kill(child.pid, signal.SIGCONT)
        assert child.stdin is not None
        child.stdin.write(b"release\n")
        child.stdin.flush()
        assert _line(child) == b"released"
        token = store.acquire_lease("s", owner="parent", ttl_s=30, wait_s=JOIN)
        assert token is not None and token > held
        assert store.fence_token("s") == token
        store.release_lease("s", owner="parent")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(JOIN)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def test_fence_tokens_survive_a_new_store_object_and_a_bad_token_file(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    first = store.acquire_lease("s", owner="a", ttl_s=30, wait_s=0)
    again = store.acquire_lease("s", owner="a", ttl_s=30, wait_s=0)  # the holder again
    assert first == 1 and again == 2
    store.release_lease("s", owner="a")
    other = FileSessionStore(tmp_path)
    assert other.fence_token("s") == 2
    assert other.acquire_lease("s", owner="b", ttl_s=30, wait_s=0) == 3
    other.release_lease("s", owner="b")
    (tmp_path / "s.fence").write_text("garbage")
    with pytest.raises(StoreCorruptError) as info:
        other.acquire_lease("s", owner="b", ttl_s=30, wait_s=0)
    assert info.value.path == str(tmp_path / "s.fence") and "not a number" in str(info.value)
    assert (tmp_path / "s.fence").read_text() == "garbage"  # left as it was
    (tmp_path / "s.fence").write_text("7")  # repaired: the failed attempt left no lease held
    assert store.acquire_lease("s", owner="c", ttl_s=30, wait_s=0) == 8


# --- checkpoints --------------------------------------------------------------------------


def checkpoint(key: str) -> Checkpoint:
    return Checkpoint(
        key=key,
        session_id="s1",
        run_id="run-1",
        input=(user("do it"),),
        recorded=(Message("assistant", "", (ToolCall("c1", "pay", {"n": 1}),)),),
        started_call_ids=("c1",),
        created_at=10.0,
        updated_at=11.0,
    )


def test_checkpoint_files_layout(tmp_path: Path) -> None:
    store = LocalStorageCheckpointStore(FileStorage(tmp_path))
    assert isinstance(store, CheckpointStore)
    store.save("s1.turn-0", checkpoint("s1.turn-0"))
    assert (tmp_path / "checkpoints" / "s1.turn-0.json").is_file()
    assert store.load("s1.turn-0") == checkpoint("s1.turn-0")
    assert store.keys("") == ["s1.turn-0"]


def test_checkpoint_store_takes_a_directory_and_reports_corruption(tmp_path: Path) -> None:
    store = LocalStorageCheckpointStore(tmp_path)
    path = tmp_path / "checkpoints" / "k.json"
    path.parent.mkdir()
    path.write_bytes(b'{"v":1,"key":')
    with pytest.raises(StoreCorruptError) as info:
        store.load("k")
    assert info.value.path == str(path) and str(path) in str(info.value)
    assert path.read_bytes() == b'{"v":1,"key":'


# --- approvals ----------------------------------------------------------------------------


def test_approval_files_layout_and_ids_that_are_not_file_names(tmp_path: Path) -> None:
    store = StorageServiceApprovalStore(FileStorage(tmp_path))
    assert isinstance(store, ApprovalStore)
    store.create(record("early"))
    assert (tmp_path / "approvals" / "early.json").is_file()
    assert store.get("early") == record("early")
    assert store.get("../etc") is None
    with pytest.raises(ApprovalNotFoundError) as info:
        store.resolve("../x", approved=True)
    assert info.value.approval_id == "../x" and isinstance(info.value, KeyError)
    with pytest.raises(StoreError, match="invalid approval id"):
        store.create(record("a/b"))


def _resolve_worker(root: str, name: str, ids: list[str], barrier: Any, results: Any) -> None:
    store = StorageServiceApprovalStore(FileStorage(root))
    barrier.wait(JOIN)
    won = []
    for id in ids:
        try:
            store.resolve(id, approved=True, reason=name)
            won.append(id)
        except ApprovalAlreadyResolvedError:
            pass
    results.put((name, won))


def test_two_processes_resolve_once(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    store = StorageServiceApprovalStore(storage)
    ids = [f"ap{i:02d}" for i in range(20)]
    for id in ids:
        store.create(record(id))
    barrier = SPAWN.Barrier(2)
    results = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_resolve_worker, args=(str(tmp_path), name, ids, barrier, results))
        for name in ["w1", "w2"]
    ]
    for p in procs:
        p.start()
    won = dict(results.get(timeout=JOIN) for _ in procs)
    for p in procs:
        p.join(JOIN)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(won["w1"] + won["w2"]) == ids  # every id won exactly once
    for id in ids:
        stored = store.get(id)
        assert stored is not None and stored.status == "approved"
        assert stored.reason == ("w1" if id in won["w1"] else "w2")
    assert store.list_pending() == []
