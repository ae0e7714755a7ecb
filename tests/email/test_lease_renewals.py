"""Lease renewals never cost an email its deferred recipients.

The send worker renews the leases of the emails it holds while other
emails of the team are recorded. An email recorded while a renewal was
under way is not held any more when the renewal answers; taking it for an
email whose lease another process took would skip its next attempt, and
recording that skipped attempt used to write the email as done: its
deferred recipients were never tried again and never failed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import trio
import triopg

from tests.email.conftest import smtp_config
from tests.email.smtp_sink import running_sink
from tests.email.test_processes import setup_team
from tests.email.test_smtp_flow import OnceBusy
from tidings.service import open_service
from tidings.storage.emails_accept import NewEmail, accept_emails

COUNT = 300


@pytest.fixture
def sink() -> OnceBusy:
    return OnceBusy(*(f"busy{n}@example.com" for n in range(COUNT)))


@pytest.fixture
def port(sink: OnceBusy) -> Iterator[int]:
    with running_sink(sink) as port:
        yield port


def email(n: int) -> NewEmail:
    to = [f"ok{n}@example.com", f"busy{n}@example.com"]
    return NewEmail(
        from_address="Acme <hi@acme.example>", from_email="hi@acme.example", to=to,
        to_lookup=to, cc=[], bcc=[], reply_to=[], send_to=to, subject=f"#{n}", html=None,
        text="Hello", headers={}, tags=[], scheduled_at=None, domain="acme.example",
        provider="smtp",
    )


async def test_every_deferred_recipient_is_tried_again_whatever_the_renewals(
    database_url: str, port: int, sink: OnceBusy
) -> None:
    """Each email's second recipient is deferred once; with renewals every
    0.1 s, many records cross a renewal. Every recipient is sent to."""
    config = dataclasses.replace(smtp_config(database_url, port), email_lease_seconds=0.3)
    async with triopg.connect(database_url) as conn:
        team_id = await setup_team(conn)
        async with open_service(config):
            emails = [email(n) for n in range(COUNT)]
            for start in range(0, COUNT, 100):
                await accept_emails(conn, team_id, emails[start:start + 100])
            with trio.fail_after(60):
                while await conn.fetchval(
                    "SELECT count(*) FROM emails WHERE next_attempt_at IS NOT NULL"
                ):
                    await trio.sleep(0.1)
        rows = await conn.fetch(
            "SELECT e.subject, e.status, e.send_to, "
            "       ARRAY(SELECT DISTINCT lower(v.recipient) FROM email_events v"
            "             WHERE v.email_id = e.id AND v.type = 'sent') AS sent_to "
            "FROM emails e ORDER BY e.created_at"
        )
    assert len(rows) == COUNT
    unsent = [dict(row) for row in rows if len(row["sent_to"]) != 2]
    assert unsent == []
    assert all(row["status"] == "sent" and row["send_to"] == [] for row in rows)
    assert {m.recipients[0] for m in sink.messages} == {
        a for n in range(COUNT) for a in (f"ok{n}@example.com", f"busy{n}@example.com")
    }
