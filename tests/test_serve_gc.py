"""``tidings serve`` keeps its start-up objects out of later garbage collections."""

from __future__ import annotations

import gc
from functools import partial

import trio

from tidings.app import serve
from tidings.config import Config


async def test_serving_freezes_what_start_up_built(config: Config) -> None:
    assert gc.get_freeze_count() == 0
    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(serve, config, "127.0.0.1", 0, shutdown_trigger=stop.wait)
            )
            # Routes, models and the pool are in the permanent generation.
            assert gc.get_freeze_count() > 10_000
            stop.set()
    finally:
        gc.unfreeze()
