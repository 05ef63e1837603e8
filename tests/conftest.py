"""Shared fixtures and helpers: every wait in a test has a timeout; a Redis server for the
Redis tests; records and child-process helpers for the store tests."""

from __future__ import annotations

import base64
import compileall
import contextlib
import glob
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from _http_server import FakeServer

from lousho_sync.messages import Message, ToolCall
from lousho_sync.stores.base import ApprovalRecord, Checkpoint

WAIT = 10.0  # seconds: the longest any event/join in a test may wait

# SqliteStore on the standard sqlite3 module (what most users run, with its WAL-reset guard)
# unless the run says otherwise; tests/test_sqlite_wal.py covers the pysqlite3 choice.
os.environ.setdefault("LOUSHO_SQLITE_DRIVER", "sqlite3")

# The key of the EncryptedStore kinds ("encrypted-…"): one per run, handed to child processes
# through the environment (never on their command line).
ENCRYPTION_KEY_VAR = "LOUSHO_TEST_ENCRYPTION_KEY"
os.environ.setdefault(ENCRYPTION_KEY_VAR, base64.urlsafe_b64encode(os.urandom(32)).decode())


def _bytecode_for_child_processes() -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` (some shells, sandboxes and CI images set it) no
    bytecode of this checkout is ever cached, so each of the suite's hundreds of child
    processes (CLI runs, crash children, storm workers) would compile the whole package again,
    a few tenths of a second each. Compile it once, where Python itself would have cached it
    (the ``__pycache__`` folders of the checkout, ignored by git); the children read it.

    Not into a cache folder of its own (``PYTHONPYCACHEPREFIX``): with a prefix set, Python
    reads *every* module's bytecode from there only, so the standard library and the
    installed packages were compiled from source in every child (0.55 s of CPU for a
    ``lousho sessions list`` instead of 0.2 s). A prefix chosen by the caller is left
    alone; a checkout that cannot be written is simply not compiled."""
    if not sys.flags.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    root = Path(__file__).resolve().parent.parent
    for package in ("lousho_sync", "lousho_aio"):
        compileall.compile_dir(root / package, quiet=2)
    compileall.compile_dir(root / "tests", maxlevels=0, quiet=2)  # the children's scripts
    compileall.compile_dir(root / "examples", maxlevels=0, quiet=2)


_bytecode_for_child_processes()


# --- the suite in parallel (pytest-xdist) ----------------------------------------------------
# setup.cfg passes ``--numprocesses=auto --dist=load``: many tests wait (servers, leases,
# timeouts), so worker processes run tests side by side, one per core. Each worker is a
# process with its own session fixtures: its own redis-server and its own throwaway
# PostgreSQL (below), so a test that stops, restarts or cuts the connections of its server
# disturbs no other worker's test. A server named by LOUSHO_TEST_REDIS_URL or
# LOUSHO_TEST_POSTGRES_URL would be shared by every worker: then ``-n auto`` runs the
# suite in this one process. ``-n0`` always does; ``-p no:xdist`` too.

SHARED_SERVER_VARS = ("LOUSHO_TEST_REDIS_URL", "LOUSHO_TEST_POSTGRES_URL")


def _shared_servers() -> list[str]:
    return [name for name in SHARED_SERVER_VARS if os.environ.get(name)]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many workers ``-n auto`` starts: none (this process runs the suite) when a
    server every worker would share is named, else one per usable core. (Not more: the CLI
    and multi-process tests start many child Pythons, which compute; at two per core on a
    busy 2-core host, tests of a dozen CLI runs went past their 120 s timeout. ``-n 4``
    asks for more.)"""
    if _shared_servers():
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return cores or os.cpu_count() or 1


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Without pytest-xdist (not installed, or ``-p no:xdist``), accept setup.cfg's
    ``--numprocesses`` and ``--dist`` and run the suite in this process."""
    if pluginmanager.has_plugin("xdist"):
        return
    group = parser.getgroup("lousho", "lousho without pytest-xdist")
    group.addoption("--numprocesses", dest="numprocesses", default=0,
                    help="ignored: pytest-xdist is not loaded (pip install pytest-xdist)")
    group.addoption("--dist", dest="dist", default="no",
                    help="ignored: pytest-xdist is not loaded")
    group.addoption("--maxschedchunk", dest="maxschedchunk", default=None,
                    help="ignored: pytest-xdist is not loaded")


def pytest_report_header(config: pytest.Config) -> str | None:
    if not _distributed(config):
        shared = _shared_servers()
        if shared:
            return (f"lousho: one process: {' and '.join(shared)} set, and worker processes "
                    "would share that server (unset to run in parallel, each worker with "
                    "servers of its own)")
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker, the ``stress`` tests (kill storms, chaos soaks, crash series: the
    longest) come first, the rest in their usual order: workers take the next test as they
    finish one (``--maxschedchunk=1``), so the longest start first, and none of them starts
    while the other workers are running out of tests. Every worker sorts the same way."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("stress") is None)  # stable


def _distributed(config: pytest.Config) -> bool:
    """Whether this run hands its tests to xdist workers."""
    return config.pluginmanager.has_plugin("xdist") and \
        str(getattr(config.option, "dist", "no")) != "no"


def wait(event: threading.Event, what: str = "event") -> None:
    """Wait for ``event`` or fail the test."""
    assert event.wait(WAIT), f"timed out waiting for {what}"


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An Event released at teardown, so a gated provider never outlives its test."""
    g = threading.Event()
    yield g
    g.set()


# --- a model server on 127.0.0.1 for the provider and CLI tests --------------------------------


@pytest.fixture
def server() -> Iterator[FakeServer]:
    """A fake model server on 127.0.0.1 (``tests/_http_server.py``) for one test: push or set
    its replies, read its ``requests``."""
    with FakeServer() as s:
        yield s


# --- a Redis server for the RedisStore tests -------------------------------------------------

REDIS_START_TIMEOUT = 60.0
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def free_port() -> int:
    """A loopback TCP port nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _no_redis(reason: str) -> NoReturn:
    """Skip (fail when ``CI`` is set: CI must run the Redis tests)."""
    if IN_CI:
        pytest.fail(f"CI is set but the Redis tests cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis URL: ``LOUSHO_TEST_REDIS_URL`` when set (a server of yours; ``-n auto`` then
    runs the suite in one process), otherwise a ``redis-server`` started here on a free
    loopback port for the session (of this worker process). Without either
    (or without redis-py) the Redis tests are skipped, unless ``CI`` is set: then they fail."""
    try:
        import redis  # noqa: F401
    except ImportError as exc:
        _no_redis(f"redis-py is not installed ({exc}): pip install 'lousho[redis]'")
    url = os.environ.get("LOUSHO_TEST_REDIS_URL")
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        _no_redis("no redis-server binary on PATH and LOUSHO_TEST_REDIS_URL is not set "
                  "(apt-get install redis-server to run the Redis tests)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly",
         "no", "--daemonize", "no", "--loglevel", "notice"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    drain: threading.Thread | None = None
    try:
        _wait_for_ready(proc.stdout.fileno())
        # Keep reading its log, so a full pipe never blocks the server.
        drain = threading.Thread(target=proc.stdout.read, daemon=True)
        drain.start()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=REDIS_START_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=REDIS_START_TIMEOUT)
        if drain is not None:
            drain.join(timeout=REDIS_START_TIMEOUT)
        proc.stdout.close()


def _wait_for_ready(fd: int) -> None:
    """Read redis-server's log from ``fd`` until it accepts connections.

    Reads the raw descriptor (no Python buffer), so ``select`` never waits on lines already
    read into a buffer.
    """
    log = b""
    deadline = time.monotonic() + REDIS_START_TIMEOUT
    while b"Ready to accept connections" not in log:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 65536) if ready else b""
        if not chunk:
            raise AssertionError(
                f"redis-server did not start: {log.decode('utf-8', errors='replace')}"
            )
        log += chunk


# --- a PostgreSQL server for the PostgresStore tests ------------------------------------------

POSTGRES_START_TIMEOUT = 60.0


def _no_postgres(reason: str) -> NoReturn:
    """Skip (fail when ``CI`` is set: CI must run the PostgreSQL tests)."""
    if IN_CI:
        pytest.fail(f"CI is set but the PostgreSQL tests cannot run: {reason}")
    pytest.skip(reason)


POSTGRES_HOW = ("install PostgreSQL's server binaries (Debian/Ubuntu: apt-get install "
                "postgresql; macOS: brew install postgresql) and the suite starts a throwaway "
                "server itself, or point LOUSHO_TEST_POSTGRES_URL at a server you may create "
                "schemas in")


def postgres_binaries() -> str | None:
    """The directory holding ``initdb`` and ``pg_ctl``: on PATH, else the newest
    ``/usr/lib/postgresql/*/bin`` (where Debian puts them, off PATH); None when absent."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return os.path.dirname(pg_ctl)

    def major(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True):
        if os.access(os.path.join(directory, "initdb"), os.X_OK):
            return directory
    return None


def _as_server_owner(command: list[str]) -> list[str]:
    """``command`` as the ``postgres`` user when we are root (initdb and pg_ctl refuse root)."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@contextlib.contextmanager
def throwaway_postgres(bin_dir: str) -> Iterator[tuple[str, str]]:
    """A PostgreSQL server of our own (one per worker process): ``initdb`` in a temporary
    directory (trust authentication), listening on a free port of 127.0.0.1 only, its unix
    socket in that directory; stopped and removed afterwards. Yields its URL and the
    ``pg_ctl -D ...`` command that controls it."""
    root = tempfile.mkdtemp(prefix="lousho-test-pg-")
    data = os.path.join(root, "data")
    try:
        if os.geteuid() == 0:
            import pwd

            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                _no_postgres("the tests run as root, and initdb refuses root, but there is no "
                             "'postgres' user to run the server as")
            if shutil.which("runuser") is None:
                _no_postgres("the tests run as root, and initdb refuses root, but there is "
                             "no runuser to run the server as the 'postgres' user")
            os.chown(root, owner.pw_uid, owner.pw_gid)
        port = free_port()
        initdb = subprocess.run(
            _as_server_owner([os.path.join(bin_dir, "initdb"), "-D", data, "-A", "trust",
                              "-U", "postgres", "--no-sync"]),
            capture_output=True, text=True, timeout=POSTGRES_START_TIMEOUT)
        if initdb.returncode != 0:
            raise AssertionError(f"initdb failed: {initdb.stdout}{initdb.stderr}")
        pg_ctl = os.path.join(bin_dir, "pg_ctl")
        started = subprocess.run(
            _as_server_owner([pg_ctl, "-D", data, "-l", os.path.join(root, "server.log"),
                              "-w", "-t", str(int(POSTGRES_START_TIMEOUT)), "-o",
                              f"-c listen_addresses=127.0.0.1 -p {port} -k {root}", "start"]),
            capture_output=True, text=True, timeout=POSTGRES_START_TIMEOUT + 10)
        if started.returncode != 0:
            log = Path(root, "server.log")
            raise AssertionError(f"PostgreSQL did not start: {started.stderr}"
                                 f"{log.read_text() if log.exists() else ''}")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres", f"{pg_ctl} -D {data}"
        finally:
            subprocess.run(_as_server_owner([pg_ctl, "-D", data, "-m", "immediate", "-w",
                                             "stop"]),
                           capture_output=True, timeout=POSTGRES_START_TIMEOUT)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL URL: ``LOUSHO_TEST_POSTGRES_URL`` when set (a server of yours; ``-n
    auto`` then runs the suite in one process), otherwise a throwaway server started here
    for the session (of this worker process) when PostgreSQL's binaries are installed
    (``LOUSHO_TEST_POSTGRES_CTL`` then names it, so that the restart test may restart it).
    Without either (or without psycopg) the PostgreSQL tests are skipped, saying how to run
    them, unless ``CI`` is set: then they fail."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        _no_postgres(f"psycopg is not installed ({exc}): pip install 'lousho[postgres]'")
    url = os.environ.get("LOUSHO_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    bin_dir = postgres_binaries()
    if bin_dir is None:
        _no_postgres("LOUSHO_TEST_POSTGRES_URL is not set and PostgreSQL's binaries (initdb, "
                     f"pg_ctl) are not installed: {POSTGRES_HOW}")
    with throwaway_postgres(bin_dir) as (url, ctl):
        saved = os.environ.get("LOUSHO_TEST_POSTGRES_CTL")
        os.environ["LOUSHO_TEST_POSTGRES_CTL"] = ctl
        try:
            yield url
        finally:
            if saved is None:
                os.environ.pop("LOUSHO_TEST_POSTGRES_CTL", None)
            else:
                os.environ["LOUSHO_TEST_POSTGRES_CTL"] = saved


def drop_schemas(url: str, schema: str) -> None:
    """Drop the PostgreSQL schema ``schema`` and those named ``<schema>_…``, with all in them."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = %s OR starts_with(nspname, %s)",
            (schema, schema + "_")).fetchall()]
        for name in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def postgres_schema(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL schema name of this test's own; dropped afterwards (with the schemas
    named ``<it>_…`` that child processes derive from it)."""
    name = f"lousho_test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schemas(postgres_url, name)


STORE_KINDS = ["files", "sqlite", "redis", "postgres"]
"""The durable stores the crash and multi-process tests run on (``tests/crash_child.py``)."""


@pytest.fixture
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A durable store kind, given by ``parametrize("kind", STORE_KINDS, indirect=True)``.
    For ``redis`` it takes the shared Redis server (so the test is reported skipped, with
    the reason, when there is none, and fails under ``CI``) and hands its URL to child
    processes through ``LOUSHO_TEST_REDIS_URL``."""
    value = str(request.param)
    base = value.removeprefix("encrypted-")  # (EncryptedStore over that kind)
    if base == "redis":
        monkeypatch.setenv("LOUSHO_TEST_REDIS_URL", request.getfixturevalue("redis_url"))
    if base == "postgres":
        monkeypatch.setenv("LOUSHO_TEST_POSTGRES_URL", request.getfixturevalue("postgres_url"))
        monkeypatch.setenv("LOUSHO_TEST_POSTGRES_SCHEMA",
                           request.getfixturevalue("postgres_schema"))
    return value


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    import redis

    p = f"lousho-test:{uuid.uuid4().hex[:12]}:"
    yield p
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=p + "*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def redis_raw(redis_url: str) -> Iterator[Any]:
    """A plain redis-py client with ``decode_responses`` (to age entries, damage data, read
    keys)."""
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


# --- records for the store tests -------------------------------------------------------------


def user(text: str) -> Message:
    """A user message."""
    return Message("user", text)


def assistant(text: str) -> Message:
    """An assistant message."""
    return Message("assistant", text)


def texts(messages: list[Message] | None) -> list[object]:
    """The contents of a loaded transcript (which must exist)."""
    assert messages is not None
    return [m.content for m in messages]


def approval(id: str, session_id: str = "s1", **kw: Any) -> ApprovalRecord:
    """A pending approval of a ``pay`` call (``kw``: other fields)."""
    return ApprovalRecord(id=id, session_id=session_id, checkpoint_key=f"{session_id}.turn-0",
                          call=ToolCall("call-1", "pay", {"amount": 5}), **kw)


def checkpoint(key: str, **kw: Any) -> Checkpoint:
    """A checkpoint of the session named before the first ``.`` of ``key``."""
    return Checkpoint(key=key, session_id=key.split(".")[0], run_id="run-1", **kw)


# --- child processes sharing a store ---------------------------------------------------------

CHILD_TIMEOUT = 60.0  # seconds: the longest a test waits for a child process


def read_line(proc: subprocess.Popen[str], timeout: float = CHILD_TIMEOUT) -> str:
    """The child's next stdout line, stripped; fails when it says nothing in time."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the child process said nothing in time"
    return proc.stdout.readline().strip()


def run_together(procs: list[subprocess.Popen[str]]) -> list[tuple[str, str]]:
    """Wait until every child said ``ready``, release them at once (a line on stdin), and
    return each one's (stdout, stderr); every child must exit 0. Kills what is left."""
    try:
        for p in procs:
            line = read_line(p)
            assert line == "ready", f"{line!r} {p.stderr.read() if p.stderr else ''}"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=CHILD_TIMEOUT)
            assert p.returncode == 0, stderr
            out.append((stdout, stderr))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=CHILD_TIMEOUT)
