"""verify() never uses an empty secret: anyone can sign with an empty key."""

from __future__ import annotations

import time

import pytest

from tidings.webhooks import WebhookVerificationError, signature_header, verify

BODY = b'{"id":"0b0e2ad6-5c1b-4bd6-9f07-2f0c1e8f2a11","event":"webhook.test"}'


@pytest.mark.parametrize(
    "secrets",
    [
        ["whsec_real", ""],
        ["", "whsec_real"],
        "whsec_real,".split(","),
        ["whsec_real", "   "],
        ["whsec_real", "\t\n"],
    ],
)
@pytest.mark.parametrize("forged_with", ["", " ", "   ", "\t\n"])
def test_a_signature_made_with_an_empty_secret_is_refused(
    secrets: list[str], forged_with: str
) -> None:
    now = int(time.time())
    forged = signature_header([forged_with], now, BODY)
    with pytest.raises(WebhookVerificationError, match="no signature matches"):
        verify(BODY, forged, secrets)
    # The real secret of the same list still verifies.
    assert verify(BODY, signature_header(["whsec_real"], now, BODY), secrets)


@pytest.mark.parametrize("secrets", [[""], ["", " "], ["\t"], "".split(",")])
def test_a_list_without_a_usable_secret_raises(secrets: list[str]) -> None:
    now = int(time.time())
    for header in (signature_header([""], now, BODY), signature_header(["x"], now, BODY)):
        with pytest.raises(WebhookVerificationError, match="no secret") as raised:
            verify(BODY, header, secrets)
        assert isinstance(raised.value, ValueError)
