"""Shared fixtures: every wait in a test has a timeout; a Redis server for the Redis tests."""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

WAIT = 10.0  # seconds: the longest any event/join in a test may wait


def wait(event: threading.Event, what: str = "event") -> None:
    """Wait for ``event`` or fail the test."""
    assert event.wait(WAIT), f"timed out waiting for {what}"


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An Event released at teardown, so a gated provider never outlives its test."""
    g = threading.Event()
    yield g
    g.set()


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
    """A Redis URL: ``LOUSHO_TEST_REDIS_URL`` when set (CI starts a server), otherwise a
    ``redis-server`` started here on a free loopback port for the session. Without either
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
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        while True:  # its log says when it accepts connections
            ready, _, _ = select.select([proc.stdout], [], [], REDIS_START_TIMEOUT)
            line = proc.stdout.readline() if ready else ""
            if not line:
                raise AssertionError(f"redis-server did not start: {''.join(seen)}")
            seen.append(line)
            if "Ready to accept connections" in line:
                break
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=REDIS_START_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=REDIS_START_TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()


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
