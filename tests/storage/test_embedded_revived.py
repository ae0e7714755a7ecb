"""An embedded PostgreSQL that stops under a running service (killed, out of
memory) is started again by the service, which then answers ready again."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.storage.test_hardening_embedded import postmaster_pid, wait_gone
from tidings.storage.embedded import process_exists


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(check: object, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]])
def test_a_stopped_embedded_server_is_started_again(tmp_path: Path, workers: list[str]) -> None:
    """By the one process, or by the parent of a set (its workers reach the
    server by its URL)."""
    data_dir, port = tmp_path / "data", free_port()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    log = tmp_path / "serve.log"  # a file: a pipe nobody reads would fill and block the service
    service = subprocess.Popen(
        [sys.executable, "-m", "tidings", "serve", "--port", str(port), *workers],
        env={**env, "TIDINGS_DATA_DIR": str(data_dir), "PYTHONPATH": os.getcwd()},
        stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )
    first = None
    try:
        assert wait_until(lambda: ready(port), 60), "the service never became ready"
        first = postmaster_pid(data_dir)
        assert first is not None
        os.kill(first, signal.SIGQUIT)  # an immediate stop: no clean shutdown
        assert wait_gone(first, within=10)
        assert wait_until(lambda: postmaster_pid(data_dir) not in (None, first), 30), (
            "the embedded PostgreSQL was not started again")
        second = postmaster_pid(data_dir)
        assert second is not None and process_exists(second)
        assert wait_until(lambda: ready(port), 30), "the service stayed unready"
        made = subprocess.run(
            [sys.executable, "-m", "tidings", "tokens", "create", "--team", "acme", "--all"],
            env={**env, "TIDINGS_DATA_DIR": str(data_dir), "PYTHONPATH": os.getcwd()},
            capture_output=True, text=True, timeout=60, check=True,
        )
        token = json.loads(made.stdout)["token"]
        listed = httpx.get(f"http://127.0.0.1:{port}/contacts",
                           headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert listed.status_code == 200, listed.text
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=60)
    stderr = log.read_text()
    assert service.returncode == 0, stderr[-2000:]
    assert "has stopped: starting it again" in stderr
    server = postmaster_pid(data_dir)
    if server is not None:
        assert wait_gone(server, within=15)
