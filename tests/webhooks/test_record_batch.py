"""Recording a batch of attempts in one statement: as if recorded one by one, in order."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import pytest
import trio
import trio.testing

from tidings.actors.webhooks import RecordFailed, SharedRecorder
from tidings.config import Config
from tidings.storage import tokens as token_store
from tidings.storage import webhook_delivery as store
from tidings.storage import webhooks as webhook_store
from tidings.storage.db import open_database
from tidings.storage.events import record_event

OWNER = uuid4()


def outcome(status: str) -> store.Outcome:
    now = datetime.now(UTC)
    if status == "succeeded":
        return store.Outcome(now, 3, 200, "ok", None, "succeeded")
    if status == "retrying":
        return store.Outcome(now, 3, 500, "", "the endpoint answered 500", "retrying", 60.0)
    return store.Outcome(now, 3, 500, "", "the endpoint answered 500", "failed")


async def endpoint_after(
    config: Config, sequence: list[str], *, failures_before: int = 0, threshold: int = 3
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Claim len(sequence) deliveries, record the outcomes in one batch in that order."""
    async with open_database(config) as db:
        async with db.acquire() as conn:
            team_id = await token_store.ensure_team(conn, "acme")
            endpoint = await webhook_store.create_endpoint(
                conn, team_id, url="https://example.com/hook", events=["*"],
                description=None, secret="whsec_test",
            )
            await conn.execute(
                "UPDATE webhook_endpoints SET consecutive_failures = $2 WHERE id = $1",
                endpoint.id, failures_before,
            )
            for _ in sequence:
                await record_event(
                    conn, team_id, "message.delivered", channel="email", recipient="a@example.com"
                )
        claim = await db.run(store.claim_due, endpoint.id, OWNER, len(sequence), 30.0, 0.0)
        assert len(claim.deliveries) == len(sequence)
        pairs = zip(claim.deliveries, sequence, strict=True)
        done = [(claimed, outcome(s)) for claimed, s in pairs]
        await db.run(store.record_attempts, done, OWNER, threshold)
        async with db.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT status, consecutive_failures, disabled_reason, last_failure_at "
                "FROM webhook_endpoints WHERE id = $1", endpoint.id,
            )
            deliveries = await conn.fetch(
                "SELECT d.id, d.status, d.attempt_count, d.lease_owner, d.next_attempt_at, "
                "a.number, a.response_status FROM webhook_deliveries d "
                "JOIN webhook_attempts a ON a.delivery_id = d.id WHERE d.id = ANY($1)",
                [claimed.id for claimed in claim.deliveries],
            )
        by_id = {row["id"]: dict(row) for row in deliveries}
        return dict(row), [by_id[claimed.id] for claimed in claim.deliveries]


@pytest.mark.parametrize(
    ("sequence", "before", "failures", "status"),
    [
        (["succeeded", "succeeded"], 0, 0, "enabled"),
        (["succeeded"], 2, 0, "enabled"),
        (["failed", "failed"], 0, 2, "enabled"),
        (["failed"], 2, 3, "disabled"),
        (["failed", "succeeded", "failed"], 1, 1, "enabled"),
        # The threshold was reached before the success: disabled all the same.
        (["failed", "failed", "failed", "succeeded"], 0, 0, "disabled"),
        (["succeeded", "failed", "failed", "failed"], 2, 3, "disabled"),
        (["retrying", "retrying"], 2, 2, "enabled"),
    ],
)
async def test_the_endpoint_count_moves_as_if_recorded_one_by_one(
    config: Config, sequence: list[str], before: int, failures: int, status: str
) -> None:
    endpoint, deliveries = await endpoint_after(config, sequence, failures_before=before)
    assert endpoint["consecutive_failures"] == failures
    assert endpoint["status"] == status
    assert endpoint["disabled_reason"] == ("failure_threshold" if status == "disabled" else None)
    assert (endpoint["last_failure_at"] is not None) == ("failed" in sequence)
    for delivery, expected in zip(deliveries, sequence, strict=True):
        assert delivery["status"] == expected
        assert delivery["attempt_count"] == 1 and delivery["number"] == 1
        assert delivery["lease_owner"] is None
        assert (delivery["next_attempt_at"] is not None) == (expected == "retrying")


async def test_attempts_whose_lease_is_gone_record_nothing(config: Config) -> None:
    async with open_database(config) as db:
        async with db.acquire() as conn:
            team_id = await token_store.ensure_team(conn, "acme")
            endpoint = await webhook_store.create_endpoint(
                conn, team_id, url="https://example.com/hook", events=["*"],
                description=None, secret="whsec_test",
            )
            for _ in range(2):
                await record_event(
                    conn, team_id, "message.delivered", channel="email", recipient="a@example.com"
                )
        claim = await db.run(store.claim_due, endpoint.id, OWNER, 2, 30.0, 0.0)
        kept, taken = claim.deliveries
        async with db.acquire() as conn:
            await conn.execute(
                "UPDATE webhook_deliveries SET lease_owner = $2 WHERE id = $1", taken.id, uuid4()
            )
        done = [(kept, outcome("succeeded")), (taken, outcome("succeeded"))]
        await db.run(store.record_attempts, done, OWNER, 20)
        async with db.acquire() as conn:
            rows = await conn.fetch("SELECT id, status FROM webhook_deliveries")
            attempts = await conn.fetchval("SELECT count(*) FROM webhook_attempts")
    statuses: dict[UUID, str] = {row["id"]: row["status"] for row in rows}
    assert statuses == {kept.id: "succeeded", taken.id: "pending"}
    assert attempts == 1


async def test_the_shared_recorder_writes_what_gathers_meanwhile_in_one_batch() -> None:
    written: list[list[Any]] = []
    first_started = trio.Event()
    finish_first = trio.Event()

    async def write(items: list[Any]) -> None:
        written.append(list(items))
        if len(written) == 1:
            first_started.set()
            await finish_first.wait()

    recorder = SharedRecorder(write)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(recorder.record, ["a"])
        await first_started.wait()
        for item in ("b", "c", "d"):  # three actors finish while "a" is written
            nursery.start_soon(recorder.record, [item])
        await trio.testing.wait_all_tasks_blocked()
        finish_first.set()
    assert [sorted(batch) for batch in written] == [["a"], ["b", "c", "d"]]


async def test_a_failed_batch_fails_every_record_in_it() -> None:
    gate = trio.Event()
    failures: list[BaseException] = []

    async def write(items: list[Any]) -> None:
        if items != ["first"]:
            raise OSError("storage is gone")
        await gate.wait()

    recorder = SharedRecorder(write)

    async def record(item: str) -> None:
        try:
            await recorder.record([item])
        except RecordFailed as error:
            failures.append(error)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(record, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(record, "b")
        nursery.start_soon(record, "c")
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert len(failures) == 2
    assert all(isinstance(error.__cause__, OSError) for error in failures)
