"""``tidings serve`` refuses at start a number of processes whose connections
could exceed PostgreSQL's ``max_connections`` (or the CONNECTION LIMIT of its
role), and bounds ``--workers``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trio

from tests.roles import login_role
from tests.test_e2e import free_port, service_env
from tidings.config import Config
from tidings.connection_limits import (
    OWN_CONNECTIONS,
    connection_shortfall,
    connections_per_process,
)
from tidings.http.system import Readiness
from tidings.service import Service
from tidings.workers import MAX_WORKERS


async def test_own_connections_are_the_listeners_of_a_running_service(
    service: Service,
) -> None:
    """Every LISTEN connection a process opens beside its pools is counted:
    one per dispatcher, the revocation listener, and /readyz's check."""
    names = [child.name for child in service.runtime.children()]
    listeners = [n for n in names if n.endswith("-dispatcher") or n == "revocations"]
    assert len(listeners) + 1 == OWN_CONNECTIONS, names


def test_the_shortfall_names_the_numbers_and_what_to_change() -> None:
    config = Config(db_pool_size=10)
    assert connections_per_process(config) == 2 * 10 + OWN_CONNECTIONS
    assert connection_shortfall(config, 3, 100, 3) is None  # 84 of 97
    problem = connection_shortfall(config, 8, 100, 3)
    assert problem is not None
    assert "--workers 8 may open up to 224 connections" in problem
    assert "TIDINGS_DB_POOL_SIZE=10" in problem
    assert "allows 97 (max_connections 100 minus 3 reserved)" in problem
    assert "use --workers 3 or fewer" in problem
    assert "max_connections" in problem and "\n" not in problem


async def refused(arguments: list[str], env: dict[str, str]) -> str:
    """The stderr of ``tidings serve ...`` that must exit 1 on its own."""
    command = [sys.executable, "-m", "tidings", "serve", "--port", str(free_port()), *arguments]
    process = await trio.lowlevel.open_process(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    try:
        with trio.fail_after(60):
            stderr = b""
            while chunk := await process.stderr.receive_some():
                stderr += chunk
            assert await process.wait() == 1, stderr.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return stderr.decode()


async def test_workers_beyond_the_embedded_servers_limit_are_refused(tmp_path: Path) -> None:
    # The embedded PostgreSQL allows 100 connections, 3 kept for superusers.
    env = {**service_env(tmp_path / "data"), "TIDINGS_DB_POOL_SIZE": "40"}
    stderr = await refused(["--workers", "2"], env)
    assert "tidings: --workers 2 may open up to 176 connections to PostgreSQL" in stderr
    assert "raise the server's max_connections" in stderr
    assert "Traceback" not in stderr


async def test_one_process_beyond_the_limit_is_refused(tmp_path: Path) -> None:
    env = {**service_env(tmp_path / "data"), "TIDINGS_DB_POOL_SIZE": "60"}
    stderr = await refused([], env)
    assert "tidings: one process may open up to 128 connections to PostgreSQL" in stderr
    assert "Traceback" not in stderr


async def test_workers_are_bounded(tmp_path: Path) -> None:
    stderr = await refused(["--workers", str(MAX_WORKERS + 1)], service_env(tmp_path / "data"))
    assert f"tidings: --workers must be 1 to {MAX_WORKERS}" in stderr


async def test_a_roles_connection_limit_refuses_a_start_beyond_it(
    tmp_path: Path, database_url: str
) -> None:
    async with login_role(database_url, "limited", connection_limit=12) as (role, as_role):
        env = {**service_env(tmp_path / "data"), "DATABASE_URL": as_role}
        stderr = await refused([], env)
    assert f"but the role {role} may have 12 (its CONNECTION LIMIT)" in stderr
    assert "--workers 0" not in stderr  # not even one process fits: no such advice
    assert "use a smaller TIDINGS_DB_POOL_SIZE" in stderr
    assert "raise the role's CONNECTION LIMIT" in stderr
    assert "Traceback" not in stderr


def test_the_shortfall_gives_only_advice_that_can_be_followed() -> None:
    smallest = Config(db_pool_size=2)  # 12 connections a process
    problem = connection_shortfall(smallest, 1, 100, 3, role=("lim", 9))
    assert problem is not None
    assert problem.endswith("but the role lim may have 9 (its CONNECTION LIMIT); "
                            "raise the role's CONNECTION LIMIT")
    problem = connection_shortfall(Config(db_pool_size=4), 3, 100, 3, role=("lim", 20))
    assert problem is not None
    assert problem.endswith("; use --workers 1 or fewer, a smaller TIDINGS_DB_POOL_SIZE, "
                            "or raise the role's CONNECTION LIMIT")


async def test_readiness_names_a_refusal_for_too_many_connections(
    database_url: str, asyncio_bridge: None
) -> None:
    async with login_role(database_url, "full", connection_limit=0) as (role, as_role):
        problem = await Readiness(as_role).problem()
    assert problem == f'storage refuses more connections (too many connections for role "{role}")'
