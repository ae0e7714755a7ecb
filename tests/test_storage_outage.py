"""A database outage is 503 SERVICE_UNAVAILABLE with the envelope, not a 500 (CONTRACT §2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from tests.test_e2e import free_port, service_env, wait_healthy


async def test_requests_during_a_database_outage_are_503(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path / "data")
    command = [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1",
               "--port", str(port)]
    process = await trio.lowlevel.open_process(command, env=env, stderr=subprocess.DEVNULL)
    try:
        await wait_healthy(url, process)
        created = await trio.run_process(
            [sys.executable, "-m", "tidings", "tokens", "create", "--team", "acme", "--all"],
            env=env, capture_stdout=True,
        )
        headers = {"Authorization": f"Bearer {json.loads(created.stdout)['token']}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            assert (await client.get("/contacts")).status_code == 200
            # The embedded PostgreSQL stops (a fast shutdown, as an operator's would).
            pid_file = next((tmp_path / "data").rglob("postmaster.pid"))
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
            with trio.fail_after(30):
                while (await client.get("/readyz")).status_code != 503:
                    await trio.sleep(0.1)
            answers = [
                # The process is up, its storage is not (the check /readyz
                # just made, reused for a second: the server is restarted
                # within seconds).
                await client.get("/healthz"),
                await client.get("/contacts"),  # a storage-unit route
                await client.post("/contacts", json={"email": "ada@example.com"}),
                await client.get("/webhook-endpoints"),  # a route served through Quart
                await client.get("/contacts", headers={"Authorization": "Bearer svc_team_x"}),
            ]
            # Liveness is the event loop's alone.
            live = await client.get("/livez")
            assert live.status_code == 200 and live.json()["data"] == {"status": "alive"}
        for answer in answers:
            assert answer.status_code == 503, answer.text
            assert answer.headers["Retry-After"] == "1"
            error = answer.json()["error"]
            assert error["code"] == "SERVICE_UNAVAILABLE"
            assert "storage" in error["message"]
    finally:
        process.kill()
        await process.wait()
