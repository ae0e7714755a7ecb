"""Routes that take a body without a token (Twilio's callbacks, the MTA's
reports): what such a request can cost before it is known to be genuine."""

from __future__ import annotations

import trio

from tests.conftest import Credential, MakeToken, assert_error
from tests.http.test_hardening_load import PROBE_SECONDS, shedding_service, wait_for
from tidings.http.providers_twilio import MAX_FORM_BYTES
from tidings.http.ratelimit import NO_TOKEN
from tidings.providers.twilio import signature

TWILIO = {"twilio_auth_token": "tw-token", "public_url": "http://tidings.example"}
# Shaped as a signature, and wrong.
SHAPED = "A" * 27 + "="


async def _slow_form(host: str, port: int, path: str, started: trio.Event) -> None:
    """A Twilio-shaped POST whose body never arrives past its first byte."""
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nX-Twilio-Signature: {SHAPED}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nM"
            .encode()
        )
        started.set()
        await trio.sleep_forever()


async def test_slow_bodies_without_a_token_hold_at_most_half_the_places(
    database_url: str, acme: Credential, make_token: MakeToken
) -> None:
    """Requests without a token that read a body count as one team: slow
    bodies sent to Twilio's routes take half the places in flight, and every
    team keeps the rest."""
    async with shedding_service(
        database_url, acme, db_pool_size=2, max_db_waiters=4, max_in_flight=8, **TWILIO
    ) as (service, shedder, client):
        host, port = client.base_url.host, client.base_url.port
        assert port is not None
        async with trio.open_nursery() as nursery:
            for path in ("/providers/twilio/inbound", "/providers/twilio/status") * 2:
                started = trio.Event()
                nursery.start_soon(_slow_form, host, port, path, started)
                await started.wait()
            uploads = shedder.app._limiter.uploads  # type: ignore[attr-defined]
            await wait_for(lambda: uploads.count(NO_TOKEN) == 4)
            with trio.fail_after(PROBE_SECONDS):
                refused = await client.post(
                    "/providers/twilio/status", content=b"MessageSid=SM1",
                    headers={"X-Twilio-Signature": SHAPED,
                             "Content-Type": "application/x-www-form-urlencoded"},
                )
                listed = await client.get("/contacts")
                created = await client.post("/contacts", json={"email": "ok@example.com"})
            message = assert_error(refused, 429, "TOO_MANY_REQUESTS")
            assert "without a token are sending their bodies" in message
            assert (listed.status_code, created.status_code) == (200, 201), created.text
            nursery.cancel_scope.cancel()
        await wait_for(lambda: shedder.in_flight == 0 and uploads.count(NO_TOKEN) == 0)


async def test_twilio_routes_check_what_costs_nothing_first(
    database_url: str, acme: Credential
) -> None:
    """No signature of the right shape: 403 at once, the body never read (a
    client that announces one and sends nothing is answered). A form larger
    than Twilio ever sends: 413, however well signed."""
    async with shedding_service(database_url, acme, **TWILIO) as (service, _, client):
        host, port = client.base_url.host, client.base_url.port
        for given in ("", "abc", "A" * 28, SHAPED + "A"):
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                await stream.send_all(
                    f"POST /providers/twilio/inbound HTTP/1.1\r\nHost: {host}\r\n"
                    f"X-Twilio-Signature: {given}\r\n"
                    "Content-Type: application/x-www-form-urlencoded\r\n"
                    "Content-Length: 1000000\r\n\r\n".encode()
                )
                with trio.fail_after(PROBE_SECONDS):
                    head = await stream.receive_some(65536)
            assert head.startswith(b"HTTP/1.1 403"), (given, head[:80])
        url = "http://tidings.example/providers/twilio/inbound"
        params = [("From", "+14155550123"), ("Body", "x" * MAX_FORM_BYTES)]
        signed = {"X-Twilio-Signature": signature("tw-token", url, params),
                  "Content-Type": "application/x-www-form-urlencoded"}
        large = await client.post("/providers/twilio/inbound", headers=signed,
                                  content=f"From=%2B14155550123&Body={'x' * MAX_FORM_BYTES}")
        assert_error(large, 413, "PAYLOAD_TOO_LARGE")
        params = [("From", "+14155550123"), ("Body", "hello")]
        signed["X-Twilio-Signature"] = signature("tw-token", url, params)
        small = await client.post("/providers/twilio/inbound", headers=signed,
                                  content="From=%2B14155550123&Body=hello")
        assert small.status_code == 200, small.text


async def test_a_report_may_be_as_large_as_an_import_and_no_larger(
    database_url: str, acme: Credential
) -> None:
    """A DSN may return a whole message, several times larger on the wire
    than the JSON it was accepted as: a report may reach
    TIDINGS_IMPORT_MAX_BODY_BYTES, and above it is 413."""
    async with shedding_service(
        database_url, acme, reports_secret="mta-secret", max_body_bytes=16 * 1024,
        import_max_body_bytes=64 * 1024,
    ) as (service, _, client):
        headers = {"Authorization": "Bearer mta-secret", "Content-Type": "message/rfc822"}
        large = await client.post("/providers/smtp/reports", headers=headers,
                                  content=b"From: a@example.org\n\n" + b"x" * 70_000)
        assert "65536" in assert_error(large, 413, "PAYLOAD_TOO_LARGE")
        within = await client.post("/providers/smtp/reports", headers=headers,
                                   content=b"From: a@example.org\n\n" + b"x" * 60_000)
        assert_error(within, 422, "UNPROCESSABLE_ENTITY")  # read whole: no report
