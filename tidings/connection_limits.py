"""How many connections to PostgreSQL the processes of ``tidings serve`` may
open, checked against what the server, the role and the database allow
before any process opens its pools."""

from __future__ import annotations

import logging

import triopg

from tidings.config import Config
from tidings.config_values import MIN_POOL_SIZE
from tidings.storage.db import open_asyncio_bridge

log = logging.getLogger("tidings")

# Connections a process opens besides its two pools of TIDINGS_DB_POOL_SIZE
# (the trio side's and the storage units', tidings.storage.db): one LISTEN
# per due work's dispatcher (emails 2, SMS 2, webhooks 1, broadcasts 1), the
# token revocation listener, and /readyz's check (one at a time).
# tests/test_connection_limit.py counts them on a running service.
OWN_CONNECTIONS = 8

CONNECTION_LIMIT = """
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS superuser_reserved,
       coalesce(current_setting('reserved_connections', true), '0')::int AS reserved,
       (SELECT count(*) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid())::int AS others,
       -- A CONNECTION LIMIT of the role or of the database (-1: none; a
       -- superuser is held by neither).
       CASE WHEN r.rolsuper THEN -1 ELSE r.rolconnlimit END AS role_limit,
       CASE WHEN r.rolsuper THEN -1 ELSE d.datconnlimit END AS database_limit,
       r.rolname AS role, d.datname AS database
FROM pg_roles r, pg_database d
WHERE r.rolname = current_user AND d.datname = current_database()
"""


def connections_per_process(config: Config) -> int:
    """The most connections one ``tidings serve`` process opens at once."""
    return 2 * config.db_pool_size + OWN_CONNECTIONS


def connection_shortfall(
    config: Config, count: int, max_connections: int, reserved: int,
    *, role: tuple[str, int] = ("", -1), database: tuple[str, int] = ("", -1),
) -> str | None:
    """Why ``count`` processes do not fit in the server's ``max_connections``
    minus the ``reserved`` slots (for superusers and roles with
    pg_use_reserved_connections), or in the CONNECTION LIMIT of the ``role``
    or the ``database`` (name, limit; -1 for none), in one line; None when
    they fit."""
    each = connections_per_process(config)
    limits = [(max_connections - reserved, f"the server allows {max_connections - reserved} "
               f"(max_connections {max_connections} minus {reserved} reserved)",
               "raise the server's max_connections")]
    for kind, (name, limit) in (("role", role), ("database", database)):
        if limit >= 0:
            limits.append((limit, f"the {kind} {name} may have {limit} (its CONNECTION "
                           "LIMIT)", f"raise the {kind}'s CONNECTION LIMIT"))
    allowed, why, remedy = min(limits)
    if count * each <= allowed:
        return None
    processes = f"--workers {count}" if count > 1 else "one process"
    fit = allowed // each
    # Only advice that can be followed: no "--workers 0", no pool below its minimum.
    uses = [f"--workers {fit} or fewer"] if fit >= 1 else []
    if config.db_pool_size > MIN_POOL_SIZE:
        uses.append("a smaller TIDINGS_DB_POOL_SIZE")
    advice = f"use {', '.join(uses)}, or {remedy}" if uses else remedy
    return (
        f"{processes} may open up to {count * each} connections to PostgreSQL ({each} "
        f"per process: two pools of TIDINGS_DB_POOL_SIZE={config.db_pool_size} and "
        f"{OWN_CONNECTIONS} of its own), but {why}; {advice}"
    )


async def check_connections(url: str, config: Config, count: int) -> None:
    """Refuse (SystemExit, one line) ``count`` processes that together may
    open more connections than the server at ``url`` allows.

    Connections open now by other clients do not refuse a start (a set still
    draining in a rolling deploy holds some for a moment): they only log a
    warning when what is left of the limit is too little.
    """
    async with open_asyncio_bridge(), triopg.connect(url) as conn:
        row = await conn.fetchrow(CONNECTION_LIMIT)
    reserved = row["superuser_reserved"] + row["reserved"]
    problem = connection_shortfall(
        config, count, row["max_connections"], reserved,
        role=(row["role"], row["role_limit"]), database=(row["database"], row["database_limit"]),
    )
    if problem is not None:
        raise SystemExit(f"tidings: {problem}")
    needed = count * connections_per_process(config)
    left = row["max_connections"] - reserved - row["others"]
    if needed > left:
        log.warning(
            "%d connections to PostgreSQL are open by other clients: %d are left of its "
            "limit, and these processes may need up to %d", row["others"], left, needed)
    # Once the database answered: a command that cannot reach it says only that.
    warn_of_unshared_key(config)


def warn_of_unshared_key(config: Config) -> None:
    """With DATABASE_URL but no TIDINGS_SECRET_KEY: one warning of what differs
    between processes elsewhere on the same database."""
    if config.database_url and config.secret_key is None:
        log.warning(
            "TIDINGS_SECRET_KEY is not set: replayable responses that show a secret are "
            "sealed with a key made for this run (and handed to its workers), which "
            "processes on other hosts using the same database do not have (their replays "
            "get 409); and processes that do have a TIDINGS_SECRET_KEY sign unsubscribe "
            "links and bounce addresses with another key than this one (the links of one "
            "answer 404 on the other). Set the same TIDINGS_SECRET_KEY in every process"
        )
