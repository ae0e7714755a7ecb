"""The sandbox providers simulate every row of CONTRACT §9, by recipient."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tidings.config import Config
from tidings.providers.email import OutgoingEmail
from tidings.providers.sandbox import SandboxEmail, SandboxSms
from tidings.providers.select import open_email_provider, open_sms_provider
from tidings.providers.sms import OutgoingSms

TWO_SECONDS = timedelta(seconds=2)


def outgoing_email(*recipients: str) -> OutgoingEmail:
    return OutgoingEmail(
        message_id=uuid.uuid4(),
        team_id=uuid.uuid4(),
        sender="Acme <hello@acme.test>",
        return_paths=dict.fromkeys(recipients, "bounces@acme.test"),
        recipients=recipients,
        to=recipients,
        subject="Hi",
        text="Hello",
    )


def outgoing_sms(to: str) -> OutgoingSms:
    return OutgoingSms(
        message_id=uuid.uuid4(), team_id=uuid.uuid4(), to=to, sender="Acme", body="Hello"
    )


@pytest.mark.parametrize(
    ("recipient", "expected"),
    [
        ("ada@example.com", ["sent", "delivered"]),
        ("bounced@example.com", ["sent", "bounced"]),
        ("complained@example.com", ["sent", "complained"]),
        ("failed@example.com", ["sent", "failed"]),
        ("delayed@example.com", ["sent", "delivery_delayed", "delivered"]),
        ("bounced+7@example.com", ["sent", "bounced"]),
        ("complained+a.b@example.com", ["sent", "complained"]),
        ("failed+x@example.com", ["sent", "failed"]),
        ("delayed+tag@example.com", ["sent", "delivery_delayed", "delivered"]),
        ("Bounced@Example.com", ["sent", "bounced"]),
        # Only the local part counts, and only all of it (before a +tag).
        ("ada@bounced.example.com", ["sent", "delivered"]),
        ("bouncedx@example.com", ["sent", "delivered"]),
        ("x+bounced@example.com", ["sent", "delivered"]),
    ],
)
async def test_email_outcome_table(recipient: str, expected: list[str]) -> None:
    result = await SandboxEmail().send(outgoing_email(recipient))
    assert result.provider == "sandbox"
    assert [o.type for o in result.outcomes] == expected
    assert all(o.recipient == recipient for o in result.outcomes)
    assert result.deferred == ()
    # "sent" is now, recorded with the attempt; the rest is later, within 2 s, in order.
    assert [o.type for o in result.now()] == ["sent"]
    later = result.later()
    assert [o.type for o in later] == expected[1:]
    assert all(timedelta(0) < o.after < TWO_SECONDS for o in later)
    assert [o.after for o in later] == sorted({o.after for o in later})
    assert all(o.code and o.message for o in result.outcomes)


async def test_email_outcomes_carry_the_provider_status() -> None:
    result = await SandboxEmail().send(outgoing_email("bounced@example.com"))
    bounce = result.outcomes[-1]
    assert bounce.code == "550" and bounce.message is not None and "5.1.1" in bounce.message


async def test_every_recipient_of_a_message_gets_its_own_outcomes() -> None:
    recipients = ("ada@example.com", "bounced@example.com", "delayed+1@example.com")
    result = await SandboxEmail().send(outgoing_email(*recipients))
    by_recipient = {r: [o.type for o in result.outcomes if o.recipient == r] for r in recipients}
    assert by_recipient == {
        "ada@example.com": ["sent", "delivered"],
        "bounced@example.com": ["sent", "bounced"],
        "delayed+1@example.com": ["sent", "delivery_delayed", "delivered"],
    }
    assert [o.type for o in result.now()] == ["sent"] * 3
    assert [o.after for o in result.later()] == sorted(o.after for o in result.later())
    assert result.provider_message_id


@pytest.mark.parametrize(
    ("to", "expected", "code"),
    [
        ("+15555550100", ["submitted", "sent", "delivered"], None),
        ("+15555550001", ["submitted", "sent", "undelivered"], "30003"),
        ("+15555550002", ["submitted", "failed"], "30007"),
        ("+15555550003", ["submitted", "sent", "delivered"], None),
        ("+447700900123", ["submitted", "sent", "delivered"], None),
        # The ending counts, not a 0001 elsewhere.
        ("+15550001555", ["submitted", "sent", "delivered"], None),
    ],
)
async def test_sms_outcome_table(to: str, expected: list[str], code: str | None) -> None:
    result = await SandboxSms().send(outgoing_sms(to))
    assert result.provider == "sandbox" and result.retry is None
    assert [u.status for u in result.updates] == expected
    assert [u.status for u in result.now()] == ["submitted"]
    later = result.later()
    assert [u.status for u in later] == expected[1:]
    assert all(timedelta(0) < u.after < TWO_SECONDS for u in later)
    assert result.updates[-1].code == code
    assert (result.updates[-1].message is not None) == (code is not None)
    assert result.provider_message_id
    if to.endswith("0003"):
        (stop,) = result.inbound
        assert (stop.sender, stop.recipient, stop.body) == (to, "Acme", "STOP")
        assert later[-1].after < stop.after < TWO_SECONDS
    else:
        assert result.inbound == ()


@pytest.mark.parametrize(
    ("to", "statuses"),
    [
        ("+15555550100", ["submitted", "sent", "delivered"]),
        ("+15555550001", ["submitted", "sent", "undelivered"]),
        ("+15555550002", ["submitted", "failed", "failed"]),
        ("+15555550003", ["submitted", "sent", "delivered"]),
    ],
)
async def test_sms_fetch_tells_the_status_by_now(to: str, statuses: list[str]) -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    provider = SandboxSms(clock=lambda: now)
    result = await provider.send(outgoing_sms(to))
    assert result.provider_message_id is not None
    seen = []
    for elapsed in (0.1, 0.7, 1.2):
        now = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(seconds=elapsed)
        update = await provider.fetch(result.provider_message_id)
        assert update is not None and update.after == timedelta(0)
        seen.append(update.status)
    assert seen == statuses


async def test_sms_fetch_of_an_unknown_id_is_none() -> None:
    provider = SandboxSms()
    assert await provider.fetch("SM0123") is None
    assert await provider.fetch("sandbox-bogus-1-ab") is None


async def test_the_sandbox_verifies_and_approves_at_once() -> None:
    async with open_email_provider(Config()) as email, open_sms_provider(Config()) as sms:
        assert email.name == "sandbox" and email.verifies_domains_instantly
        assert sms.name == "sandbox" and sms.approves_sender_ids_instantly
        for kind in ("alphanumeric", "long_code", "short_code"):
            assert await sms.review_sender_id("Acme", kind) == "approved"  # type: ignore[arg-type]
