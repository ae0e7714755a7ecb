"""`tidings serve` as a real process on a fresh data dir, driven over a socket."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def service_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["TIDINGS_DATA_DIR"] = str(data_dir)
    return env


async def wait_healthy(url: str, process: trio.Process) -> None:
    async with httpx.AsyncClient() as client:
        with trio.fail_after(90):
            while True:
                assert process.returncode is None, "tidings serve exited early"
                try:
                    if (await client.get(f"{url}/healthz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.2)


@asynccontextmanager
async def tidings_serve(command: list[str], env: dict[str, str], url: str) -> AsyncIterator[None]:
    """Run ``tidings serve`` until the block ends, then SIGTERM it: it must exit 0
    within 10 s."""
    process = await trio.lowlevel.open_process(command, env=env, stderr=subprocess.DEVNULL)
    try:
        await wait_healthy(url, process)
        yield
        started = trio.current_time()
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            code = await process.wait()
        assert code == 0
        assert trio.current_time() - started < 10
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_serve_on_a_fresh_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = service_env(data_dir)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1", "--port", str(port)]

    async with tidings_serve(command, env, url):
        created = await trio.run_process(
            [sys.executable, "-m", "tidings", "tokens", "create", "--team", "acme", "--all"],
            env=env, capture_stdout=True,
        )
        lines = created.stdout.decode().strip().splitlines()
        assert len(lines) == 1
        credential = json.loads(lines[0])
        assert set(credential) == {"team_id", "token_id", "token"}
        assert credential["token"].startswith("svc_team_")

        headers = {"Authorization": f"Bearer {credential['token']}"}
        async with httpx.AsyncClient(base_url=url, headers=headers) as client:
            response = await client.post("/contacts", json={"email": "ada@example.com"})
            assert response.status_code == 201
            contact = response.json()["data"]
            assert contact["team_id"] == credential["team_id"]

    # The data outlives the process: a new one on the same dir still has it.
    async with tidings_serve(command, env, url):
        async with httpx.AsyncClient(base_url=url, headers=headers) as client:
            again = await client.get(f"/contacts/{contact['id']}")
        assert again.status_code == 200
        assert again.json()["data"] == contact


async def test_a_prometheus_directory_left_in_the_environment_is_not_used(
    tmp_path: Path,
) -> None:
    """A single process keeps its metrics to itself: a PROMETHEUS_MULTIPROC_DIR
    meant for another program (here one that no longer exists) neither stops it
    from starting nor takes its counters."""
    env = {**service_env(tmp_path / "data"), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "gone")}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1", "--port", str(port)]
    async with tidings_serve(command, env, url):
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/no-such-route")).status_code == 404
            text = (await client.get("/metrics")).text
    counted = re.findall(r'^tidings_http_requests_total\{[^}]*status="404"[^}]*\} (\S+)$', text,
                         re.M)
    assert counted == ["1.0"]
    assert not (tmp_path / "gone").exists()
