"""A short overload of the real server: hundreds of connections for a few seconds.

No crash, no 5xx but the shedding 503, bounded memory, and a clean exit after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio
import triopg

from bench.harness import free_port
from bench.loadgen import run_load
from bench.overload import rss_mb
from tidings.permissions import ALL_PERMISSIONS
from tidings.storage import tokens as token_store

CONNECTIONS = 300
SECONDS = 3.0
RSS_LIMIT_MB = 250


async def make_secret(database_url: str) -> str:
    async with triopg.connect(database_url) as conn:
        team_id = await token_store.ensure_team(conn, "load")
        _, secret = await token_store.create_token(conn, team_id, ALL_PERMISSIONS)
    return secret


async def wait_ready(base_url: str, process: trio.Process) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=2) as client:
        with trio.fail_after(60):
            while True:
                assert process.poll() is None, "the server exited at start"
                try:
                    if (await client.get("/readyz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.1)


async def test_overload_sheds_without_crash_or_other_5xx(
    database_url: str, asyncio_bridge: None, tmp_path: Path
) -> None:
    secret = await make_secret(database_url)
    port = free_port()
    env = {
        **os.environ, "DATABASE_URL": database_url, "TIDINGS_RATE_LIMIT_PER_SECOND": "0",
        "TIDINGS_LOG_LEVEL": "WARNING", "PYTHONPATH": os.getcwd(),
    }
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tidings", "serve", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        await wait_ready(base_url, process)
        request = (
            f"GET /contacts?limit=10 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {secret}\r\n\r\n"
        ).encode()
        result = await run_load(
            "127.0.0.1", port, lambda: request,
            connections=CONNECTIONS, seconds=SECONDS, request_timeout=20,
        )
        rss = rss_mb(process.pid)
        assert process.poll() is None, log_path.read_text()
        kinds = dict(result.error_kinds)
        assert result.accepted > 0, kinds
        assert kinds.get("http_503", 0) > 0, "nothing was shed"
        server_errors = {k: n for k, n in kinds.items() if k.startswith("http_5")}
        assert set(server_errors) == {"http_503"}, (kinds, result.error_samples)
        other_http = {k for k in kinds if k.startswith("http_") and k != "http_503"}
        assert not other_http, (kinds, result.error_samples)
        shed = json.loads(result.error_samples["http_503"])
        assert shed["error"]["code"] == "SERVICE_UNAVAILABLE"
        assert "capacity" in shed["error"]["message"]
        assert 0 < rss < RSS_LIMIT_MB, f"RSS {rss:.0f} MB"
        async with httpx.AsyncClient(base_url=base_url, timeout=5) as client:
            assert (await client.get("/healthz")).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(20) as waiting:
            code = await process.wait()
        if waiting.cancelled_caught:
            process.kill()
            await process.wait()
            raise AssertionError("the server did not exit within 20 s of SIGTERM")
    assert code == 0, log_path.read_text()[-2000:]
    assert "Traceback" not in log_path.read_text()
