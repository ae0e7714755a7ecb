"""What a team is told when Twilio cannot be reached: the kind of failure,
never the address the operator configured."""

from __future__ import annotations

import socket
import uuid

import httpx
import pytest

from tidings.providers.sms import OutgoingSms
from tidings.providers.twilio import TwilioSms, TwilioUnavailable


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_an_unreachable_api_is_named_without_its_address() -> None:
    port = closed_port()
    async with httpx.AsyncClient() as client:
        twilio = TwilioSms(client, f"http://127.0.0.1:{port}", "AC123")
        result = await twilio.send(OutgoingSms(uuid.uuid4(), uuid.uuid4(), "+14155550100",
                                               "Acme", "hi"))
        assert result.retry is not None
        assert result.retry.message == "Twilio unreachable (ConnectError)"
        with pytest.raises(TwilioUnavailable) as raised:
            await twilio.fetch("SM123")
        assert str(port) not in str(raised.value) and "127.0.0.1" not in str(raised.value)
