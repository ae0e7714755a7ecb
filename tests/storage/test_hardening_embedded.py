"""The embedded PostgreSQL stops with its last user, even after users died of kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tidings.storage.embedded import HANDLE_LIST, forget_dead_users, process_exists

# A user of the embedded server: starts (or joins) it, says so, then waits
# for a line on stdin and exits cleanly (pgserver's exit handler runs).
USER = """
import sys
from pathlib import Path
from tidings.storage.embedded import start_embedded
start_embedded(Path(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
"""


def start_user(data_dir: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", USER, str(data_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def wait_gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while process_exists(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_clean_exit_stops_the_server_a_killed_user_left(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    killed = start_user(data_dir)
    server = postmaster_pid(data_dir)
    assert server is not None and process_exists(server)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert process_exists(server)  # kill -9 leaves the server running

        survivor = start_user(data_dir)
        assert postmaster_pid(data_dir) == server  # it joined the running server
        handles = json.loads((data_dir / "pg" / HANDLE_LIST).read_text())
        assert handles == [survivor.pid]
        survivor.communicate("\n", timeout=30)
        assert survivor.returncode == 0
        assert wait_gone(server, within=10), "the embedded PostgreSQL is still running"
    finally:
        if process_exists(server):
            os.kill(server, signal.SIGTERM)


def test_only_dead_users_are_forgotten(tmp_path: Path) -> None:
    pgdata = tmp_path / "pg"
    pgdata.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (pgdata / HANDLE_LIST).write_text(json.dumps([os.getpid(), dead.pid]))
    assert forget_dead_users(pgdata) == [dead.pid]
    assert json.loads((pgdata / HANDLE_LIST).read_text()) == [os.getpid()]
    assert forget_dead_users(tmp_path / "missing") == []


def test_a_lock_file_whose_pid_is_another_process_now_is_stale(tmp_path: Path) -> None:
    """After a reboot the pid in postmaster.pid may name another process:
    the next start removes the stale file and starts the server, and leaves
    that process alone (pgserver would take it for the server, and stop it)."""
    data_dir = tmp_path / "data"
    first = start_user(data_dir)
    lock = (data_dir / "pg" / "postmaster.pid").read_text()
    server = postmaster_pid(data_dir)
    assert server is not None
    first.communicate("\n", timeout=30)
    assert wait_gone(server, within=10)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        # The server started an hour ago (before the reboot); its pid is the other's now.
        lines = lock.splitlines()
        lines[0], lines[2] = str(other.pid), str(int(time.time()) - 3600)
        (data_dir / "pg" / "postmaster.pid").write_text("\n".join(lines) + "\n")
        user = start_user(data_dir)
        started = postmaster_pid(data_dir)
        assert started not in (None, other.pid) and process_exists(started)
        user.communicate("\n", timeout=30)
        assert started is not None and wait_gone(started, within=10)
        assert other.poll() is None, "the process that took the pid was stopped"
    finally:
        other.kill()
        other.wait()


# Starts the embedded server, kills it, makes its start fail (a setting
# PostgreSQL refuses), lets the watch try once, puts things right, and lets
# it try again; prints whether the server then runs.
REVIVER = """
import logging, os, signal, sys
from pathlib import Path
from pgserver._commands import pg_ctl
from pgserver.postgres_server import PostgresServer
from tidings.storage.embedded import (
    keep_embedded_running, pgdata_of, process_exists, start_embedded)
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG %(name)s %(message)s")
data_dir = Path(sys.argv[1])
start_embedded(data_dir)
pid_file = data_dir / "pg" / "postmaster.pid"
pid = int(pid_file.read_text().split()[0])
# As a crash: an immediate stop (a kill -9 here could leave a zombie, which
# the machine's init may be slow to reap, that still looks like the server).
server = PostgresServer._instances[pgdata_of(data_dir)]
pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user)
settings = data_dir / "pg" / "postgresql.auto.conf"
kept = settings.read_text()
settings.write_text(kept + "\\nshared_buffers = 'plenty'\\n")
keep_embedded_running(data_dir)
print("failed-start-done", flush=True)
settings.write_text(kept)
keep_embedded_running(data_dir)
now = int(pid_file.read_text().split()[0])
print("running" if now != pid and process_exists(now) else "stopped", flush=True)
os.kill(now, signal.SIGTERM)
"""


def test_a_failed_restart_is_one_line_in_the_log_and_the_next_try_starts_it(
    tmp_path: Path,
) -> None:
    """pgserver logged the whole of PostgreSQL's log (thousands of lines on
    a data dir in use for a while) and Tidings a traceback, for each failed
    start of a server that had stopped under the service."""
    data_dir = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-c", REVIVER, str(data_dir)], capture_output=True, text=True,
        timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert done.stdout.split() == ["failed-start-done", "running"], (done.stdout, done.stderr)
    warning = next(line for line in done.stderr.splitlines()
                   if "could not be started again" in line)
    assert "pg_ctl ended with status" in warning and "trying again shortly" in warning
    assert "Traceback" not in done.stderr
    # pgserver's own record of the failure is one line that says where the log is.
    dump = [line for line in done.stderr.splitlines() if "Failed to start server" in line]
    assert dump and all("PostgreSQL's log: " in line for line in dump), done.stderr
    log = (data_dir / "pg" / "log").read_text()
    assert 'invalid value for parameter "shared_buffers"' in log  # there, not in ours
    assert 'invalid value for parameter "shared_buffers"' not in done.stderr


# Starts the embedded server, kills its postmaster (kill -9), and lets the
# watch revive it; prints whether a new server then runs.
KILLED = """
import os, signal, sys, time
from pathlib import Path
from tidings.storage.embedded import keep_embedded_running, process_exists, start_embedded
data_dir = Path(sys.argv[1])
start_embedded(data_dir)
pid_file = data_dir / "pg" / "postmaster.pid"
pid = int(pid_file.read_text().split()[0])
os.kill(pid, signal.SIGKILL)
while process_exists(pid):
    time.sleep(0.05)
keep_embedded_running(data_dir)
now = int(pid_file.read_text().split()[0])
print("running" if now != pid and process_exists(now) else "stopped", flush=True)
os.kill(now, signal.SIGTERM)
"""


def test_a_killed_server_is_started_again_even_before_it_is_reaped(tmp_path: Path) -> None:
    """A postmaster killed with kill -9 is a zombie until the process that
    inherited it reaps it (here the machine's first process, which takes its
    time; in a container, perhaps Tidings itself, never). pgserver took the
    zombie for a running server and left it so."""
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(tmp_path / "data")], capture_output=True,
        text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert done.stdout.split() == ["running"], (done.stdout, done.stderr[-3000:])
