"""Shared fixtures: emulated SGLang backends on loopback sockets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from servers import Server, start_emulator


@pytest.fixture(scope="session")
def emulator() -> Iterator[Server]:
    """One emulated backend at depth 3 (seed profile), shared by read-only tests."""
    with start_emulator(3, "--seed", "7") as server:
        yield server
