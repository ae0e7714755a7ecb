"""Domain verification by real DNS lookups against a name server on loopback,
and the periodic re-verification that notices a record disappearing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from tests.conftest import assert_error
from tests.email.conftest import dns_config
from tests.email.dns_server import Zone
from tests.http.audience import ok
from tidings.config import Config
from tidings.email.dns import Resolver, check
from tidings.email.records import Record
from tidings.email.verification import recheck_due
from tidings.service import Service


@pytest.fixture
def config(database_url: str, zone: tuple[Zone, tuple[str, int]]) -> Config:
    return dns_config(database_url, zone[1])


def by_purpose(domain: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {record["purpose"]: record for record in domain["records"]}


def publish(zone: Zone, domain: dict[str, Any], *skip: str) -> None:
    for purpose, record in by_purpose(domain).items():
        if purpose in skip:
            continue
        if record["type"] == "MX":
            zone.mx(record["name"], record["value"])
        else:
            zone.txt(record["name"], record["value"])


async def verify(client: httpx.AsyncClient, domain: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = ok(await client.post(f"/domains/{domain['id']}/verify"))
    return data


def statuses(domain: dict[str, Any]) -> dict[str, str]:
    return {purpose: record["status"] for purpose, record in by_purpose(domain).items()}


async def test_nothing_published_is_missing(
    client: httpx.AsyncClient, zone: tuple[Zone, Any]
) -> None:
    domain = ok(await client.post("/domains", json={"name": "example.com"}), 201)
    checked = await verify(client, domain)
    assert checked["status"] == "failed" and checked["verified_at"] is None
    assert statuses(checked) == dict.fromkeys(("spf", "dkim", "dmarc", "return_path"), "missing")
    asked = {(name, kind) for name, kind in zone[0].queries}
    assert asked == {(r["name"], r["type"]) for r in domain["records"]}


async def test_every_record_verified(client: httpx.AsyncClient, zone: tuple[Zone, Any]) -> None:
    domain = ok(await client.post("/domains", json={"name": "example.com"}), 201)
    publish(zone[0], domain)
    checked = await verify(client, domain)
    assert statuses(checked) == dict.fromkeys(("spf", "dkim", "dmarc", "return_path"), "verified")
    assert checked["status"] == "verified" and checked["verified_at"]


async def test_spf_and_dkim_are_enough(client: httpx.AsyncClient, zone: tuple[Zone, Any]) -> None:
    domain = ok(await client.post("/domains", json={"name": "example.com"}), 201)
    publish(zone[0], domain, "dmarc", "return_path")
    checked = await verify(client, domain)
    assert statuses(checked) == {
        "spf": "verified", "dkim": "verified", "dmarc": "missing", "return_path": "missing"
    }
    assert checked["status"] == "verified"


async def test_mismatches(client: httpx.AsyncClient, zone: tuple[Zone, Any]) -> None:
    domain = ok(await client.post("/domains", json={"name": "example.com"}), 201)
    other = ok(await client.post("/domains", json={"name": "other.example"}), 201)
    records = by_purpose(domain)
    z = zone[0]
    # An SPF record without the mail host, a DKIM record with another key, a
    # TXT record that is not DMARC, an MX to somewhere else.
    z.txt(records["spf"]["name"], "v=spf1 include:_spf.elsewhere.example -all", "site-verify=1")
    z.txt(records["dkim"]["name"], by_purpose(other)["dkim"]["value"])
    z.txt(records["dmarc"]["name"], "hello")
    z.mx(records["return_path"]["name"], "mx.elsewhere.example")
    checked = await verify(client, domain)
    assert statuses(checked) == dict.fromkeys(("spf", "dkim", "dmarc", "return_path"), "mismatch")
    assert checked["status"] == "failed"

    # The owner's SPF record may hold other mechanisms besides ours; a stricter
    # DMARC policy is fine; the DKIM value may be split in several strings.
    z.txt(records["spf"]["name"], "v=spf1 include:_spf.google.com a:MX.tidings.example -all")
    z.txt(records["dkim"]["name"], records["dkim"]["value"])
    z.txt(records["dmarc"]["name"], "v=DMARC1; p=reject; rua=mailto:d@example.com")
    z.mx(records["return_path"]["name"], "mx.tidings.example")
    checked = await verify(client, domain)
    assert statuses(checked) == dict.fromkeys(("spf", "dkim", "dmarc", "return_path"), "verified")
    assert checked["status"] == "verified"


async def test_no_answer_changes_nothing(
    client: httpx.AsyncClient, zone: tuple[Zone, Any]
) -> None:
    domain = ok(await client.post("/domains", json={"name": "example.com"}), 201)
    zone[0].servfail = True
    message = assert_error(
        await client.post(f"/domains/{domain['id']}/verify"), 503, "SERVICE_UNAVAILABLE"
    )
    assert "DNS" in message and "SERVFAIL" in message
    # The kind of failure, not the operator's name servers.
    assert "127.0.0.1" not in message and "Do53" not in message
    assert ok(await client.get(f"/domains/{domain['id']}")) == domain


async def test_recheck_records_a_record_that_disappears(
    client: httpx.AsyncClient, zone: tuple[Zone, Any], service: Service
) -> None:
    z = zone[0]
    kept = ok(await client.post("/domains", json={"name": "kept.example"}), 201)
    lost = ok(await client.post("/domains", json={"name": "lost.example"}), 201)
    pending = ok(await client.post("/domains", json={"name": "pending.example"}), 201)
    publish(z, kept)
    publish(z, lost)
    kept = await verify(client, kept)
    lost = await verify(client, lost)
    config = service.config.with_(domain_recheck_seconds=3600)

    # Nothing is due within the interval.
    assert await recheck_due(service.db, config) == []
    z.queries.clear()
    dkim = by_purpose(lost)["dkim"]
    z.remove(dkim["name"], "TXT")
    due_now = config.with_(domain_recheck_seconds=0.001)
    await trio.sleep(0.01)
    lapses = await recheck_due(service.db, due_now)
    assert [(lapse.domain.name, lapse.record.purpose) for lapse in lapses] == [
        ("lost.example", "dkim")
    ]
    # Only verified domains are looked up again.
    assert not any("pending.example" in name for name, _ in z.queries)
    assert ok(await client.get(f"/domains/{pending['id']}"))["status"] == "pending"

    now_lost = ok(await client.get(f"/domains/{lost['id']}"))
    assert now_lost["status"] == "failed"
    assert now_lost["verified_at"] == lost["verified_at"]
    assert now_lost["last_checked_at"] > lost["last_checked_at"]
    record = by_purpose(now_lost)["dkim"]
    assert record["status"] == "missing"
    assert record["changed_at"] > by_purpose(lost)["dkim"]["changed_at"]
    assert by_purpose(now_lost)["spf"]["changed_at"] == by_purpose(lost)["spf"]["changed_at"]
    now_kept = ok(await client.get(f"/domains/{kept['id']}"))
    assert now_kept["status"] == "verified" and statuses(now_kept) == statuses(kept)
    assert now_kept["last_checked_at"] > kept["last_checked_at"]

    # A failed domain is no longer re-verified; publishing and verifying again restores it.
    z.queries.clear()
    await trio.sleep(0.01)
    assert await recheck_due(service.db, due_now) == []
    assert not any("lost.example" in name for name, _ in z.queries)
    publish(z, lost)
    assert (await verify(client, lost))["status"] == "verified"


async def test_a_recheck_never_overwrites_a_verify_made_meanwhile(
    client: httpx.AsyncClient, zone: tuple[Zone, Any], service: Service
) -> None:
    """The periodic check asked while a record was missing; the record came
    back and a verify found it before that check's answers arrived: the
    later verify stands."""
    z = zone[0]
    domain = ok(await client.post("/domains", json={"name": "race.example"}), 201)
    publish(z, domain)
    domain = await verify(client, domain)
    dkim = by_purpose(domain)["dkim"]
    z.remove(dkim["name"], "TXT")
    z.delay = 1.0
    z.queries.clear()
    await trio.sleep(0.01)
    found: list[Any] = []
    async with trio.open_nursery() as nursery:
        async def recheck() -> None:
            found.extend(await recheck_due(
                service.db, service.config.with_(domain_recheck_seconds=0.001)))

        nursery.start_soon(recheck)
        with trio.fail_after(5):
            while not any(name == dkim["name"] for name, _ in z.queries):
                await trio.sleep(0.01)
        publish(z, domain)
        z.delay = 0.0
        assert (await verify(client, domain))["status"] == "verified"
    assert found == []  # its answers came after the verify: not stored
    assert ok(await client.get(f"/domains/{domain['id']}"))["status"] == "verified"


async def test_recheck_inconclusive_changes_nothing(
    client: httpx.AsyncClient, zone: tuple[Zone, Any], service: Service
) -> None:
    domain = ok(await client.post("/domains", json={"name": "example.com"}), 201)
    publish(zone[0], domain)
    domain = await verify(client, domain)
    zone[0].servfail = True
    await trio.sleep(0.01)
    assert await recheck_due(service.db, service.config.with_(domain_recheck_seconds=0.001)) == []
    assert ok(await client.get(f"/domains/{domain['id']}")) == domain


async def test_long_txt_records_are_joined(zone: tuple[Zone, tuple[str, int]]) -> None:
    value = "v=DKIM1; k=rsa; p=" + "A" * 600
    zone[0].txt("s._domainkey.example.com", value)
    record = Record("TXT", "s._domainkey.example.com", value, "dkim")
    assert await check(Resolver([zone[1]]), [record]) == ["verified"]


async def test_spf_mechanism_with_the_pass_qualifier(
    client: httpx.AsyncClient, zone: tuple[Zone, Any]
) -> None:
    """``+`` is the default qualifier (RFC 7208 §4.6.2): ``+a:host`` is the
    mechanism; with ``-``, ``~`` or ``?`` it does not pass, so it does not count."""
    domain = ok(await client.post("/domains", json={"name": "example.com"}), 201)
    publish(zone[0], domain)
    spf = by_purpose(domain)["spf"]["name"]
    for value, status in (
        ("v=spf1 +a:mx.tidings.example ~all", "verified"),
        ("v=spf1 include:_spf.google.com +A:MX.Tidings.Example -all", "verified"),
        ("v=spf1 -a:mx.tidings.example ~all", "mismatch"),
        ("v=spf1 ~a:mx.tidings.example ~all", "mismatch"),
        ("v=spf1 ?a:mx.tidings.example ~all", "mismatch"),
        ("v=spf1 ++a:mx.tidings.example ~all", "mismatch"),
    ):
        zone[0].txt(spf, value)
        checked = await verify(client, domain)
        assert statuses(checked)["spf"] == status, value
        assert checked["status"] == ("verified" if status == "verified" else "failed"), value


async def test_records_a_receiver_would_not_use(
    client: httpx.AsyncClient, zone: tuple[Zone, Any]
) -> None:
    """Records with the right host or key that receivers discard or fail on:
    a DKIM record of another version or for ed25519 keys, SPF that never
    reaches our host or comes twice, DMARC of another version or twice."""
    domain = ok(await client.post("/domains", json={"name": "example.com"}), 201)
    publish(zone[0], domain)
    records = by_purpose(domain)
    z = zone[0]
    key = records["dkim"]["value"].split("p=")[1]
    for spf, dkim, dmarc in (
        (("v=spf1 -all a:mx.tidings.example",), f"v=DKIM2; k=rsa; p={key}", "v=DMARC1x"),
        (("v=spf1 a:mx.tidings.example ~all", "v=spf1 ~all"), f"V=DKIM1; K=RSA; P={key}",
         "v=dmarc1; p=none"),
        (("v=spf1 a:mx.tidings.example ~all",), f"v=DKIM1; k=ed25519; p={key}",
         ("v=DMARC1; p=none", "v=DMARC1; p=reject")),
    ):
        z.txt(records["spf"]["name"], *spf)
        z.txt(records["dkim"]["name"], dkim)
        z.txt(records["dmarc"]["name"], *([dmarc] if isinstance(dmarc, str) else dmarc))
        checked = await verify(client, domain)
        assert checked["status"] == "failed", (spf, dkim, dmarc)
        assert statuses(checked)["dkim"] == "mismatch", dkim
        assert statuses(checked)["dmarc"] == "mismatch", dmarc
    # Not an SPF record at all.
    z.txt(records["spf"]["name"], "v=spf10 a:mx.tidings.example ~all")
    assert statuses(await verify(client, domain))["spf"] == "missing"
    publish(z, domain)
    assert (await verify(client, domain))["status"] == "verified"


async def test_a_team_verifies_at_most_two_domains_at_once(
    client: httpx.AsyncClient, zone: tuple[Zone, Any]
) -> None:
    """Each verification waits on name servers the team runs, holding a
    pooled connection: a third at once is 429, and the two go on."""
    domains = [ok(await client.post("/domains", json={"name": f"d{n}.example"}), 201)
               for n in range(3)]
    zone[0].delay = 1.5
    answers: dict[int, httpx.Response] = {}
    took: dict[int, float] = {}

    async def verify_one(n: int) -> None:
        await trio.sleep(0.2 * n)  # the third starts while the first two wait on DNS
        started = trio.current_time()
        answers[n] = await client.post(f"/domains/{domains[n]['id']}/verify")
        took[n] = trio.current_time() - started

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(verify_one, n)
    assert [answers[n].status_code for n in range(3)] == [200, 200, 429]
    assert_error(answers[2], 429, "TOO_MANY_REQUESTS")
    assert answers[2].headers["Retry-After"] == "1" and took[2] < 1.0
    # Once they are done, the third may go.
    zone[0].delay = 0
    assert ok(await client.post(f"/domains/{domains[2]['id']}/verify"))["status"] == "failed"
