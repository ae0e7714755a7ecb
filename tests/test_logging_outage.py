"""What the log shows of a database outage: asyncpg's pool logs each retry
of its connections, and an outage's are one line each, not a traceback."""

from __future__ import annotations

import logging

import pytest

from tidings.logging_setup import configure_logging

POOL = logging.getLogger("asyncpg.pool")


def test_the_pools_retries_in_an_outage_are_one_line_and_other_errors_keep_their_trace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("INFO")
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError:
            POOL.warning("Failed to restore the pool connection floor; retrying", exc_info=True)
        try:
            raise RuntimeError("a bug")
        except RuntimeError:
            POOL.warning("something else went wrong", exc_info=True)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    err = capsys.readouterr().err
    first, *rest = err.splitlines()
    assert first.endswith(
        "asyncpg.pool: Failed to restore the pool connection floor; retrying "
        "(ConnectionRefusedError: [Errno 111] Connection refused)"
    )
    assert "something else went wrong" in rest[0]
    assert rest[1] == "Traceback (most recent call last):"
    assert err.count("Traceback") == 1
