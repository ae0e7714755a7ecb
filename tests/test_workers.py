"""`tidings serve --workers 2`: two processes answer on one port and stop together."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from tests.test_e2e import free_port, service_env, wait_healthy


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_two_workers_share_the_port_and_stop_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "2",
    ]
    process = await trio.lowlevel.open_process(
        command, env=service_env(tmp_path / "data"), stderr=subprocess.DEVNULL
    )
    try:
        await wait_healthy(url, process)
        pids: set[int] = set()
        with trio.fail_after(30):
            while len(pids) < 2:
                # A new connection each time: the kernel picks a worker per connection.
                async with httpx.AsyncClient() as client:
                    metrics = (await client.get(f"{url}/metrics")).text
                found = re.findall(r'tidings_process\{pid="(\d+)"', metrics)
                pids.update(int(pid) for pid in found)
        assert process.pid not in pids
        assert all(alive(pid) for pid in pids)

        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            assert await process.wait() == 0
        assert not any(alive(pid) for pid in pids)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_workers_on_the_embedded_database_replay_sealed_responses(tmp_path: Path) -> None:
    """A response that shows a secret is stored sealed; every worker can open it,
    so a retry of the request replays it whichever worker takes it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(tmp_path / "data")
    command = [
        sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "2",
    ]
    process = await trio.lowlevel.open_process(command, env=env, stderr=subprocess.DEVNULL)
    try:
        await wait_healthy(url, process)
        created = await trio.run_process(
            [sys.executable, "-m", "tidings", "tokens", "create", "--team", "acme", "--all",
             "--step-up"],
            env=env, capture_stdout=True,
        )
        token = json.loads(created.stdout)["token"]
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "new-token"}
        body = {"permissions": ["contacts:read"]}
        answers = []
        for _ in range(16):
            # A new connection each time: the kernel picks a worker per connection.
            async with httpx.AsyncClient(base_url=url, headers=headers) as client:
                answers.append(await client.post("/tokens", json=body))
        first, replays = answers[0], answers[1:]
        assert first.status_code == 201, first.text
        assert [r.status_code for r in replays] == [201] * len(replays), [
            r.text for r in replays if r.status_code != 201]
        assert all(r.headers["Idempotent-Replayed"] == "true" for r in replays)
        assert {r.content for r in replays} == {first.content}
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            await process.wait()
