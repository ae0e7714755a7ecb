"""An error left on the asyncio side with no one to await it is logged; it
does not end the process."""

from __future__ import annotations

import gc
import logging

import pytest
import trio
import trio_asyncio


async def test_an_unawaited_error_on_the_asyncio_side_is_logged_not_raised(
    asyncio_bridge: None, caplog: pytest.LogCaptureFixture
) -> None:
    # What asyncpg leaves behind when a server in crash recovery refuses a
    # connection during its TLS negotiation: a future whose error no one reads.
    loop = trio_asyncio.current_loop.get()
    future = loop.create_future()
    future.set_exception(ConnectionError("unexpected connection_lost() call"))
    with caplog.at_level(logging.WARNING, logger="tidings.storage"):
        del future
        gc.collect()
        await trio.sleep(0.1)  # where trio-asyncio's own handler raises it
    assert "Future exception was never retrieved" in caplog.text
    assert "unexpected connection_lost() call" in caplog.text
