"""Migrations: ordered, applied once, safe when two processes start together."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import triopg

from tests.conftest import fresh_database
from tests.roles import login_role
from tidings.storage.migrate import load_migrations, migrate


@pytest.fixture
async def empty_database(pg_admin_url: str, asyncio_bridge: None) -> AsyncIterator[str]:
    async with fresh_database(pg_admin_url) as url:
        yield url


def test_migrations_are_numbered_in_order() -> None:
    versions = [m.version for m in load_migrations()]
    assert versions == sorted(versions)
    assert versions[0] == 1
    assert len(set(versions)) == len(versions)


async def test_concurrent_starts_apply_each_migration_once(empty_database: str) -> None:
    results: list[list[str]] = []

    async def start() -> None:
        async with triopg.connect(empty_database) as conn:
            results.append(await migrate(conn))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(start)
    applied = [name for result in results for name in result]
    expected = [f"{m.version:04d}_{m.name}" for m in load_migrations()]
    assert applied == expected
    async with triopg.connect(empty_database) as conn:
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
        assert [r["version"] for r in rows] == [m.version for m in load_migrations()]
        # And a later start has nothing to do.
        assert await migrate(conn) == []


async def test_hard_bounce_suppressions_become_bounce(
    empty_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 0018 renames the reason to CONTRACT §7's `bounce`, rows included."""
    import tidings.storage.migrate as migrate_module

    everything = load_migrations()
    monkeypatch.setattr(migrate_module, "load_migrations",
                        lambda: [m for m in everything if m.version < 18])
    async with triopg.connect(empty_database) as conn:
        await migrate(conn)
        team = await conn.fetchval("INSERT INTO teams (name) VALUES ('acme') RETURNING id")
        await conn.execute(
            "INSERT INTO suppressions (team_id, address, kind, reason) VALUES "
            "($1, 'gone@example.com', 'email', 'hard_bounce'), "
            "($1, 'angry@example.com', 'email', 'complaint')", team)
        monkeypatch.setattr(migrate_module, "load_migrations", lambda: everything)
        assert "0018_suppression_reason_bounce" in await migrate(conn)
        rows = await conn.fetch("SELECT address, reason FROM suppressions ORDER BY address")
        assert [(r["address"], r["reason"]) for r in rows] == [
            ("angry@example.com", "complaint"), ("gone@example.com", "bounce")]
        with pytest.raises(Exception, match="suppressions_reason_check"):
            await conn.execute(
                "INSERT INTO suppressions (team_id, address, kind, reason) VALUES "
                "($1, 'x@example.com', 'email', 'hard_bounce')", team)


async def test_a_migration_waiting_for_a_lock_gives_way_to_running_processes(
    empty_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling upgrade: processes of the version before keep using a
    table that a migration must lock, while a long read holds it. The
    migration waits LOCK_TIMEOUT_MS at a time, then gives way, so their
    queries are held up for that long at most, not for the whole read; it
    applies once the read ends."""
    import tidings.storage.migrate as migrate_module

    everything = load_migrations()
    monkeypatch.setattr(migrate_module, "load_migrations",
                        lambda: [m for m in everything if m.version < 26])
    async with triopg.connect(empty_database) as conn:
        await migrate(conn)
    monkeypatch.setattr(migrate_module, "load_migrations", lambda: everything)
    monkeypatch.setattr(migrate_module, "LOCK_TIMEOUT_MS", 300)
    monkeypatch.setattr(migrate_module, "RETRY_PAUSE_SECONDS", 0.3)
    waits: list[float] = []
    applied: list[str] = []
    async with triopg.connect(empty_database) as reader, \
            triopg.connect(empty_database) as upgrading, \
            triopg.connect(empty_database) as running:
        await reader.execute("BEGIN")
        await reader.fetchval("SELECT count(*) FROM webhook_deliveries")  # a long read

        async def upgrade() -> None:
            applied.extend(await migrate(upgrading))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(upgrade)
                for _ in range(12):  # 3 s of the old version's traffic on emails
                    started = trio.current_time()
                    await running.fetchval("SELECT count(*) FROM emails")
                    waits.append(trio.current_time() - started)
                    await trio.sleep(0.25)
                assert applied == []  # it waits for the read still
                await reader.execute("COMMIT")  # the read ends: the migration goes on
    assert applied == [f"{m.version:04d}_{m.name}" for m in everything if m.version >= 26]
    assert applied[0] == "0026_message_rows_without_foreign_keys"
    assert max(waits) < 1.0, waits  # not the 3 s the read held its table


async def test_a_role_that_may_not_create_runs_on_a_migrated_database(database_url: str) -> None:
    # A cautious operator's role: it uses the tables, it may not create any.
    async with login_role(database_url, "user") as (role, as_role):
        async with triopg.connect(database_url) as conn:
            await conn.execute(f'REVOKE CREATE ON SCHEMA public FROM "{role}", PUBLIC')
            await conn.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"')
            await conn.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
        async with triopg.connect(as_role) as conn:
            assert await migrate(conn) == []  # nothing to apply, nothing created
