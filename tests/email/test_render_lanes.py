"""Large emails are built in a lane of their own: deriving the text part of
a large html document takes seconds, and the emails behind it must not wait."""

from __future__ import annotations

from uuid import uuid4

import httpx
import pytest
import trio

from tests.email.conftest import smtp_config
from tests.email.helpers import SENDER, ok
from tests.email.smtp_sink import Sink
from tidings.config import Config
from tidings.providers.email import OutgoingEmail
from tidings.providers.smtp import LARGE_BYTES, Renderer


@pytest.fixture
def config(database_url: str, port: int) -> Config:
    return smtp_config(database_url, port)


async def test_a_small_email_is_not_built_behind_large_ones(
    client: httpx.AsyncClient, acme_domain: str, sink: Sink
) -> None:
    """Five emails of 160 KB of html (their text parts derived: about a
    second each) and then a one-line email, accepted together: the one-line
    email arrives first. (Sent one by one, the first large email could be
    built before the small one was even accepted.)"""
    html = "<p>x</p>" * 20_000
    assert len(html) > LARGE_BYTES
    body = {"from": SENDER, "subject": "Hi"}
    emails = [{**body, "to": f"large{n}@example.com", "html": html} for n in range(5)]
    emails.append({**body, "to": "small@example.com", "html": "<p>hi</p>"})
    assert len(ok(await client.post("/emails/batch", json=emails), 202)["data"]) == 6
    with trio.fail_after(60):
        while len(sink.messages) < len(emails):
            await trio.sleep(0.05)
    order = [message.recipients[0] for message in sink.messages]
    assert order[0] == "small@example.com", order


async def test_a_render_cut_short_does_not_wait_for_large_messages() -> None:
    """Cancelled (a shutdown), the senders waiting on large messages return at
    once: nothing holds them until every queued message is built."""
    renderer = Renderer(1, batch=1)
    email = OutgoingEmail(
        message_id=uuid4(), team_id=uuid4(), sender="news@acme.example", return_paths={},
        recipients=("ada@example.com",), to=("ada@example.com",), subject="Large",
        html="<p>x</p>" * 60_000,  # about 3 s to derive its text part
    )
    started = trio.current_time()
    with trio.move_on_after(0.5):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(renderer.render, email)
    assert trio.current_time() - started < 2.5

