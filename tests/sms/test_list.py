"""GET /sms: the spec's behaviour 4, each filter at its edges."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import httpx
import pytest

from tests.conftest import MakeToken, assert_error
from tests.sms.helpers import ok, send
from tidings.service import Service

BASE = datetime(2024, 3, 10, 12, 0, 0, tzinfo=UTC)


async def listed(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    data = ok(await client.get("/sms", params=params))
    assert isinstance(data, list)
    return data


def bodies(found: list[dict[str, Any]]) -> list[str]:
    return [sms["body"] for sms in found]


@pytest.fixture
async def four(sms_client: httpx.AsyncClient, service: Service) -> httpx.AsyncClient:
    """Four messages created one hour apart from BASE, with known statuses and ids."""
    ok(await sms_client.post("/sender-ids", json={"value": "Shop", "type": "alphanumeric"}), 201)
    rows = [
        ("+14155550100", "Acme", "Your code is 1234", "delivered", "SMabc123"),
        ("+14155550101", "Shop", "Order SHIPPED", "failed", "SMdef456"),
        ("+442079460958", "Acme", "50% off_today", "queued", None),
        ("+14155550103", "Shop", "See you at 10", "delivered", "SMxyzABC"),
    ]
    for hour, (to, sender, body, status, message_id) in enumerate(rows):
        sms = await send(sms_client, to=to, **{"from": sender}, body=body,
                         scheduled_at=(datetime.now(UTC) + timedelta(days=1)).isoformat())
        async with service.db.acquire() as conn:
            await conn.execute(
                "UPDATE sms_messages SET status = $2, message_id = $3, created_at = $4, "
                "next_attempt_at = NULL WHERE id = $1",
                UUID(sms["id"]), status, message_id, BASE + timedelta(hours=hour),
            )
    return sms_client


async def test_newest_first_as_an_array(four: httpx.AsyncClient) -> None:
    assert bodies(await listed(four)) == [
        "See you at 10", "50% off_today", "Order SHIPPED", "Your code is 1234",
    ]


@pytest.mark.parametrize(("limit", "count"), [("1", 1), ("4", 4), ("100", 4), ("101", 4),
                                              ("100000", 4)])
async def test_limit(four: httpx.AsyncClient, limit: str, count: int) -> None:
    assert len(await listed(four, limit=limit)) == count


@pytest.mark.parametrize("limit", ["0", "-1", "abc", "2.5", "1e2", ""])
async def test_bad_limits_are_400(four: httpx.AsyncClient, limit: str) -> None:
    assert "limit" in assert_error(await four.get("/sms", params={"limit": limit}), 400,
                                   "BAD_REQUEST")


async def test_offset(four: httpx.AsyncClient) -> None:
    assert bodies(await listed(four, offset="3")) == ["Your code is 1234"]
    assert await listed(four, offset="4") == []
    assert bodies(await listed(four, limit="1", offset="1")) == ["50% off_today"]
    for bad in ("-1", "x", "1.5"):
        assert_error(await four.get("/sms", params={"offset": bad}), 400, "BAD_REQUEST")


async def test_status_is_exact_and_known(four: httpx.AsyncClient) -> None:
    assert bodies(await listed(four, status="delivered")) == ["See you at 10", "Your code is 1234"]
    assert await listed(four, status="expired") == []
    for bad in ("DELIVERED", "deliver", "bounced"):
        assert_error(await four.get("/sms", params={"status": bad}), 400, "BAD_REQUEST")


async def test_sender_is_exact_on_from(four: httpx.AsyncClient) -> None:
    assert bodies(await listed(four, sender="Shop")) == ["See you at 10", "Order SHIPPED"]
    assert await listed(four, sender="shop") == []
    assert await listed(four, sender="Sho") == []


async def test_a_long_code_sender_with_an_unencoded_plus_is_read_as_written(
    four: httpx.AsyncClient,
) -> None:
    ok(await four.post("/sender-ids", json={"value": "+14155550199", "type": "long_code"}), 201)
    await send(four, **{"from": "+14155550199"}, body="From the long code")
    assert bodies(await listed(four, sender="+14155550199")) == ["From the long code"]
    # "+" unencoded arrives as a space: read as the "+" it was, as in dates.
    spaced = await four.get("/sms?sender=+14155550199")
    assert bodies(ok(spaced)) == ["From the long code"]
    # Only a space and digits: nothing else is taken for a number.
    assert await listed(four, sender=" Shop") == []
    assert await listed(four, sender="  14155550199") == []


async def test_dates_are_inclusive_and_take_offsets(four: httpx.AsyncClient) -> None:
    # 13:00Z and 14:00Z exactly, both included.
    both = await listed(four, start_date="2024-03-10T13:00:00Z", end_date="2024-03-10T14:00:00Z")
    assert bodies(both) == ["50% off_today", "Order SHIPPED"]
    # The same instants written with offsets.
    offsets = await listed(four, start_date="2024-03-10T15:00:00+02:00",
                           end_date="2024-03-10T09:00:00-05:00")
    assert bodies(offsets) == ["50% off_today", "Order SHIPPED"]
    # An unencoded "+" arrives as a space: read as the "+" it was.
    spaced = await four.get("/sms?start_date=2024-03-10T15:00:00+02:00")
    assert bodies(ok(spaced)) == ["See you at 10", "50% off_today", "Order SHIPPED"]
    assert bodies(await listed(four, end_date="2024-03-10T12:59:59.999999Z")) == [
        "Your code is 1234"
    ]
    assert bodies(await listed(four, start_date="2024-03-10T15:00:00.000001Z")) == []
    same = await listed(four, start_date="2024-03-10T12:00:00Z", end_date="2024-03-10T12:00:00Z")
    assert bodies(same) == ["Your code is 1234"]


async def test_a_start_finer_than_microseconds_excludes_what_came_before(
    four: httpx.AsyncClient,
) -> None:
    """Times are kept to microseconds: a start 1 ns after a message's creation
    must not list it (a client paging by "last seen + 1 ns" would see it twice)."""
    end = "2024-03-10T13:30:00Z"  # "Order SHIPPED" was created at 13:00:00Z
    assert await listed(four, start_date="2024-03-10T13:00:00.000000001Z", end_date=end) == []
    assert bodies(await listed(four, start_date="2024-03-10T13:00:00.000000000Z",
                               end_date=end)) == ["Order SHIPPED"]
    # RFC 3339 takes any number of digits: every one of them counts.
    assert await listed(four, start_date="2024-03-10T13:00:00.000000000001Z", end_date=end) == []
    assert bodies(await listed(four, start_date="2024-03-10T13:00:00." + "0" * 30 + "Z",
                               end_date=end)) == ["Order SHIPPED"]
    # The same nanosecond as start and end is no inverted range: 200, nothing in it.
    moment = "2024-03-10T14:00:00.000000500Z"
    assert await listed(four, start_date=moment, end_date=moment) == []
    # An end 100 ns before the start precedes it, within one microsecond too.
    inverted = await four.get("/sms", params={
        "start_date": "2024-03-10T14:00:00.0000001Z", "end_date": "2024-03-10T14:00:00Z"})
    assert "end_date" in assert_error(inverted, 400, "BAD_REQUEST")
    inverted = await four.get("/sms", params={
        "start_date": "2024-03-10T14:00:00.0000000000002Z",
        "end_date": "2024-03-10T14:00:00.0000000000001Z"})
    assert "end_date" in assert_error(inverted, 400, "BAD_REQUEST")
    # The next microsecond after the last one a date can hold: 400, not 500.
    late = await four.get("/sms", params={"start_date": "9999-12-31T23:59:59.9999999Z"})
    assert "start_date" in assert_error(late, 400, "BAD_REQUEST")


@pytest.mark.parametrize(
    "params",
    [
        {"start_date": "2024-03-10T14:00:00Z", "end_date": "2024-03-10T13:59:59Z"},
        {"start_date": "2024-03-10T14:00:00+01:00", "end_date": "2024-03-10T12:59:59Z"},
        {"start_date": "yesterday"},
        {"end_date": "2024-03-10T14:00:00"},
        {"start_date": "2024-13-10T14:00:00Z"},
        # A Unix time or a bare date is not RFC 3339.
        {"start_date": "1700000000"},
        {"end_date": "1700000000"},
        {"start_date": "2024-03-10"},
        # Moments a datetime cannot hold once their offset is applied.
        {"start_date": "0001-01-01T00:00:00+14:00"},
        {"end_date": "9999-12-31T23:59:59-12:00"},
        # The first and last microsecond: the driver's -infinity and infinity.
        {"start_date": "0001-01-01T00:00:00Z"},
        {"end_date": "9999-12-31T23:59:59.999999Z"},
    ],
)
async def test_bad_dates_are_400(four: httpx.AsyncClient, params: dict[str, str]) -> None:
    message = assert_error(await four.get("/sms", params=params), 400, "BAD_REQUEST")
    assert next(iter(params)) in message


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("5550101", ["Order SHIPPED"]),  # recipient
        ("+4420", ["50% off_today"]),
        ("sho", ["See you at 10", "Order SHIPPED"]),  # sender, any case
        ("shipped", ["Order SHIPPED"]),  # body, mixed case
        ("ShIpPeD", ["Order SHIPPED"]),
        ("code is", ["Your code is 1234"]),
        ("smxyz", ["See you at 10"]),  # provider message id
        ("DEF4", ["Order SHIPPED"]),
        ("%", ["50% off_today"]),  # wildcards are literal
        ("_", ["50% off_today"]),
        ("1", ["See you at 10", "Order SHIPPED", "Your code is 1234"]),
        ("Z", ["See you at 10"]),  # one character, other case
        ("q", []),  # one character, absent
        ("Sh", ["See you at 10", "Order SHIPPED"]),  # two, in sender and body
        ("0958", ["50% off_today"]),  # digits of a recipient
        ("14155550103", ["See you at 10"]),
        ("nothing like it", []),
        ("acme\x1fyour", []),  # never across two fields
    ],
)
async def test_search_is_partial_and_case_insensitive_across_four_fields(
    four: httpx.AsyncClient, term: str, expected: list[str]
) -> None:
    assert bodies(await listed(four, search=term)) == expected


async def test_search_ignores_case_for_letters_lower_case_leaves_apart(
    sms_client: httpx.AsyncClient,
) -> None:
    for body in ("Καλώς ήρθες Οδυσσέας", "Grüße aus der Straße"):
        await send(sms_client, to="+14155550100", body=body)
    for term, expected in [
        ("ΟΔΥΣΣΈΑΣ", ["Καλώς ήρθες Οδυσσέας"]),  # capital Σ, final ς
        ("οδυσσέασ", ["Καλώς ήρθες Οδυσσέας"]),
        ("ΟΔΥΣΣΈΑς", ["Καλώς ήρθες Οδυσσέας"]),
        ("STRASSE", ["Grüße aus der Straße"]),  # ß and SS
        ("straße", ["Grüße aus der Straße"]),
        ("GRÜSSE AUS", ["Grüße aus der Straße"]),
    ]:
        assert bodies(await listed(sms_client, search=term)) == expected, term


async def test_filters_combine(four: httpx.AsyncClient) -> None:
    found = await listed(four, status="delivered", sender="Shop", search="10",
                         start_date="2024-03-10T00:00:00Z", end_date="2024-03-11T00:00:00Z")
    assert bodies(found) == ["See you at 10"]


async def test_another_teams_messages_are_never_listed(
    four: httpx.AsyncClient, base_url: str, make_token: MakeToken
) -> None:
    other = await make_token(team="other")
    async with httpx.AsyncClient(base_url=base_url, headers=other.headers) as them:
        assert ok(await them.get("/sms")) == []
        assert ok(await them.get("/sms", params={"search": "code"})) == []
        assert ok(await them.get("/sms", params={"status": "delivered"})) == []
        assert ok(await them.get("/sms", params={"sender": "Acme"})) == []
