"""Domain verification against a name server on loopback, as a receiver sees
the records: a slow name server and the lookup's budget, and an SPF record
whose mechanisms fail the mail host before our ``a:<mail host>`` is reached."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.email.conftest import dns_config
from tests.email.dns_server import Zone
from tests.email.test_verification import by_purpose
from tests.http.audience import ok
from tidings.config import Config
from tidings.email.dns import TIMEOUT_SECONDS, LookupFailed, Resolver, check
from tidings.email.records import Record


@pytest.fixture
def config(database_url: str, zone: tuple[Zone, tuple[str, int]]) -> Config:
    return dns_config(database_url, zone[1])


def publish(zone: Zone, domain: dict[str, Any]) -> None:
    for record in domain["records"]:
        if record["type"] == "MX":
            zone.mx(record["name"], record["value"])
        else:
            zone.txt(record["name"], record["value"])


async def test_the_budget_ends_a_lookup(zone: tuple[Zone, tuple[str, int]]) -> None:
    """A name server slower than the budget is no answer; within it, one is."""
    zone[0].txt("bounces.example.com", "v=spf1 a:mx.tidings.example ~all")
    zone[0].delay = 1.0
    record = Record("TXT", "bounces.example.com", "v=spf1 a:mx.tidings.example ~all", "spf")
    with pytest.raises(LookupFailed, match="TXT bounces.example.com"):
        await check(Resolver([zone[1]], timeout=0.5), [record])
    assert await check(Resolver([zone[1]], timeout=TIMEOUT_SECONDS), [record]) == ["verified"]


async def test_spf_failing_the_mail_host_before_our_mechanism(
    client: httpx.AsyncClient, zone: tuple[Zone, Any]
) -> None:
    """The MX of ``bounces.<domain>`` is the mail host (the return-path
    record): a receiver matches ``-mx`` there first and fails the mail host."""
    domain = ok(await client.post("/domains", json={"name": "example.com"}), 201)
    publish(zone[0], domain)
    spf = by_purpose(domain)["spf"]["name"]
    for value, status in (
        ("v=spf1 -mx a:mx.tidings.example ~all", "mismatch"),
        ("v=spf1 ~mx:bounces.example.com. a:mx.tidings.example ~all", "mismatch"),
        ("v=spf1 ?a:mx.tidings.example a:mx.tidings.example ~all", "mismatch"),
        ("v=spf1 a:mx.tidings.example -mx ~all", "verified"),
        ("v=spf1 mx -mx:mx.elsewhere.example a:mx.tidings.example -all", "verified"),
    ):
        zone[0].txt(spf, value)
        checked = ok(await client.post(f"/domains/{domain['id']}/verify"))
        assert by_purpose(checked)["spf"]["status"] == status, value
        assert checked["status"] == ("verified" if status == "verified" else "failed"), value
