"""The last clean exit stops the embedded PostgreSQL even when a user that
joined it earlier died of kill -9 while this one ran."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.storage.test_hardening_embedded import postmaster_pid, start_user, wait_gone
from tidings.storage.embedded import HANDLE_LIST, process_exists


def test_the_last_clean_exit_forgets_users_killed_meanwhile(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    killed = start_user(data_dir)
    server = postmaster_pid(data_dir)
    assert server is not None and process_exists(server)
    try:
        survivor = start_user(data_dir)
        handles = json.loads((data_dir / "pg" / HANDLE_LIST).read_text())
        assert sorted(handles) == sorted([killed.pid, survivor.pid])
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert process_exists(server)  # kill -9 leaves the server running

        survivor.communicate("\n", timeout=30)
        assert survivor.returncode == 0
        assert wait_gone(server, within=10), "the embedded PostgreSQL is still running"
    finally:
        if process_exists(server):
            os.kill(server, signal.SIGTERM)
