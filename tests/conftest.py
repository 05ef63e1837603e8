"""Shared fixtures: every wait in a test has a timeout."""

from __future__ import annotations

import threading
from collections.abc import Iterator

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
