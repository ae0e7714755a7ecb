"""Team quotas against the real database: no overshoot under concurrency, all or
nothing, resets at UTC day and month boundaries, the CLI, and the 402."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
import trio

from tidings.cli import manage_quotas, parser
from tidings.config import Config, QuotaDefaults
from tidings.http.app import create_app
from tidings.http.envelope import payment_required
from tidings.service import Service
from tidings.storage import quotas
from tidings.storage import tokens as token_store
from tidings.storage.db import Database, open_database
from tidings.storage.quotas import LimitChange, QuotaExceeded

UNLIMITED = QuotaDefaults()
NOON = datetime(2030, 3, 14, 12, 0, tzinfo=UTC)


@pytest.fixture
async def db(config: Config) -> AsyncIterator[Database]:
    async with open_database(config.with_(db_pool_size=22)) as database:
        yield database


async def make_team(db: Database, name: str = "acme") -> UUID:
    async with db.transaction() as conn:
        return await token_store.ensure_team(conn, name)


async def set_limit(db: Database, team_id: UUID, *changes: LimitChange) -> None:
    async with db.transaction() as conn:
        await quotas.set_limits(conn, team_id, changes)


async def claim(
    db: Database,
    team_id: UUID,
    count: int,
    defaults: QuotaDefaults = UNLIMITED,
    now: datetime = NOON,
    channel: quotas.Channel = "email",
) -> quotas.Usage:
    async with db.transaction() as conn:
        return await quotas.claim(conn, team_id, channel, count, defaults, now=now)


async def status(
    db: Database, team_id: UUID, defaults: QuotaDefaults = UNLIMITED, now: datetime = NOON
) -> dict[str, tuple[int | None, int]]:
    async with db.acquire() as conn:
        found = await quotas.quota_status(conn, team_id, defaults, now)
    return {f"{s.channel}/{s.period}": (s.limit, s.used) for s in found}


@pytest.mark.parametrize("source", ["team", "default"])
async def test_concurrent_claims_at_the_edge_never_overshoot(db: Database, source: str) -> None:
    team_id = await make_team(db)
    defaults = UNLIMITED
    if source == "team":
        await set_limit(db, team_id, LimitChange("email", "day", 7))
    else:
        # No counter row exists yet: the first claims race to insert it.
        defaults = QuotaDefaults(emails_per_day=7)
    won: list[int] = []
    refused: list[QuotaExceeded] = []
    start = trio.Event()

    async def one() -> None:
        await start.wait()
        try:
            async with db.transaction() as conn:
                usage = await quotas.claim(conn, team_id, "email", 1, defaults, now=NOON)
                # Hold the row lock a little, as a send's transaction would.
                await trio.sleep(0.01)
            won.append(usage.day_used)
        except QuotaExceeded as exceeded:
            refused.append(exceeded)

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(one)
        await trio.sleep(0.05)
        start.set()
    assert len(won) == 7 and max(won) <= 7
    assert len(refused) == 13
    assert {(r.period, r.limit, r.used, r.requested) for r in refused} == {("day", 7, 7, 1)}
    assert (await status(db, team_id, defaults))["email/day"] == (7, 7)


async def test_claims_of_one_team_do_not_wait_for_each_others_commit(db: Database) -> None:
    team_id = await make_team(db)
    await set_limit(db, team_id, LimitChange("email", "day", 1000))
    await claim(db, team_id, 1)  # shares the limit out among the stripes
    async with db.transaction() as holding:
        await quotas.claim(holding, team_id, "email", 1, UNLIMITED, now=NOON)
        # Another send of the team, while the first has not committed yet.
        with trio.fail_after(5):
            assert (await claim(db, team_id, 1)).day_used >= 2
    assert (await status(db, team_id))["email/day"] == (1000, 3)


async def test_many_concurrent_claims_never_pass_a_limit_shared_among_stripes(
    db: Database,
) -> None:
    team_id = await make_team(db)
    await set_limit(db, team_id, LimitChange("sms", "month", 25))
    outcomes: list[bool] = []

    async def one() -> None:
        try:
            async with db.transaction() as conn:
                await quotas.claim(conn, team_id, "sms", 1, UNLIMITED, now=NOON)
                await trio.sleep(0.001)
            outcomes.append(True)
        except QuotaExceeded:
            outcomes.append(False)

    async with trio.open_nursery() as nursery:
        for _ in range(40):
            nursery.start_soon(one)
    assert (outcomes.count(True), outcomes.count(False)) == (25, 15)
    assert (await status(db, team_id))["sms/month"] == (25, 25)


async def test_a_lowered_limit_holds_at_once_and_a_raised_one_frees_room(db: Database) -> None:
    team_id = await make_team(db)
    await set_limit(db, team_id, LimitChange("email", "day", 100))
    await claim(db, team_id, 5)
    await set_limit(db, team_id, LimitChange("email", "day", 6))
    await claim(db, team_id, 1)
    with pytest.raises(QuotaExceeded) as refused:
        await claim(db, team_id, 1)
    assert (refused.value.limit, refused.value.used) == (6, 6)
    await set_limit(db, team_id, LimitChange("email", "day", 0))
    assert (await claim(db, team_id, 500)).day_used == 506
    await set_limit(db, team_id, LimitChange("email", "day", 507))
    await claim(db, team_id, 1)
    with pytest.raises(QuotaExceeded):
        await claim(db, team_id, 1)


async def test_a_claim_that_would_cross_the_edge_fails_whole(db: Database) -> None:
    team_id = await make_team(db)
    await set_limit(db, team_id, LimitChange("email", "day", 7))
    assert (await claim(db, team_id, 5)).day_used == 5
    with pytest.raises(QuotaExceeded) as refused:
        await claim(db, team_id, 3)
    assert (refused.value.used, refused.value.requested, refused.value.quota) == (
        5, 3, "emails_per_day",
    )
    assert (await status(db, team_id))["email/day"] == (7, 5)
    assert (await claim(db, team_id, 2)).day_used == 7


async def test_a_first_claim_larger_than_the_default_fails(db: Database) -> None:
    team_id = await make_team(db)
    defaults = QuotaDefaults(emails_per_month=7)
    with pytest.raises(QuotaExceeded) as refused:
        await claim(db, team_id, 8, defaults)
    assert (refused.value.quota, refused.value.used, refused.value.retry_after) == (
        "emails_per_month", 0, None,
    )
    assert await status(db, team_id, defaults) == {
        "email/day": (None, 0), "email/month": (7, 0), "sms/day": (None, 0), "sms/month": (None, 0),
    }
    # A team whose own limit is higher is not held to the default.
    await set_limit(db, team_id, LimitChange("email", "month", 8))
    assert (await claim(db, team_id, 8, defaults)).month_used == 8


async def test_a_refused_claim_leaves_the_transaction_usable(db: Database) -> None:
    team_id = await make_team(db)
    await set_limit(db, team_id, LimitChange("sms", "month", 2))
    async with db.transaction() as conn:
        with pytest.raises(QuotaExceeded):
            await quotas.claim(conn, team_id, "sms", 3, UNLIMITED, now=NOON)
        usage = await quotas.claim(conn, team_id, "sms", 2, UNLIMITED, now=NOON)
    assert (usage.day_used, usage.month_used) == (2, 2)


async def test_a_rolled_back_send_gives_its_claim_back(db: Database) -> None:
    team_id = await make_team(db)
    with pytest.raises(RuntimeError):
        async with db.transaction() as conn:
            await quotas.claim(conn, team_id, "email", 4, UNLIMITED, now=NOON)
            raise RuntimeError("the send failed")
    assert (await status(db, team_id))["email/day"] == (None, 0)


async def test_channels_and_teams_count_apart(db: Database) -> None:
    acme, other = await make_team(db, "acme"), await make_team(db, "other")
    defaults = QuotaDefaults(emails_per_day=3, sms_per_day=1)
    await claim(db, acme, 3, defaults)
    await claim(db, acme, 1, defaults, channel="sms")
    await claim(db, other, 3, defaults)
    with pytest.raises(QuotaExceeded) as refused:
        await claim(db, acme, 1, defaults, channel="sms")
    assert refused.value.quota == "sms_per_day"
    assert "quota of 1 SMS per day is used up" in refused.value.message


async def test_the_monthly_quota_is_reported_when_it_blocks(db: Database) -> None:
    team_id = await make_team(db)
    defaults = QuotaDefaults(emails_per_day=7, emails_per_month=10)
    await claim(db, team_id, 7, defaults)
    await claim(db, team_id, 2, defaults, now=NOON + timedelta(days=1))
    with pytest.raises(QuotaExceeded) as refused:
        await claim(db, team_id, 2, defaults, now=NOON + timedelta(days=1))
    exceeded = refused.value
    assert (exceeded.quota, exceeded.limit, exceeded.used) == ("emails_per_month", 10, 9)
    assert exceeded.resets_at == datetime(2030, 4, 1, tzinfo=UTC)
    assert "it resets at 2030-04-01T00:00:00Z" in exceeded.message


async def test_unlimited_counts_without_limit(db: Database) -> None:
    team_id = await make_team(db)
    usage = await claim(db, team_id, 1_000_000)
    assert (usage.day_used, usage.month_used) == (1_000_000, 1_000_000)


@pytest.mark.parametrize(
    ("now", "day", "month"),
    [
        (datetime(2030, 1, 31, 23, 59, 59, 999999, UTC), (2030, 2, 1), (2030, 2, 1)),
        (datetime(2030, 2, 1, 0, 0, tzinfo=UTC), (2030, 2, 2), (2030, 3, 1)),
        (datetime(2030, 12, 31, 23, 59, 59, tzinfo=UTC), (2031, 1, 1), (2031, 1, 1)),
        (datetime(2028, 2, 28, 12, 0, tzinfo=UTC), (2028, 2, 29), (2028, 3, 1)),
        (datetime(2028, 2, 29, 23, 0, tzinfo=UTC), (2028, 3, 1), (2028, 3, 1)),
        # Another offset: 20:00 at -05:00 is already the next UTC day and month.
        (datetime.fromisoformat("2030-01-31T20:00:00-05:00"), (2030, 2, 2), (2030, 3, 1)),
    ],
)
def test_reset_times(now: datetime, day: tuple[int, int, int], month: tuple[int, int, int]) -> None:
    assert quotas.resets_at("day", now) == datetime(*day, tzinfo=UTC)
    assert quotas.resets_at("month", now) == datetime(*month, tzinfo=UTC)


async def test_counters_restart_at_the_day_and_month_boundaries(db: Database) -> None:
    team_id = await make_team(db)
    defaults = QuotaDefaults(sms_per_day=2, sms_per_month=3)
    last_second = datetime(2030, 1, 31, 23, 59, 59, tzinfo=UTC)
    await claim(db, team_id, 2, defaults, last_second, "sms")
    with pytest.raises(QuotaExceeded) as refused:
        await claim(db, team_id, 1, defaults, last_second, "sms")
    assert refused.value.resets_at == datetime(2030, 2, 1, tzinfo=UTC)
    assert refused.value.retry_after == 1
    # A new UTC day and month: both counters start again.
    midnight = datetime(2030, 2, 1, tzinfo=UTC)
    usage = await claim(db, team_id, 2, defaults, midnight, "sms")
    assert (usage.day_used, usage.month_used) == (2, 2)
    # The next day counts on in the same month until the monthly limit.
    usage = await claim(db, team_id, 1, defaults, midnight + timedelta(days=1), "sms")
    assert (usage.day_used, usage.month_used) == (1, 3)
    with pytest.raises(QuotaExceeded) as refused:
        await claim(db, team_id, 1, defaults, midnight + timedelta(days=2), "sms")
    assert (refused.value.quota, refused.value.resets_at) == (
        "sms_per_month", datetime(2030, 3, 1, tzinfo=UTC),
    )


async def test_a_clock_behind_counts_into_the_newer_period(db: Database) -> None:
    team_id = await make_team(db)
    await claim(db, team_id, 1, now=NOON + timedelta(days=1))
    usage = await claim(db, team_id, 1, now=NOON)
    assert (usage.day_used, usage.month_used) == (2, 2)


def test_exceeded_message_and_retry_after() -> None:
    now = datetime(2030, 3, 14, 23, 0, 0, 500000, UTC)
    reset = quotas.resets_at("day", now)
    used_up = QuotaExceeded("email", "day", 7, 7, 1, reset, now)
    assert used_up.message == (
        "the team's quota of 7 emails per day is used up (7 used, 1 requested); "
        "it resets at 2030-03-15T00:00:00Z"
    )
    assert used_up.retry_after == 3600
    error = payment_required(used_up)
    assert (error.status, error.code, error.message) == (402, "PAYMENT_REQUIRED", used_up.message)
    assert error.headers == {"Retry-After": "3600"}
    # Larger than the quota itself: waiting does not help, so no Retry-After.
    too_big = QuotaExceeded("email", "day", 7, 0, 50, reset, now)
    assert too_big.retry_after is None
    assert too_big.message.startswith("50 emails are more than the team's quota of 7 emails")
    assert payment_required(too_big).headers == {}


async def test_limits_set_and_back_to_the_default(db: Database) -> None:
    team_id = await make_team(db)
    defaults = QuotaDefaults(emails_per_day=100, sms_per_month=5)
    await claim(db, team_id, 3, defaults)
    await set_limit(db, team_id, LimitChange("email", "day", 7), LimitChange("sms", "day", 0))
    assert await status(db, team_id, defaults) == {
        "email/day": (7, 3), "email/month": (None, 3), "sms/day": (None, 0), "sms/month": (5, 0),
    }
    # A change leaves the other limits of the team alone.
    await set_limit(db, team_id, LimitChange("email", "month", 50))
    await set_limit(db, team_id, LimitChange("email", "day", None))
    assert await status(db, team_id, defaults) == {
        "email/day": (100, 3), "email/month": (50, 3), "sms/day": (None, 0), "sms/month": (5, 0),
    }


async def test_cli_set_and_show(db: Database, config: Config) -> None:
    team_id = await make_team(db)
    config = config.with_(quotas=QuotaDefaults(emails_per_day=100))

    async def run(*argv: str) -> dict[str, object]:
        return await manage_quotas(config, parser().parse_args(["quotas", *argv]))

    shown = await run("show", "--team", "acme")
    assert shown["team_id"] == str(team_id) and shown["team"] == "acme"
    assert shown["emails_per_day"] == {
        "limit": 100, "default": True, "used": 0, "resets_at": shown["emails_per_day"]["resets_at"],  # type: ignore[index]
    }
    assert shown["sms_per_month"]["limit"] is None  # type: ignore[index]
    shown = await run("set", "--team", "acme", "--emails-per-day", "7", "--sms-per-month", "0")
    assert shown["emails_per_day"]["limit"] == 7  # type: ignore[index]
    assert shown["emails_per_day"]["default"] is False  # type: ignore[index]
    assert shown["sms_per_month"] == {**shown["sms_per_month"], "limit": None, "default": False}  # type: ignore[dict-item]
    await claim(db, team_id, 7, config.quotas, datetime.now(UTC))
    shown = await run("set", "--team", "acme", "--emails-per-day", "default")
    assert shown["emails_per_day"]["limit"] == 100  # type: ignore[index]
    assert shown["emails_per_day"]["used"] == 7  # type: ignore[index]
    assert (await run("show", "--team", " acme "))["team_id"] == str(team_id)
    with pytest.raises(SystemExit, match="no team 'nobody'"):
        await run("show", "--team", "nobody")
    with pytest.raises(SystemExit, match="--team: a team name must not contain control"):
        await run("show", "--team", "ac\x00me")


async def test_cli_refuses_set_without_a_limit(db: Database, config: Config) -> None:
    await make_team(db)
    args = parser().parse_args(["quotas", "set", "--team", "acme"])
    with pytest.raises(SystemExit, match="needs at least one --emails-per-\\* or --sms-per-"):
        await manage_quotas(config, args)


@pytest.mark.parametrize(
    ("value", "error"),
    [("-1", "must be 0 (unlimited) or more"), ("lots", "must be a whole number or 'default'")],
)
def test_cli_refuses_bad_limits(
    value: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["quotas", "set", "--team", "acme", "--sms-per-day", value])
    assert error in capsys.readouterr().err


async def test_cli_prints_one_line_of_json(database_url: str, db: Database) -> None:
    await make_team(db)
    env = {**os.environ, "DATABASE_URL": database_url, "TIDINGS_QUOTA_SMS_PER_DAY": "25"}
    done = await trio.run_process(
        [sys.executable, "-m", "tidings", "quotas", "set", "--team", "acme", "--emails-per-month",
         "1000"],
        env=env, capture_stdout=True, capture_stderr=True,
    )
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1
    shown = json.loads(lines[0])
    assert shown["emails_per_month"]["limit"] == 1000
    assert shown["sms_per_day"] == {**shown["sms_per_day"], "limit": 25, "default": True}


async def test_the_http_layer_answers_402(service: Service) -> None:
    app = create_app(service)
    now = datetime.now(UTC)

    async def send() -> None:
        raise QuotaExceeded("sms", "day", 5, 5, 1, quotas.resets_at("day", now), now)

    app.add_url_rule("/quota-test", "quota-test", send, methods=["POST"])
    response = await app.test_client().post("/quota-test")
    assert response.status_code == 402
    body = await response.get_json()
    assert body["success"] is False and body["error"]["code"] == "PAYMENT_REQUIRED"
    assert body["error"]["message"].startswith("the team's quota of 5 SMS per day is used up")
    assert 0 < int(response.headers["Retry-After"]) <= 86400
