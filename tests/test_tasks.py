"""Stopping background tasks: each is cancelled and waited for; None entries are skipped; an
error other than the cancellation still reaches the caller."""

from __future__ import annotations

import asyncio

import pytest

from specroute.tasks import cancel


def test_cancel_ends_every_task_and_waits_for_it() -> None:
    async def run() -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(asyncio.sleep(60)) for _ in range(3)]
        await asyncio.sleep(0)
        await cancel([tasks[0], None, *tasks[1:]])
        return tasks

    tasks = asyncio.run(run())
    assert all(t.done() and t.cancelled() for t in tasks)


def test_an_error_other_than_the_cancellation_comes_through() -> None:
    async def failing() -> None:
        raise RuntimeError("boom")

    async def run() -> None:
        task = asyncio.create_task(failing())
        await asyncio.sleep(0)
        await cancel([task])

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(run())
